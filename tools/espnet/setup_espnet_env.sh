#!/usr/bin/env bash
# Create a separate virtual environment with ESPnet2 for tools/espnet/bench_espnet.sh.
#
# Usage: tools/espnet/setup_espnet_env.sh [--venv DIR] [--espnet SPEC]
#   --venv DIR     the venv to create or update (default: .venv-espnet in the repo root)
#   --espnet SPEC  the pip requirement for ESPnet (default: espnet)
#
# Why a second venv: ESPnet pins its own torch (and numpy, librosa, ...) versions, which must not
# replace the toolkit's. `pip install espnet` installs the torch it pins from the registry; the
# registry's CUDA build runs on CPU too (the CPU wheel index is not reachable here). The ESPnet
# entry points used by the benchmark (espnet2.bin.asr_train, asr_inference) also import
# matplotlib, tensorboard, einops and torchaudio at run time, so they are installed as well. The asrkit side of the
# benchmark runs in the toolkit's own .venv; this venv needs nothing from asrkit.
# Idempotent: a second run only checks the imports. Ends with an import check.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-espnet"
espnet_spec="espnet"
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv="$2"; shift 2 ;;
    --espnet) espnet_spec="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') setup_espnet_env: $*"; }

python="${PYTHON:-python3}"
if [ -x "$root/.venv/bin/python" ]; then
  python="$root/.venv/bin/python"  # the same interpreter version as the toolkit's venv
fi
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$python" -m venv "$venv"
fi
echo '*' > "$venv/.gitignore"  # keep the venv out of git status

check() {
  "$venv/bin/python" - <<'EOF'
import espnet, espnet2.bin.asr_train, espnet2.bin.asr_inference, espnet2.bin.launch  # noqa: F401
import matplotlib, tensorboard, torch  # noqa: F401
print(f"espnet venv ok: espnet {espnet.__version__}, torch {torch.__version__}")
EOF
}

if [ -f "$venv/.espnet_installed" ] && check 2>/dev/null; then
  log "already installed ($venv)"
  exit 0
fi
start=$(date +%s)
"$venv/bin/python" -m pip install -q --upgrade pip
log "installing $espnet_spec and its requirements (pip resolves their torch) into $venv; a complaint about ci_sdr is expected (installed last)"
# ESPnet without its dependencies first, then its requirements (no extras) read from its own
# metadata, less ci_sdr: every ci-sdr release names a git URL (padertorch) in its metadata, which
# pip refuses from the registry, and only speech enhancement uses it. pip picks torch (ESPnet
# asks for >= 1.11) from the registry here.
"$venv/bin/python" -m pip install -q --no-deps "$espnet_spec"
mapfile -t reqs < <("$venv/bin/python" -c '
import importlib.metadata as md, re
for line in md.requires("espnet") or []:
    name = re.match(r"[A-Za-z0-9_.-]+", line).group(0).replace("-", "_").lower()
    if ";" not in line and name != "ci_sdr":
        print(line)')
"$venv/bin/python" -m pip install -q "${reqs[@]}" matplotlib tensorboard einops
# torchaudio (imported by espnet2.tasks.asr) for the torch just resolved, which must stay as it is.
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$venv/bin/python" -m pip install -q torchaudio "torch==$torch_version"
# espnet2.tasks.asr imports the enhancement model, which imports ci_sdr. pip >= 25 refuses even to
# download it (see above), pip 24.0 downloads the sdist without looking at its dependencies; the local
# file then installs with --no-deps (ci_sdr needs only torch and numpy, already here).
if ! "$venv/bin/python" -c 'import ci_sdr' 2>/dev/null; then
  tmp="$(mktemp -d)"
  "$python" -m venv "$tmp/pip24"
  "$tmp/pip24/bin/python" -m pip install -q "pip==24.0"
  "$tmp/pip24/bin/python" -m pip download -q --no-deps ci-sdr -d "$tmp/dl"
  "$venv/bin/python" -m pip install -q --no-deps "$tmp"/dl/*
  rm -rf "$tmp"
fi
check
touch "$venv/.espnet_installed"
log "done in $(( $(date +%s) - start )) s; $(du -sh "$venv" | cut -f1) on disk"
