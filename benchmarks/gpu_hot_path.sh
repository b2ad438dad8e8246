#!/bin/sh
# Every GPU measurement of the GPU-first hot path in one run of about nine minutes, for a lent
# GPU machine (its torch, no iproute2). Here first:  sh benchmarks/carry_iproute2.sh
# then on the device (`run` with carry [".netbin"], timeout 600):
#   sh benchmarks/gpu_hot_path.sh
# Writes benchmarks/results/topk_select/<device>.json and benchmarks/results/ddp_hooks/
# <device>_{p4,p8,int8_p4}.json, copies them to $OUT (as topk_select_<device>.json and
# ddp_hooks_<device>_{p4,p8,int8_p4}.json), and leaves pytest's verdict on the sync-free
# check under NCCL in $OUT/syncfree_nccl.txt.
# A dry run on a CPU machine: DEVICE=cpu MODEL=mlp-tiny SIZE=1000000 RESULTS=/tmp/dry \
#   sh benchmarks/gpu_hot_path.sh
set -eu
export PATH="$PWD/.netbin/bin:$PATH"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
device=${DEVICE:-cuda}
model=${MODEL:-resnet50}
size=${SIZE:-25600000}
results=${RESULTS:-benchmarks/results}
out=${OUT:-/tmp}
mkdir -p "$results/topk_select" "$results/ddp_hooks"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
# 1. the selectors alone: ResNet-50's 25.6 M fp32, three densities
python3 benchmarks/topk_select.py --device "$device" --size "$size" --repeats 20 \
    --out "$results/topk_select/$device.json"
# 2. no host-device synchronisation in DDP's backward, counted by CUDA itself (2 ranks)
python3 -m pytest -q tests/test_nccl.py -k "syncfree and 2" 2>&1 | tail -5 \
    | tee "$out/syncfree_nccl.txt"
# 3. PyTorch's hooks beside gradwire's: ResNet-50 at 224², batch 32, P ranks sharing the GPU,
#    each its own emulated host at 1 Gbit/s (bucket mode, the defaults)
python3 benchmarks/ddp_hooks.py --device "$device" --model "$model" --hosts 4 \
    --bandwidth 1gbit --rounds 2 --warmup 3 --iters 5 --out "$results/ddp_hooks/${device}_p4.json"
python3 benchmarks/ddp_hooks.py --device "$device" --model "$model" --hosts 8 \
    --bandwidth 1gbit --rounds 1 --warmup 3 --iters 5 --out "$results/ddp_hooks/${device}_p8.json"
cp "$results/topk_select/$device.json" "$out/topk_select_$device.json"
for p in 4 8; do cp "$results/ddp_hooks/${device}_p$p.json" "$out/ddp_hooks_${device}_p$p.json"; done
# 4. int8 (one byte an element, summed by the backend) beside the fp16 hooks, P = 4; last and
#    on its own, so that a failure here loses none of the runs above
python3 benchmarks/ddp_hooks.py --device "$device" --model "$model" --hosts 4 \
    --bandwidth 1gbit --rounds 1 --warmup 3 --iters 5 \
    --hooks torch:fp16,gradwire:fp16,gradwire:int8 \
    --out "$results/ddp_hooks/${device}_int8_p4.json" \
    && cp "$results/ddp_hooks/${device}_int8_p4.json" "$out/ddp_hooks_${device}_int8_p4.json"
