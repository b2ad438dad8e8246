#!/bin/sh
# Pack this machine's `ip` and `tc` (iproute2) with their libraries into .netbin/, for a machine
# whose kernel builds namespaces and tbf but whose image has no iproute2 (the lent GPU machine
# of 2026-11-25: 16 cores, so its emulated cluster runs 4-8 ranks without CPU contention).
#
#   sh benchmarks/carry_iproute2.sh          # here; .netbin/ is ignored by git
#   # there (device `run` with carry [".netbin"]):
#   export PATH=$PWD/.netbin/bin:$PATH; python3 benchmarks/train_demo.py ...
#
# The wrappers start the binaries through the dynamic loader with --library-path, not
# LD_LIBRARY_PATH: `ip netns exec NS CMD` would hand that variable to CMD (the ranks), and this
# machine's libz or libbsd could then shadow the other machine's own.
set -eu
out=.netbin
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for tool in ip tc; do
    path=$(command -v "$tool")
    cp "$path" "$out/$tool.real"
    ldd "$path" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so.*|libm.so.*) ;;  # the other machine's own (glibc there is newer)
            *) cp -L "$lib" "$out/lib/" ;;
        esac
    done
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$d/lib" "$d/%s.real" "$@"\n' "$tool" > "$out/bin/$tool"
    chmod +x "$out/bin/$tool"
done
grep -qx '/.netbin/' "$(git rev-parse --git-path info/exclude)" 2>/dev/null || {
    mkdir -p "$(dirname "$(git rev-parse --git-path info/exclude)")"
    echo '/.netbin/' >> "$(git rev-parse --git-path info/exclude)"
}
"$out/bin/ip" -V
