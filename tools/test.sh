#!/usr/bin/env bash
# Install everything the tests need, then run every test (the CI gate). Idempotent: a second run installs nothing new.
#
#   bash tools/test.sh                  # install, then every step of the gate
#   bash tools/test.sh clean sync       # install, then only those steps (see tools/ci_gate.sh)
#
# 1. Debian packages through apt-get (Chromium and its driver for the docs and browser tests, git, fonts), only those missing.
# 2. Debian's Slurm and munge through tools/slurm/install.sh (apt-get); the Slurm tests start their own clusters.
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
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)   # Selenium drives Debian's Chromium (tests/test_browser.py)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || missing+=(fonts-dejavu-core)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)   # the container stand-in of tests/test_container_job.py
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "all present"
fi

# --- Slurm: tools/slurm/install.sh (the cluster launcher's) installs Debian's Slurm and munge, idempotently. ----------
# The Slurm tests start and stop their own clusters (tools/slurm/start_cluster.sh, stop_cluster.sh); without Slurm
# they skip, naming the reason.
if [ -f tools/slurm/install.sh ]; then
  say "Slurm (tools/slurm/install.sh)"
  if [ -n "$SUDO" ]; then $SUDO bash tools/slurm/install.sh; else bash tools/slurm/install.sh; fi
else
  say "Slurm: tools/slurm/install.sh not on this branch yet – the Slurm tests will skip"
fi
# -------------------------------------------------------------------------------------------------------------------------

say "Python packages"
torch_spec=${NXP_TORCH-torch==2.13.0}
# shellcheck disable=SC2086
python3 -m pip install -q --disable-pip-version-check $torch_spec -e ".[dev]"
python3 -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null  # this environment only
echo "torch $(python3 -c 'import importlib.metadata as m; print(m.version("torch"))'), nbdev $(python3 -c 'import importlib.metadata as m; print(m.version("nbdev"))'), kernel python3 registered"
echo "set-up took $((SECONDS - started)) s"

rc=0
bash tools/ci_gate.sh "$@" || rc=$?
echo "tools/test.sh: $((SECONDS - started)) s in all"
exit $rc
