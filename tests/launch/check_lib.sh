# Sourced by the launch shell tests: a temporary folder removed at exit, check() counting results,
# finish() printing the count and returning the verdict, and the mpirun command line for one node.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
pass=0
check() {  # description, then a command that must succeed
    local what=$1
    shift
    if "$@"; then pass=$((pass + 1)); else echo "FAILED: $what"; fail=$((fail + 1)); fi
}
finish() {  # finish NAME: the count, and the script's exit status
    echo "$1: $pass passed, $fail failed"
    [ $fail -eq 0 ]
}
mpirun=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
