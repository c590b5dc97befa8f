#!/usr/bin/env bash
# Start a real Slurm cluster on this machine, by hand (no systemd).
#   start_cluster.sh [--name ci] [--nodes 1] [--netns] [--cpus N] [--mem MB] [--gres gpu:8] [--port 6817]
#                    [--controller-only] [--partition debug]
# --netns:           each node is its own host: a network namespace on a bridge (10.200.0.0/24), own hostname and IP.
# --controller-only: only slurmctld, nodes of the given shape declared IDLE (for `sbatch --test-only` of big jobs).
# Writes <dir>/slurm.conf and <dir>/env (`export SLURM_CONF=...`); prints the env line last. Records every PID it starts
# in <dir>/pids so stop_cluster.sh ends exactly those.
set -euo pipefail
name=ci; nodes=1; netns=0; cpus=''; mem=''; gres=''; port=6817; ctl_only=0; partition=debug
while [ $# -gt 0 ]; do
    case "$1" in
        --name) name=$2; shift 2;; --nodes) nodes=$2; shift 2;; --netns) netns=1; shift;;
        --cpus) cpus=$2; shift 2;; --mem) mem=$2; shift 2;; --gres) gres=$2; shift 2;; --port) port=$2; shift 2;;
        --controller-only) ctl_only=1; shift;; --partition) partition=$2; shift 2;;
        *) echo "start_cluster.sh: unknown argument $1" >&2; exit 2;;
    esac
done
[[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "start_cluster.sh: --name must be letters, digits, _ or -" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "start_cluster.sh: needs root (daemons, namespaces)" >&2; exit 2; }
command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || { echo "start_cluster.sh: slurm not installed; run install.sh" >&2; exit 3; }
here=$(cd "$(dirname "$0")" && pwd)
dir=/var/lib/nxpretrain-slurm/$name
"$here/stop_cluster.sh" --name "$name" --keep-munge >/dev/null 2>&1 || true
rm -rf "$dir"; install -d "$dir/state" "$dir/log" "$dir/spool"
: > "$dir/pids"

# Node shape: what this machine really has, unless given (controller-only clusters may declare anything).
hw_cpus=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n1)
hw_mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
cpus=${cpus:-$hw_cpus}
mem=${mem:-$(( hw_mem * 9 / 10 / nodes ))}

# munge: one daemon in the root namespace serves every node and cluster.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    cp /run/munge/munged.pid /var/lib/nxpretrain-slurm/munged.pid 2>/dev/null || true
fi

ctl_addr=127.0.0.1
if [ "$netns" = 1 ]; then
    ctl_addr=10.200.0.1
    br=nxbr-$name; br=${br:0:15}
    ip link add "$br" type bridge
    ip addr add 10.200.0.1/24 dev "$br"
    ip link set "$br" up
    echo "$br" > "$dir/bridge"
fi

conf=$dir/slurm.conf
{
    echo "ClusterName=$name"
    echo "SlurmctldHost=localhost($ctl_addr)"
    echo "SlurmctldPort=$port"
    echo "SlurmdPort=$((port + 1))"
    cat <<CONF
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
KillWait=10
MinJobAge=300
SlurmdTimeout=3600
CONF
    [ -n "$gres" ] && echo "GresTypes=${gres%%:*}"
    node_extra="CPUs=$cpus RealMemory=$mem"
    [ -n "$gres" ] && node_extra="$node_extra Gres=$gres"
    if [ "$ctl_only" = 1 ]; then
        echo "NodeName=node[1-$nodes] NodeAddr=127.0.0.1 $node_extra State=IDLE"
    elif [ "$netns" = 1 ]; then
        for i in $(seq "$nodes"); do echo "NodeName=node$i NodeAddr=10.200.0.$((10 + i)) $node_extra State=UNKNOWN"; done
    elif [ "$nodes" = 1 ]; then
        echo "NodeName=localhost NodeAddr=127.0.0.1 $node_extra State=UNKNOWN"
    else
        echo "NodeName=node[1-$nodes] NodeAddr=127.0.0.1 Port=[$((port + 10))-$((port + 9 + nodes))] $node_extra State=UNKNOWN"
    fi
    echo "PartitionName=$partition Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} > "$conf"
[ -n "$gres" ] && echo "Name=${gres%%:*} Count=${gres##*:} File=/dev/null" > "$dir/gres.conf"
export SLURM_CONF=$conf
echo "export SLURM_CONF=$conf" > "$dir/env"

/usr/sbin/slurmctld -f "$conf"
for _ in $(seq 100); do [ -s "$dir/slurmctld.pid" ] && break; sleep 0.1; done
cat "$dir/slurmctld.pid" >> "$dir/pids"
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done

start_slurmd() {  # $1 node name, then the command prefix that puts it on its host
    local node=$1; shift
    "$@" /usr/sbin/slurmd -f "$conf" -N "$node"
    for _ in $(seq 100); do [ -s "$dir/slurmd-$node.pid" ] && break; sleep 0.1; done
    cat "$dir/slurmd-$node.pid" >> "$dir/pids"
}
if [ "$ctl_only" = 0 ]; then
    if [ "$netns" = 1 ]; then
        for i in $(seq "$nodes"); do
            ns=nx-$name-$i; ip=10.200.0.$((10 + i))
            ip netns add "$ns"; echo "$ns" >> "$dir/netns"
            ip link add "nxv-$name-$i" type veth peer name eth0 netns "$ns"
            ip link set "nxv-$name-$i" master "$(cat "$dir/bridge")" up
            ip -n "$ns" addr add "$ip/24" dev eth0
            ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
            ip -n "$ns" route add default via 10.200.0.1
            grep -q "^$ip node$i\$" /etc/hosts || echo "$ip node$i" >> /etc/hosts
            # ip netns exec remounts /sys and hides the cgroup fs from slurmd: enter the net namespace only.
            start_slurmd "node$i" nsenter "--net=/run/netns/$ns" unshare --uts sh -c "hostname node$i && exec \"\$0\" \"\$@\""
        done
    elif [ "$nodes" = 1 ]; then
        start_slurmd localhost
    else
        for i in $(seq "$nodes"); do start_slurmd "node$i"; done
    fi
    # Wait until every node is idle.
    for _ in $(seq 300); do
        states=$(sinfo -h -N -o '%T' | sort -u | tr '\n' ' ')
        [ "$states" = "idle " ] && break
        sleep 0.1
    done
    [ "$states" = "idle " ] || { echo "start_cluster.sh: nodes not idle: $states (see $dir/log)" >&2; exit 1; }
fi
echo "export SLURM_CONF=$conf"
