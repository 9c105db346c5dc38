#!/usr/bin/env bash
# `lattice doctor`: (1) under lattice-mpirun with 2 CPU ranks: both ranks reported, layout ok,
# each rank on its own cores, exit 0; (2) under plain mpirun, unbound, with a layout that does not
# fit the world: PROBLEM line naming the sizes, shared-cores warning, exit 1; (3) on a fake sysfs with two NVIDIA GPUs, one behind a bridge
# whose ACS redirects P2P and in an IOMMU DMA domain, the other behind a bridge with ACS source
# validation only (a second capability in the chain) and an identity domain: warnings for the first
# GPU only, NUMA nodes and NCCL_P2P_DISABLE reported. (2b) the CPU kernels' line: level (LATTICE_ISA), AMX, who runs
# the W8A8 GEMMs at m >= 16 (LATTICE_INT8_GEMM) and the W4A8 ones.
set -uo pipefail
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DOCTOR=${LATTICE_BIN:?set LATTICE_BIN to the lattice executable}
W="$src/launch/lattice-mpirun"
R=(); [ "$(id -u)" -eq 0 ] && R=(--allow-run-as-root)
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
check() {  # check "what" file pattern [present|absent]
    if [ "${4:-present}" = present ]; then grep -qF -- "$3" "$2" && return; else ! grep -qF -- "$3" "$2" && return; fi
    echo "FAIL: $1: expected '$3' ${4:-present} in:"; sed 's/^/  | /' "$2"; fails=$((fails + 1))
}
host=$(hostname)

# (1) two CPU ranks through the wrapper; the wrapper appends --tp 2 --pp 1.
env -u NCCL_P2P_DISABLE "$W" --tp 2 --cpu --oversubscribe -- "$DOCTOR" doctor > "$tmp/ok.out" 2>&1; rc=$?
[ $rc -eq 0 ] || { echo "FAIL: doctor under lattice-mpirun exited $rc"; cat "$tmp/ok.out"; fails=$((fails + 1)); }
check "2 ranks" "$tmp/ok.out" "world: 2 rank(s) on 1 host(s), asked tp 2 x pp 1"
check "rank 0" "$tmp/ok.out" "rank 0 on $host: local rank 0/2"
check "rank 1" "$tmp/ok.out" "rank 1 on $host: local rank 1/2"
check "MPI version" "$tmp/ok.out" "MPI: Open MPI v"
check "verdict" "$tmp/ok.out" "result: ok"
check "no problem" "$tmp/ok.out" "PROBLEM" absent

# The wrapper gives each CPU rank its own cores when there are enough.
if [ "$(nproc)" -ge 2 ]; then check "own cores" "$tmp/ok.out" "share CPUs" absent; fi

# (2) world 2 but --tp 2 --pp 2 asked: blocked, exit 1. Unbound CPU ranks: shared cores warned.
mpirun "${R[@]}" --oversubscribe --bind-to none -np 2 "$DOCTOR" doctor --tp 2 --pp 2 > "$tmp/bad.out" 2>&1; rc=$?
[ $rc -ne 0 ] || { echo "FAIL: doctor with world != tp*pp exited 0"; fails=$((fails + 1)); }
check "world mismatch" "$tmp/bad.out" "PROBLEM: invalid layout: world size 2 != tp 2 x pp 2 (start 4 ranks"
check "fix" "$tmp/bad.out" "fix: launch with lattice-mpirun --tp 2 --pp 2 (it sets -np 4)"
check "verdict" "$tmp/bad.out" "result: 1 problem(s) block this launch"
check "shared cores" "$tmp/bad.out" "warning: CPU ranks 0 and 1 on $host share CPUs"

# (2b) the CPU kernels' line: the level every family runs (LATTICE_ISA pins it), AMX used or why not, who runs the
# W8A8 GEMMs at m >= 16 (LATTICE_INT8_GEMM).
check "CPU kernels" "$tmp/ok.out" "W8A8 GEMMs at m >= 16 by"
grep -qE "AMX (used|not used: |available, not used: the level is pinned to )" "$tmp/ok.out" ||
    { echo "FAIL: no AMX verdict in:"; sed 's/^/  | /' "$tmp/ok.out"; fails=$((fails + 1)); }
if grep -q avx2 /proc/cpuinfo; then
    LATTICE_ISA=avx2 "$DOCTOR" doctor > "$tmp/avx2.out" 2>&1
    check "pinned level" "$tmp/avx2.out" "kernels at avx2 (best here "
    check "avx2 GEMM" "$tmp/avx2.out" "W8A8 GEMMs at m >= 16 by lattice's avx2 kernel, W4A8 by lattice's avx2 kernel"
    check "no bf16 pairs at avx2" "$tmp/avx2.out" "vdpbf16ps pairs" absent
fi
LATTICE_INT8_GEMM=own "$DOCTOR" doctor > "$tmp/own.out" 2>&1
check "own provider" "$tmp/own.out" "W8A8 GEMMs at m >= 16 by lattice's"

# (3) fake sysfs.
S="$tmp/sys"
mkdir -p "$S/bus/pci/devices" "$S/kernel/iommu_groups/5" "$S/kernel/iommu_groups/6" \
         "$S/devices/system/node/node0" "$S/devices/system/node/node1" "$S/devices/system/cpu"
echo DMA > "$S/kernel/iommu_groups/5/type"; echo identity > "$S/kernel/iommu_groups/6/type"
echo 0-1 > "$S/devices/system/cpu/online"
echo 0 > "$S/devices/system/node/node0/cpulist"; echo 1 > "$S/devices/system/node/node1/cpulist"
# config space: 4096 bytes, extended capabilities from 0x100; header = id | version<<16 | next<<20.
python3 - "$S" <<'PY'
import os, struct, sys
S = sys.argv[1]
def config(caps):
    b = bytearray(4096)
    for off, cap_id, nxt, ctl in caps:
        struct.pack_into("<I", b, off, cap_id | 1 << 16 | nxt << 20)
        struct.pack_into("<H", b, off + 6, ctl)
    return bytes(b)
def dev(path, vendor, cls, numa=None, group=None, cfg=None):
    d = os.path.join(S, "devices", path)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "vendor"), "w").write(vendor + "\n")
    open(os.path.join(d, "class"), "w").write(cls + "\n")
    if numa is not None: open(os.path.join(d, "numa_node"), "w").write(f"{numa}\n")
    if group is not None: os.symlink(os.path.relpath(os.path.join(S, "kernel/iommu_groups", group), d), os.path.join(d, "iommu_group"))
    open(os.path.join(d, "config"), "wb").write(cfg or bytes(64))
    link = os.path.join(S, "bus/pci/devices", os.path.basename(path))
    os.symlink(os.path.relpath(d, os.path.dirname(link)), link)
# bridge 1: ACS with SV|RR|CR|UF (0x1d); bridge 2: AER at 0x100 -> ACS at 0x140 with SV only.
dev("pci0000:00/0000:00:01.0", "0x8086", "0x060400", cfg=config([(0x100, 0x000d, 0, 0x001d)]))
dev("pci0000:00/0000:00:02.0", "0x8086", "0x060400", cfg=config([(0x100, 0x0001, 0x140, 0xffff), (0x140, 0x000d, 0, 0x0001)]))
dev("pci0000:00/0000:00:01.0/0000:01:00.0", "0x10de", "0x030200", numa=0, group="5")
dev("pci0000:00/0000:00:02.0/0000:02:00.0", "0x10de", "0x030000", numa=1, group="6")
dev("pci0000:00/0000:00:03.0", "0x1af4", "0x020000")  # a NIC: not a GPU
PY
NCCL_P2P_DISABLE=1 "$DOCTOR" doctor --sysfs "$S" > "$tmp/fake.out" 2>&1; rc=$?
[ $rc -eq 0 ] || { echo "FAIL: doctor on fake sysfs exited $rc (warnings must not block)"; fails=$((fails + 1)); }
check "numa" "$tmp/fake.out" "host $host: CPUs 0-1, NUMA nodes 2, IOMMU groups 2"
check "gpu 1" "$tmp/fake.out" 'PCI GPU 0000:01:00.0: NUMA 0, IOMMU DMA, ACS-redirecting bridges above: ["0000:00:01.0 (ACSCtl 0x001d)"]'
check "gpu 2" "$tmp/fake.out" "PCI GPU 0000:02:00.0: NUMA 1, IOMMU identity, ACS-redirecting bridges above: none"
check "not a gpu" "$tmp/fake.out" "0000:00:03.0" absent
check "acs warning" "$tmp/fake.out" "warning: PCIe ACS redirects P2P at bridge 0000:00:01.0 (ACSCtl 0x001d) above GPU 0000:01:00.0 on $host"
check "acs fix" "$tmp/fake.out" "setpci -s <bridge> ECAP_ACS+0x6.w=0000"
check "acs only gpu 1" "$tmp/fake.out" "above GPU 0000:02:00.0" absent
check "iommu warning" "$tmp/fake.out" "warning: IOMMU translates DMA for GPU 0000:01:00.0 on $host (domain DMA)"
check "iommu only gpu 1" "$tmp/fake.out" "DMA for GPU 0000:02:00.0" absent
check "p2p disable" "$tmp/fake.out" "warning: NCCL_P2P_DISABLE is set"
if grep -q "GPUs visible 0," "$tmp/fake.out"; then
    check "gpus unusable" "$tmp/fake.out" "warning: 2 NVIDIA GPUs on the PCI bus of $host but none usable here"
fi
# And the real /sys of this machine: never crashes, exit 0 without a layout to check.
env -u NCCL_P2P_DISABLE "$DOCTOR" doctor > "$tmp/real.out" 2>&1 || { echo "FAIL: doctor on /sys"; cat "$tmp/real.out"; fails=$((fails + 1)); }
check "real sysfs" "$tmp/real.out" "result: ok"
[ $fails -eq 0 ] && echo "lattice doctor: all checks passed"
[ $fails -eq 0 ]
