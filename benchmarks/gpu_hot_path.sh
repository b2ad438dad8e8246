#!/bin/sh
# Every GPU measurement of the GPU-first hot path in one run of at most BUDGET seconds (default
# 570), for a lent GPU machine (its torch, no iproute2). Here first:  sh benchmarks/carry_iproute2.sh
# then on the device (`run` with carry [".netbin"], timeout 600):
#   sh benchmarks/gpu_hot_path.sh 2>&1 | tee $OUT/log.txt
# Each step has its own time limit and runs only if the budget still holds it; a failed step
# does not stop the ones after it. Writes under benchmarks/results/ (TAG names the GPU):
#   topk_select/TAG.json             the selectors alone, 25.6 M fp32, three densities
#   ddp_hooks/TAG_p4.json, _p8.json  PyTorch's hooks beside gradwire's, ResNet-50, 1 Gbit/s
#   ddp_hooks/TAG_int8_p4.json       int8 beside the fp16 hooks
#   bench/TAG_ring_nccl.json         gradwire's ring beside NCCL's all_reduce, 16 and 64 MiB
#   calibration/TAG.json             `gradwire calibrate --device cuda`, 2 hosts at 1 Gbit/s
#   ddp_hooks/TAG_p8_profile.json    fp16, Top-k and gTop-k at P = 8, one step each profiled
# and copies each to $OUT; the sync-free check under NCCL prints its verdict to the log.
# STEPS picks the numbered steps below (default: all), e.g. STEPS="5 8" for the ring and the
# profile alone. A dry run on a CPU machine: DEVICE=cpu TAG=dry MODEL=mlp-tiny SIZE=1000000 RESULTS=/tmp/dry \
#   OUT=/tmp/dry sh benchmarks/gpu_hot_path.sh
set -u
export PATH="$PWD/.netbin/bin:$PATH"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
device=${DEVICE:-cuda}
tag=${TAG:-h200}
model=${MODEL:-resnet50}
size=${SIZE:-25600000}
results=${RESULTS:-benchmarks/results}
out=${OUT:-/tmp}
budget=${BUDGET:-570}
steps=${STEPS:-1 2 3 4 5 6 7 8}
start=$(date +%s)
mkdir -p "$results/topk_select" "$results/ddp_hooks" "$results/bench" \
    "$results/calibration" "$out"

# step N LIMIT FILE CMD...: step N (skipped unless STEPS names it): run CMD under LIMIT seconds
# (less if the budget has less left; skip it if under half of LIMIT is left), then copy FILE (if
# any, and only if this step wrote it) to $OUT under its path's last two parts. A FILE there
# before (the committed result of an earlier run) is set aside during the step and put back if
# the step wrote none: a step that failed or ran out of time must not send back the old result
# as if it were this run's.
step() {
    n=$1; want=$2; file=$3; shift 3
    case " $steps " in *" $n "*) ;; *) echo "=== step $n not in STEPS"; return ;; esac
    left=$((budget - ($(date +%s) - start)))
    limit=$want
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt $((want / 2)) ] || [ "$limit" -lt 20 ]; then
        echo "=== SKIPPED (${left}s left): $*"; return
    fi
    echo "=== $(($(date +%s) - start))s: $* (limit ${limit}s)"
    [ -n "$file" ] && [ -f "$file" ] && mv "$file" "$file.before-step"
    timeout -k 10 "$limit" "$@"
    echo "=== exit $? after $(($(date +%s) - start))s"
    [ -n "$file" ] || return 0
    if [ -f "$file" ]; then
        rm -f "$file.before-step"
        cp "$file" "$out/$(basename "$(dirname "$file")")_$(basename "$file")"
    else
        echo "=== $file not written by this step: nothing copied"
        [ -f "$file.before-step" ] && mv "$file.before-step" "$file"
    fi
    return 0
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"
# 1. the selectors alone: ResNet-50's 25.6 M fp32, three densities
step 1 90 "$results/topk_select/$tag.json" python3 benchmarks/topk_select.py --device "$device" \
    --size "$size" --repeats 20 --out "$results/topk_select/$tag.json"
# 2. no host-device synchronisation in DDP's backward, counted by CUDA itself (1 to 3 ranks);
#    a Lightning checkpoint gathers the hook states from the host
step 2 120 "" python3 -m pytest -q -p no:cacheprovider tests/test_nccl.py tests/test_hooks.py \
    -k "syncfree or gathers_hook_states"
# 3, 4. PyTorch's hooks beside gradwire's: ResNet-50 at 224², batch 32, P = 4 and 8 ranks sharing
#    the GPU, each its own emulated host at 1 Gbit/s (bucket mode, the defaults)
step 3 200 "$results/ddp_hooks/${tag}_p4.json" python3 benchmarks/ddp_hooks.py --device "$device" \
    --model "$model" --hosts 4 --bandwidth 1gbit --rounds 2 --warmup 3 --iters 5 \
    --out "$results/ddp_hooks/${tag}_p4.json"
step 4 180 "$results/ddp_hooks/${tag}_p8.json" python3 benchmarks/ddp_hooks.py --device "$device" \
    --model "$model" --hosts 8 --bandwidth 1gbit --rounds 1 --warmup 3 --iters 5 \
    --out "$results/ddp_hooks/${tag}_p8.json"
# 5. gradwire's ring over NCCL point to point beside NCCL's all_reduce, 4 ranks, unshaped
step 5 60 "$results/bench/${tag}_ring_nccl.json" python3 -m gradwire bench \
    --device "$device" --hosts 4 --loopback --algo ring --sizes 16M,64M --iters 5 --interleave \
    --timeout 50 --json "$results/bench/${tag}_ring_nccl.json"
# 6. int8 (one byte an element, summed by the backend) beside the fp16 hooks, P = 4
step 6 70 "$results/ddp_hooks/${tag}_int8_p4.json" python3 benchmarks/ddp_hooks.py \
    --device "$device" --model "$model" --hosts 4 --bandwidth 1gbit --rounds 1 --warmup 3 \
    --iters 5 --hooks torch:fp16,gradwire:fp16,gradwire:int8 \
    --out "$results/ddp_hooks/${tag}_int8_p4.json"
# 7. the calibration a GPU user would run first: 2 hosts at 1 Gbit/s
step 7 120 "$results/calibration/$tag.json" python3 -m gradwire calibrate --device "$device" \
    --hosts 2 --bandwidth 1gbit --timeout 110 --out "$results/calibration/$tag.json"
# 8. where a step's time goes at P = 8: one more step per hook, profiled on rank 0
step 8 90 "$results/ddp_hooks/${tag}_p8_profile.json" python3 benchmarks/ddp_hooks.py \
    --device "$device" --model "$model" --hosts 8 --bandwidth 1gbit --rounds 1 --warmup 3 \
    --iters 5 --hooks torch:fp16,gradwire:topk-0.001,gradwire:gtopk-0.001 --profile 25 \
    --out "$results/ddp_hooks/${tag}_p8_profile.json"
echo "=== done after $(($(date +%s) - start))s"
