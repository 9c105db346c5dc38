# One writer of the slurm.conf that the tests' private Slurm clusters use (sourced by
# tests/launch/test_slurm.sh, one node on 127.0.0.1, and tests/hosts/test_hosts_slurm.sh, a node per
# emulated host):
#   slurm_conf_write DIR CLUSTER CTLD_HOST CTLD_ADDR [LINE...]
# writes DIR/slurm.conf: auth/none + cred/none (no munge), proctrack/linuxproc + task/none (no
# cgroups), root as SlurmUser, state, spool, pid and log files under DIR (spool-NODE, slurmd-NODE.pid,
# slurmd-NODE.log: one slurmd per node name), the builtin scheduler, no accounting; then each LINE as
# given (the NodeName=/PartitionName= lines, ports, AuthInfo, ...). The caller creates DIR/state and
# DIR/spool-NODE.
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
