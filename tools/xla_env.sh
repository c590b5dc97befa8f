#!/usr/bin/env bash
# The separate environment for the XLA tests: torch-xla with its own torch (2.9.0; the project's torch is newer).
#   tools/xla_env.sh            creates ${NXP_XLA_VENV:-~/.cache/nxpretrain/venv-xla} once and prints its python
# It lives in the user cache, not the clone: ~4 GB that every clone and every gate run on this machine share.
# PyPI's torch 2.9.0 for Linux x86_64 is the CUDA 12.8 build (a 900 MB wheel that pulls ~3 GB of nvidia-* libraries, ~7 GB
# installed): `import torch` loads them even on a machine without a GPU. The CPU build lives only on download.pytorch.org;
# set NXP_TORCH_INDEX=https://download.pytorch.org/whl/cpu where that index is reachable to install ~1 GB instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${NXP_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nxpretrain/venv-xla}
mkdir -p "$(dirname "$venv")"
if [ ! -x "$venv/bin/python" ] || ! PJRT_DEVICE=CPU "$venv/bin/python" -c 'import torch_xla' 2>/dev/null; then
    python3 -m venv "$venv"
    index=()
    if [ -n "${NXP_TORCH_INDEX:-}" ]; then index=(--extra-index-url "$NXP_TORCH_INDEX"); fi
    "$venv/bin/pip" install -q "${index[@]}" torch==2.9.0 torch-xla==2.9.0 >&2
    # nxpretrain's own dependencies except torch (the package itself comes from PYTHONPATH)
    "$venv/bin/pip" install -q numpy pyyaml 'tqdm>=4.60' 'tokenizers>=0.19' 'safetensors>=0.4' 'fastcore>=1.8' 'crc32c>=2.3' h5py >&2
fi
echo "$venv/bin/python"
