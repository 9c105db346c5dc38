#!/usr/bin/env bash
# launch/lattice-mpirun: the exact mpirun command resolved for given layouts (--dry-run), and the
# impossible layouts it must refuse with a clear message before starting anything.
# Runs the wrapper in a clean environment (env -i) so the caller's NCCL_*/LATTICE_* variables do
# not leak into the expected command; GPU layouts use --gpu-numa so nothing is detected here.
set -uo pipefail
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
W="$src/launch/lattice-mpirun"
R=""; [ "$(id -u)" -eq 0 ] && R=" --allow-run-as-root"
fails=0; n=0

run() { env -i PATH="$PATH" HOME="${HOME:-/tmp}" LATTICE_BIN="${LATTICE_BIN:-}" "$@"; }

expect_cmd() {  # expect_cmd "expected command line" wrapper-args...
    local want=$1; shift; n=$((n + 1))
    local got rc
    got=$(run "$W" --dry-run "$@" 2>/tmp/launch-test-err.$$); rc=$?
    if [ $rc -ne 0 ] || [ "$got" != "$want" ]; then
        echo "FAIL: lattice-mpirun $*"; echo "  want: $want"; echo "  got:  $got (rc $rc)"; sed 's/^/  stderr: /' /tmp/launch-test-err.$$
        fails=$((fails + 1))
    fi
}

expect_refusal() {  # expect_refusal "message part" wrapper-args...
    local want=$1; shift; n=$((n + 1))
    local out err rc
    out=$(run "$W" --dry-run "$@" 2>/tmp/launch-test-err.$$); rc=$?
    err=$(cat /tmp/launch-test-err.$$)
    if [ $rc -ne 2 ] || [ -n "$out" ] || [[ "$err" != *"lattice-mpirun: error: "*"$want"* ]]; then
        echo "FAIL: lattice-mpirun $* should be refused with '$want'"; echo "  rc $rc, stdout: $out"; echo "  stderr: $err"
        fails=$((fails + 1))
    fi
}

NCCL1="-x CUDA_DEVICE_ORDER=PCI_BUS_ID -x NCCL_P2P_LEVEL=PXB -x NCCL_IB_DISABLE=1 -x NCCL_DEBUG=WARN"
NCCLN="-x CUDA_DEVICE_ORDER=PCI_BUS_ID -x NCCL_P2P_LEVEL=PXB -x NCCL_DEBUG=WARN"

# CPU ranks: -np = tp*pp, --tp/--pp appended to a lattice subcommand, cores split between ranks.
expect_cmd "mpirun -np 2$R --map-by ppr:2:node:PE=4 --bind-to core lattice generate --model m --tp 2 --pp 1" \
    --tp 2 --cpu --cores-per-node 8 -- lattice generate --model m
expect_cmd "mpirun -np 6$R --map-by ppr:6:node:PE=2 --bind-to core lattice generate --model m --tp 3 --pp 2" \
    --tp 3 --pp 2 --cpu --cores-per-node 13 -- lattice generate --model m
# More ranks than cores: --cpu lets them share (mpirun --oversubscribe, no binding), asked for or not.
expect_cmd "mpirun -np 4$R --map-by ppr:4:node --bind-to none --oversubscribe x" --tp 2 --pp 2 --cpu --cores-per-node 2 -- x
# --quiet: mpirun -q (no banners).
expect_cmd "mpirun -np 2$R -q --map-by ppr:2:node:PE=1 --bind-to core x" --quiet --tp 2 --cpu --cores-per-node 2 -- x
expect_cmd "mpirun -np 4$R --map-by ppr:4:node --bind-to none --oversubscribe ./build/launch/lattice doctor --tp 2 --pp 2" \
    --tp 2 --pp 2 --cpu --cores-per-node 2 --oversubscribe -- ./build/launch/lattice doctor
# Values already in the lattice command are kept when they agree; non-lattice programs are untouched.
expect_cmd "mpirun -np 2$R --map-by ppr:2:node:PE=1 --bind-to core lattice generate --tp=2 --pp 1" \
    --tp 2 --cpu --cores-per-node 2 -- lattice generate --tp=2 --pp 1
expect_cmd "mpirun -np 2$R --map-by ppr:2:node:PE=1 --bind-to core hostname" --tp 2 --cpu --cores-per-node 2 -- hostname
# Arguments with spaces survive quoting.
expect_cmd "mpirun -np 1$R --map-by ppr:1:node:PE=2 --bind-to core echo 'a b' --tp" --tp 1 --cpu --cores-per-node 2 -- echo "a b" --tp

# GPU node, 8 GPUs, 4 per NUMA node: bound to the GPU's NUMA node, PCIe NCCL defaults exported.
expect_cmd "mpirun -np 8$R --map-by ppr:4:numa --bind-to numa $NCCL1 lattice generate --model m --tp 8 --pp 1" \
    --tp 8 --gpu-numa 0,0,0,0,1,1,1,1 -- lattice generate --model m
expect_cmd "mpirun -np 4$R --map-by ppr:4:numa --bind-to numa $NCCL1 lattice generate --model m --tp 2 --pp 2" \
    --tp 2 --pp 2 --gpu-numa 0,0,0,0,1,1,1,1 -- lattice generate --model m
expect_cmd "mpirun -np 2$R --map-by ppr:2:numa --bind-to numa $NCCL1 lattice generate --model m --tp 2 --pp 1" \
    --tp 2 --gpu-numa 0,0,1,1 -- lattice generate --model m
# GPUs interleaved over NUMA nodes: not bound rather than bound to the wrong socket.
expect_cmd "mpirun -np 4$R --map-by ppr:4:node --bind-to none $NCCL1 lattice generate --tp 4 --pp 1" \
    --tp 4 --gpu-numa 0,1,0,1 -- lattice generate
# Two nodes: TP inside a node, PP across; no NCCL_IB_DISABLE; slots set to ranks per node; TCP keepalive
# on OpenMPI's daemon links from the command's --comm-timeout T (T/4 idle, 5 probes T/10 apart; 60 s
# when absent), the user's OMPI_MCA_ value winning.
KA="--mca oob_tcp_keepalive_time 15 --mca oob_tcp_keepalive_intvl 6 --mca oob_tcp_keepalive_probes 5"
expect_cmd "mpirun -np 16$R --host n1:8,n2:8 --map-by ppr:4:numa --bind-to numa $KA $NCCLN lattice generate --tp 8 --pp 2" \
    --tp 8 --pp 2 --hosts n1,n2 --gpu-numa 0,0,0,0,1,1,1,1 -- lattice generate
expect_cmd "mpirun -np 8$R --host n1:4,n2:4 --map-by ppr:4:node --bind-to none $KA $NCCLN lattice generate --tp 4 --pp 2" \
    --tp 4 --pp 2 --hosts n1:8,n2:8 --gpu-numa 0,0,0,0,1,1,1,1 -- lattice generate
expect_cmd "mpirun -np 4$R --host a:2,b:2 --map-by ppr:2:node --bind-to none --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 5 lattice generate --comm-timeout 8 --tp 2 --pp 2" \
    --tp 2 --pp 2 --hosts a,b --cpu --bind none -- lattice generate --comm-timeout 8
n=$((n + 1))
got=$(env -i PATH="$PATH" LATTICE_BIN="${LATTICE_BIN:-}" OMPI_MCA_oob_tcp_keepalive_time=300 "$W" --dry-run --tp 2 --pp 2 \
      --hosts a,b --cpu --bind none -- lattice generate 2>/dev/null)
want="mpirun -np 4$R --host a:2,b:2 --map-by ppr:2:node --bind-to none --mca oob_tcp_keepalive_intvl 6 --mca oob_tcp_keepalive_probes 5 lattice generate --tp 2 --pp 2"
[ "$got" = "$want" ] || { echo "FAIL: keepalive override"; echo "  want: $want"; echo "  got:  $got"; fails=$((fails + 1)); }
# The user's NCCL values win over the defaults, and other NCCL_*/LATTICE_* variables are forwarded.
n=$((n + 1))
got=$(env -i PATH="$PATH" LATTICE_BIN="${LATTICE_BIN:-}" NCCL_P2P_LEVEL=SYS NCCL_SOCKET_IFNAME=eth0 LATTICE_LOG=debug "$W" --dry-run --tp 2 \
      --gpu-numa 0,0 -- lattice generate 2>/dev/null)
want="mpirun -np 2$R --map-by ppr:2:numa --bind-to numa -x CUDA_DEVICE_ORDER=PCI_BUS_ID -x NCCL_P2P_LEVEL=SYS -x NCCL_IB_DISABLE=1 -x NCCL_DEBUG=WARN -x LATTICE_LOG=debug -x NCCL_SOCKET_IFNAME=eth0 lattice generate --tp 2 --pp 1"
[ "$got" = "$want" ] || { echo "FAIL: env override"; echo "  want: $want"; echo "  got:  $got"; fails=$((fails + 1)); }
expect_cmd "mpirun -np 2$R --map-by ppr:2:numa --bind-to numa -x CUDA_DEVICE_ORDER=PCI_BUS_ID lattice generate --tp 2 --pp 1" \
    --tp 2 --gpu-numa 0,0 --no-nccl-defaults -- lattice generate
# Hostfile with slots.
hf=$(mktemp); printf '# two nodes\nn1 slots=4\nn2 slots=4 max_slots=4\n' > "$hf"
expect_cmd "mpirun -np 8$R --hostfile $hf --map-by ppr:4:node --bind-to none $KA $NCCLN lattice generate --tp 4 --pp 2" \
    --tp 4 --pp 2 --hostfile "$hf" --gpus-per-node 4 -- lattice generate

# Refusals (exit 2, nothing on stdout, one line naming the problem).
expect_refusal "tp 3 is not a power of two" --tp 3 --gpu-numa 0,0,0,0 -- lattice generate
expect_refusal "tp 8 does not divide the 4 GPUs per node" --tp 8 --gpu-numa 0,0,1,1 -- lattice generate
expect_refusal "need 8 GPUs per node but there are 4" --tp 4 --pp 2 --gpu-numa 0,0,1,1 -- lattice generate
expect_refusal "6 ranks per node do not hold whole TP groups of 4" --tp 4 --pp 3 --hosts a,b --cpu -- lattice generate
expect_refusal "cannot be spread evenly over 3 nodes" --tp 2 --pp 2 --hosts a,b,c --cpu -- lattice generate
expect_refusal "3 nodes but only tp*pp = 2 ranks" --tp 2 --hosts a,b,c --cpu -- lattice generate
expect_refusal "--abort-grace -1 is out of range" --tp 2 --hosts a,b --cpu --abort-grace -1 -- lattice generate
expect_refusal "host 'n2' has 2 slots but the layout needs 4" --tp 4 --pp 2 --hosts n1:4,n2:2 --gpus-per-node 8 -- lattice generate
expect_refusal "the lattice command says --tp 4 but the wrapper was given --tp 2" --tp 2 --cpu -- lattice generate --tp 4
expect_refusal "the lattice command says --pp 1 but the wrapper was given --pp 2" --tp 2 --pp 2 --cpu --cores-per-node 8 -- lattice generate --pp=1
expect_refusal "--oversubscribe is for CPU ranks" --tp 2 --oversubscribe --gpu-numa 0,0 -- lattice generate
expect_refusal "--gpu-numa lists 2 GPUs but there are 4" --tp 2 --gpus-per-node 4 --gpu-numa 0,0 -- lattice generate
expect_refusal "no command" --tp 2 --cpu
expect_refusal "give --hosts or --hostfile, not both" --tp 2 --cpu --hosts a --hostfile "$hf" -- x
expect_refusal "cannot read hostfile" --tp 2 --cpu --hostfile /nonexistent/hosts -- x
expect_refusal "bad host name" --tp 2 --cpu --hosts 'a;rm' -- x
expect_refusal "argument --tp: 0 is out of range" --tp 0 --cpu -- x
expect_refusal "argument --pp: 'x' is not an integer" --tp 1 --pp x --cpu -- x
# On a node without GPUs a GPU launch is refused unless told how many GPUs the nodes have.
if ! command -v nvidia-smi >/dev/null && [ ! -d /proc/driver/nvidia/gpus ]; then
    expect_refusal "no GPUs found" --tp 2 -- lattice generate
fi
rm -f "$hf" /tmp/launch-test-err.$$

# Without --dry-run the command really runs (and the resolved line goes to stderr).
n=$((n + 1))
out=$(run "$W" --tp 2 --cpu --oversubscribe -- echo hello 2>/tmp/launch-test-err.$$); rc=$?
if [ $rc -ne 0 ] || [ "$(echo "$out" | sort | uniq -c | awk '{print $1, $2}')" != "2 hello" ] ||
   ! grep -q "^lattice-mpirun: exec: mpirun -np 2" /tmp/launch-test-err.$$; then
    echo "FAIL: real run of 2 ranks: rc $rc, out: $out"; cat /tmp/launch-test-err.$$; fails=$((fails + 1))
fi
rm -f /tmp/launch-test-err.$$
echo "lattice-mpirun: $((n - fails))/$n checks passed"
[ $fails -eq 0 ]
