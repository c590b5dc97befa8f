#!/usr/bin/env bash
# Install Debian's Slurm (slurmctld, slurmd, client) and munge without starting any service.
# Idempotent: does nothing when everything is already there. Safe on a fresh Debian 12 as root.
# Exit status: 0 installed (or already present), 2 not root, 3 no apt-get, 4 apt-get failed.
set -euo pipefail

need=(sbatch squeue scontrol scancel slurmctld slurmd munged ip nsenter unshare)
missing=()
for c in "${need[@]}"; do
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm: already installed (slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null))"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm: cannot install (${missing[*]} missing): not root" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm: cannot install (${missing[*]} missing): no apt-get on this machine" >&2
    exit 3
fi

export DEBIAN_FRONTEND=noninteractive
# Keep apt from starting daemons: we start them by hand with our own configuration.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

# Only refresh the package lists when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n1)" ]; then
    apt-get update -qq || { echo "slurm: apt-get update failed" >&2; exit 4; }
fi
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null \
    || { echo "slurm: apt-get install failed" >&2; exit 4; }
echo "slurm: installed (slurm $(dpkg-query -W -f='${Version}' slurm-client))"
