# What the tests' private Slurm clusters share (sourced by
# tests/launch/test_slurm.sh, one node on 127.0.0.1, and tests/hosts/test_hosts_slurm.sh, a node per
# emulated host):
#   slurm_conf_write DIR CLUSTER CTLD_HOST CTLD_ADDR [LINE...]
# writes DIR/slurm.conf: auth/none + cred/none (no munge), proctrack/linuxproc + task/none (no
# cgroups), root as SlurmUser, state, spool, pid and log files under DIR (spool-NODE, slurmd-NODE.pid,
# slurmd-NODE.log: one slurmd per node name), the builtin scheduler, no accounting; then each LINE as
# given (the NodeName=/PartitionName= lines, ports, AuthInfo, ...). The caller creates DIR/state and
# DIR/spool-NODE.
#   job_state ID: the job's JobState (PENDING, RUNNING, COMPLETED, ...), empty when Slurm has no such job.
#   slurm_term_stopped ID PIDS: Slurm's TERM to job ID's batch script while its lattice ranks PIDS are
#     stopped (SIGSTOP, by the caller, once the job is where the TERM must find it): a rank that runs on
#     could finish the job in the seconds Slurm's path takes (scancel -> slurmctld -> slurmd -> the
#     script's trap -> mpirun -> ranks) on a loaded machine. The ranks are continued once the USR1 that
#     the script's trap sends through mpirun is pending in each (ShdPnd, mask 0x200), or after 90 s;
#     returns 1 (having said so) when it never was. The job's COMM_TIMEOUT must outlast the stop.
slurm_conf_write() {
    local dir=$1 cluster=$2 host=$3 addr=$4 line
    shift 4
    {
        cat <<CONF
ClusterName=$cluster
SlurmctldHost=$host($addr)
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
CONF
        for line in "$@"; do echo "$line"; done
    } > "$dir/slurm.conf"
}

job_state() { scontrol -o show job "$1" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

slurm_term_stopped() {
    local id=$1 ranks=$2 p waiting=1
    scancel --batch --signal=TERM "$id"
    for _ in $(seq 450); do
        waiting=0
        for p in $ranks; do  # SIGUSR1 = signal 10: bit 9 of the shared pending mask
            grep -q "^ShdPnd:.*[2367abef]..$" "/proc/$p/status" 2> /dev/null || waiting=1
        done
        [ $waiting -eq 0 ] && break
        sleep 0.2
    done
    kill -CONT $ranks 2> /dev/null
    [ $waiting -eq 0 ] || { echo "FAIL: job $id: the drain signal did not reach every rank (pids $ranks)"; return 1; }
}
