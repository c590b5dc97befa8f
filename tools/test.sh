#!/usr/bin/env bash
# Install everything the tests need, then run every test (the CI gate). Idempotent: a second run installs nothing new.
#
#   bash tools/test.sh
#
# 1. Debian packages through apt-get (Chromium for the docs test, git, fonts), only those missing.
# 2. A local Slurm through tools/slurm/install.sh (apt-get), started for the tests and stopped afterwards.
# 3. The package with its dev extras; torch pinned to the CPU build 2.13.0 (NXP_TORCH= keeps an installed torch).
# 4. The Jupyter kernel papermill uses.
# 5. tools/ci_gate.sh: clean, sync, readme, nbtest, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { printf '\n== %s\n' "$*"; }

SUDO=''
if [ "$(id -u)" -ne 0 ]; then SUDO='sudo'; fi

say "system packages (apt-get)"
missing=()
command -v git >/dev/null 2>&1 || missing+=(git)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "all present"
fi

# --- Slurm hook: tools/slurm/ (install.sh, start.sh, stop.sh) belongs to the cluster launcher. ---------------------------
# Until those scripts exist the Slurm tests skip themselves; once they exist this block installs, starts and stops Slurm.
slurm_started=''
if [ -f tools/slurm/install.sh ]; then
  say "Slurm (tools/slurm/install.sh)"
  $SUDO bash tools/slurm/install.sh
  if [ -f tools/slurm/start.sh ]; then
    $SUDO bash tools/slurm/start.sh && slurm_started=1
  fi
else
  say "Slurm: tools/slurm/install.sh not present yet – Slurm tests will skip"
fi
stop_slurm() { if [ -n "$slurm_started" ] && [ -f tools/slurm/stop.sh ]; then $SUDO bash tools/slurm/stop.sh || true; fi; }
trap stop_slurm EXIT
# -------------------------------------------------------------------------------------------------------------------------

say "Python packages"
torch_spec=${NXP_TORCH-torch==2.13.0}
# shellcheck disable=SC2086
python3 -m pip install -q --disable-pip-version-check $torch_spec -e ".[dev]"
python3 -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null  # this environment only
echo "torch $(python3 -c 'import importlib.metadata as m; print(m.version("torch"))'), nbdev $(python3 -c 'import importlib.metadata as m; print(m.version("nbdev"))'), kernel python3 registered"
echo "set-up took $((SECONDS - started)) s"

rc=0
bash tools/ci_gate.sh || rc=$?
echo "tools/test.sh: $((SECONDS - started)) s in all"
exit $rc
