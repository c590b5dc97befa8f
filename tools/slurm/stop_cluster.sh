#!/usr/bin/env bash
# Stop a cluster started by start_cluster.sh: only the PIDs it recorded, then its namespaces, bridge and /etc/hosts lines.
#   stop_cluster.sh [--name ci] [--keep-munge]
set -uo pipefail
name=ci; keep_munge=0
while [ $# -gt 0 ]; do
    case "$1" in --name) name=$2; shift 2;; --keep-munge) keep_munge=1; shift;; *) echo "unknown argument $1" >&2; exit 2;; esac
done
root=/var/lib/nxpretrain-slurm; dir=$root/$name
if [ -f "$dir/pids" ]; then
    pids=$(cat "$dir/pids")
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    for _ in $(seq 100); do
        alive=0; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break; sleep 0.1
    done
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    rm -f "$dir/pids"
fi
if [ -f "$dir/netns" ]; then
    while read -r ns; do
        # jobs still running inside a node namespace end with it
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done < "$dir/netns"
    rm -f "$dir/netns"
    sed -i '/^10\.200\.0\.[0-9]* node[0-9]*$/d' /etc/hosts
fi
if [ -f "$dir/bridge" ]; then ip link del "$(cat "$dir/bridge")" 2>/dev/null; rm -f "$dir/bridge"; fi
# munged goes when no other cluster is left running.
others=$(ls "$root"/*/pids 2>/dev/null | wc -l)
if [ "$keep_munge" = 0 ] && [ "$others" = 0 ] && [ -f "$root/munged.pid" ]; then
    kill -TERM "$(cat "$root/munged.pid")" 2>/dev/null; rm -f "$root/munged.pid"
fi
exit 0
