# Emulated hosts on one Linux machine, for tests that run lattice across several "hosts" over TCP.
# Sourced by the tests in this folder (bash). Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), util-linux
# unshare/nsenter and iproute2.
#
# Layout:
#  - hosts_enter "$0" "$@" (first line of a test) re-runs the test inside its own PID, mount and network
#    namespaces: `unshare --pid --fork --kill-child --mount --propagation private --mount-proc --net`.
#    Everything the test starts lives in them, so when the test ends, fails, or is killed (ctest's
#    timeout, SIGKILL), the kernel kills every process it started and drops every namespace, interface
#    and bind mount with them: nothing to clean up by hand, and two runs side by side never share a
#    name (their namespaces are distinct). Where the machine refuses namespaces it exits 77 (SKIP) with
#    the reason.
#  - hosts_test_init "$0" "$@" (a test's first line after sourcing this file): hosts_enter, then what every
#    test uses: src (the checkout), shared (../shared), bin (the lattice executable, $LATTICE_BIN), W
#    (launch/lattice-mpirun), smol (the default SmolLM2 model; need_smol SKIPs without it), fails and
#    fail MESSAGE (prints FAIL: and counts).
#  - hosts_make a b [c d]: each host is a holder process (`sleep`) in its own network namespace and UTS
#    namespace with its own hostname, loopback up, and eth0 (a veth pair) plugged into a bridge `sw`
#    in the test's namespace (the "switch"), address 10.77.0.<i+1>/24. /etc/hosts is bind-mounted
#    (in the test's mount namespace only) with the hosts' names and addresses, so MPI resolves them.
#  - host_run H cmd...: runs cmd inside host H (nsenter into its network and UTS namespaces).
#  - The OpenMPI rsh agent is tests/hosts/netns-rsh (OMPI_MCA_plm_rsh_agent, set by hosts_make): it
#    enters the named host instead of ssh. The map host -> holder pid is $HOSTS_DIR/map.
#  - host_pids H: pids of every process on host H (same network namespace as its holder), holder aside.
#  - link_down H: takes H's switch port down (packets dropped, no reset: a cut cable).
#  - elapsed T0: seconds since T0 (a `date +%s.%N`), one decimal.
# Invariants: hosts share the file system (like an NFS home) and the CPUs; nothing of theirs reaches the
# machine's real network.

hosts_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

hosts_skip() {
    echo "SKIP: $*"
    exit 77
}

hosts_enter() {
    [ "${HOSTS_INSIDE:-}" = 1 ] && return 0
    [ "$(id -u)" -eq 0 ] || hosts_skip "emulated hosts need root (network namespaces)"
    for t in unshare nsenter ip; do command -v $t > /dev/null || hosts_skip "$t not found"; done
    command -v mpirun > /dev/null || hosts_skip "mpirun not found"
    local why
    why=$(unshare --pid --fork --kill-child --mount --propagation private --mount-proc --net -- \
          sh -c 'ip link add sw type bridge && unshare --net --uts true' 2>&1) ||
        hosts_skip "this machine refuses namespaces or a bridge: ${why:0:200}"
    HOSTS_INSIDE=1 exec unshare --pid --fork --kill-child --mount --propagation private --mount-proc --net \
        -- bash "$@"
}

hosts_test_init() {
    hosts_enter "$@"
    src=${LATTICE_SOURCE_DIR:-$(cd "$hosts_here/../.." && pwd)}
    shared=${LATTICE_SHARED_DIR:-$src/../shared}
    bin=${LATTICE_BIN:?set LATTICE_BIN to the lattice executable}
    W="$src/launch/lattice-mpirun"
    smol=${LATTICE_KILL_TEST_MODEL:-$src/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    fails=0
}

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

need_smol() { [ -e "$smol" ] || hosts_skip "$smol missing (scripts/setup.sh fetches it)"; }

hosts_make() {
    HOSTS_DIR=$(mktemp -d /tmp/lattice-hosts.XXXXXX)
    export HOSTS_DIR
    trap hosts_cleanup EXIT
    # Its contents live in a tmpfs of the test's mount namespace: gone with the test even on SIGKILL
    # (then only the empty folder stays).
    mount -t tmpfs -o size=64m tmpfs "$HOSTS_DIR" || return 1
    ip link set lo up
    ip link add sw type bridge && ip link set sw up || return 1
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
    } > "$HOSTS_DIR/hosts"
    : > "$HOSTS_DIR/map"
    local i=0 h pid
    for h in "$@"; do
        i=$((i + 1))
        unshare --net --uts sleep 1000000 &
        pid=$!
        # The holder is in its namespaces once its ns link differs from ours (a bounded poll).
        local n=0
        while [ "$(readlink /proc/$pid/ns/net 2>/dev/null)" = "$(readlink /proc/self/ns/net)" ] ||
              [ "$(readlink /proc/$pid/ns/uts 2>/dev/null)" = "$(readlink /proc/self/ns/uts)" ]; do
            n=$((n + 1)); [ $n -lt 500 ] || { echo "host $h: namespaces never appeared"; return 1; }
            sleep 0.01
        done
        nsenter -t "$pid" --net --uts hostname "$h"
        ip link add "p-$h" type veth peer name eth0 netns "$pid" || return 1
        ip link set "p-$h" master sw up
        nsenter -t "$pid" --net ip link set lo up
        nsenter -t "$pid" --net ip addr add "10.77.0.$i/24" dev eth0
        nsenter -t "$pid" --net ip link set eth0 up
        echo "10.77.0.$i $h" >> "$HOSTS_DIR/hosts"
        echo "$h $pid" >> "$HOSTS_DIR/map"
    done
    mount --bind "$HOSTS_DIR/hosts" /etc/hosts || return 1
    export OMPI_MCA_plm_rsh_agent="$hosts_here/netns-rsh"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Every host has eth0 and lo only; MPI's TCP paths use eth0 (the shared-memory path inside a host).
    export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
    # Each host's eth0 reports UP once both ends are up and plugged in (a bounded poll).
    for h in "$@"; do
        n=0
        until host_run "$h" ip -o link show eth0 | grep -q "state UP"; do
            n=$((n + 1)); [ $n -lt 500 ] || { echo "host $h: eth0 never came up"; return 1; }
            sleep 0.01
        done
    done
}

# The EXIT trap of hosts_make: unmount $HOSTS_DIR (lazily: /etc/hosts is bound to a file in it), then
# remove the folder it covered.
hosts_cleanup() {
    umount -l "$HOSTS_DIR" 2> /dev/null
    rm -rf "$HOSTS_DIR"
}

host_pid() { awk -v h="$1" '$1 == h { print $2 }' "$HOSTS_DIR/map"; }

host_run() {
    local pid
    pid=$(host_pid "$1"); shift
    nsenter -t "$pid" --net --uts -- "$@"
}

host_pids() {
    local holder ns p
    holder=$(host_pid "$1")
    ns=$(readlink "/proc/$holder/ns/net")
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = "$holder" ] && continue
        [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "$p"
    done
}

link_down() { ip link set "p-$1" down; }

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
