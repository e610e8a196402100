#!/usr/bin/env bash
# A single-node Slurm for tests, as root, without systemd or cgroups:
#
#   tests/slurm/slurm_cluster.sh start DIR   # install if missing, write DIR/slurm.conf, start
#   tests/slurm/slurm_cluster.sh stop DIR    # stop the daemons started by `start`, by their pids
#
# `start` prints `SLURM_CONF=DIR/slurm.conf` on its last line: export it for sbatch/squeue.
# munged is started only when none answers, and then stopped by `stop`; slurmctld and slurmd
# always run from DIR (state, spool, logs, pid files) and are stopped by `stop`.
# Facts this relies on (Debian 12, Slurm 22.05): munged refuses to run as root over munge-owned
# directories, so it runs as `munge`; proctrack/linuxproc + task/affinity need no cgroups (the
# affinity plugin binds each task to its CPUs with sched_setaffinity, so a task's `nproc` is
# what Slurm gave it); the node line comes from `slurmd -C`; MinJobAge=4 lets `sbatch --wait`
# see completion within seconds; AuthInfo=cred_expire=10 holds a requeued job for 10 s where
# the default holds it for 120 (a requeued job waits out its first attempt's credential lifetime,
# which here covers only a job step's launch on the same host); EnforcePartLimits=ALL rejects an over-sized request at
# submission instead of leaving it pending. slurmctld and slurmd listen on two ports free when
# `start` runs (not Slurm's defaults), so a cluster another test session left running on this
# host does not stop this one from starting.
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge)

usage() {
    echo "usage: $0 start|stop DIR" >&2
    exit 2
}

install_packages() {
    local missing=()
    for tool in slurmctld slurmd sbatch munged; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    echo "slurm_cluster: installing ${packages[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
    }
}

munge_works() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

start_munge() {
    local dir="$1"
    if munge_works; then
        return 0
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    runuser -u munge -- munged
    local pid=""
    for _ in $(seq 50); do
        munge_works && pid="$(cat /run/munge/munged.pid 2>/dev/null || true)" && [[ -n "$pid" ]] && break
        sleep 0.1
    done
    if [[ -z "$pid" ]]; then
        echo "slurm_cluster: munged did not start" >&2
        exit 1
    fi
    echo "$pid" >"$dir/munged.pid"
}

# Two TCP ports no one listens on now, on one line.
free_ports() {
    python3 -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in socks))'
}

write_conf() {
    local dir="$1" host node ctld_port slurmd_port
    host="$(hostname -s)"
    node="$(slurmd -C | head -n 1)"
    read -r ctld_port slurmd_port < <(free_ports)
    mkdir -p "$dir/state" "$dir/spool"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=opefo-test
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=4
EnforcePartLimits=ALL
KillWait=5
$node
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

wait_for_node() {
    local dir="$1"
    for _ in $(seq 150); do
        if SLURM_CONF="$dir/slurm.conf" sinfo --noheader --states=idle --format=%n 2>/dev/null \
            | grep -q .; then
            return 0
        fi
        sleep 0.2
    done
    echo "slurm_cluster: the node did not become idle; see $dir/slurmctld.log and slurmd.log" >&2
    exit 1
}

start() {
    local dir="$1"
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "slurm_cluster: must run as root" >&2
        exit 1
    fi
    mkdir -p "$dir"
    install_packages
    start_munge "$dir"
    write_conf "$dir"
    slurmctld -f "$dir/slurm.conf" -i
    slurmd -f "$dir/slurm.conf"
    wait_for_node "$dir"
    echo "SLURM_CONF=$dir/slurm.conf"
}

stop_pid_file() {
    local file="$1" pid
    [[ -s "$file" ]] || return 0
    pid="$(cat "$file")"
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

stop() {
    local dir="$1"
    stop_pid_file "$dir/slurmd.pid"
    stop_pid_file "$dir/slurmctld.pid"
    stop_pid_file "$dir/munged.pid"
}

[[ $# -eq 2 ]] || usage
case "$1" in
    start) start "$2" ;;
    stop) stop "$2" ;;
    *) usage ;;
esac
