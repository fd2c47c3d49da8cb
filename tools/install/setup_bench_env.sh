#!/usr/bin/env bash
# Create a separate virtual environment for tools/bench/bench_decode.py with the peer CTC decoders.
#
# Usage: tools/install/setup_bench_env.sh [--venv DIR] [--main-venv DIR] [--standalone]
#   --venv DIR       the benchmark venv to create or update (default: .venv-bench in the repo root)
#   --main-venv DIR  the toolkit's venv whose packages are reused (default: .venv; see below)
#   --standalone     install asrkit and everything it needs into DIR (pip install -e '.[bench]':
#                    downloads torch again, several GB) instead of reusing the main venv
#
# Why a second venv: the `bench` extra (setup.py) holds pyctcdecode, flashlight-text and kenlm;
# pyctcdecode pins numpy<2 while the toolkit's venv has numpy 2, and the toolkit never needs
# the peers. Default mode: DIR gets only the bench extra (numpy<2 comes with pyctcdecode; kenlm
# is skipped when the main venv already has it) and then a .pth file that appends the main
# venv's site-packages, so torch, torchaudio, sentencepiece and the editable asrkit are shared
# while DIR's numpy 1.x shadows numpy 2 (only DIR's python sees it; the main venv is untouched).
# torchaudio's `models.decoder.ctc_decoder` is flashlight-text's LexiconFreeDecoder behind a
# Python wrapper; the benchmark uses it, or flashlight-text directly if torchaudio lacks it.
# Idempotent; ends with an import check. Then run, e.g.:
#   .venv-bench/bin/python tools/bench/bench_decode.py --decoders prefix pyctcdecode flashlight
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-bench"
main_venv="$root/.venv"
standalone=0
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv="$2"; shift 2 ;;
    --main-venv) main_venv="$2"; shift 2 ;;
    --standalone) standalone=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') setup_bench_env: $*"; }

if [ "$standalone" -eq 0 ] && [ ! -x "$main_venv/bin/python" ]; then
  echo "$0: no main venv at $main_venv (run 'make install' first, or use --standalone)" >&2
  exit 1
fi
python="${PYTHON:-python3}"
if [ "$standalone" -eq 0 ]; then
  python="$main_venv/bin/python"  # the same interpreter version, so the shared packages load
fi
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$python" -m venv "$venv"
fi
echo '*' > "$venv/.gitignore"  # keep the venv out of git status
site_dir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pth="$site_dir/_asrkit_main_venv.pth"
rm -f "$pth"  # pip must not see (or try to replace) the main venv's packages while installing
"$venv/bin/python" -m pip install -q --upgrade pip

# The bench extra, read from setup.py so that the list lives in one place.
mapfile -t reqs < <("$venv/bin/python" - "$root/setup.py" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == "extras_require":
        # only the bench entry is a literal (the others are built from setup.py's EXTRAS)
        extras = {k.value: v for k, v in zip(node.value.keys, node.value.values) if isinstance(k, ast.Constant)}
        print("\n".join(ast.literal_eval(extras["bench"])))
        break
else:
    sys.exit("setup.py has no extras_require['bench']")
EOF
)

if [ "$standalone" -eq 1 ]; then
  log "installing asrkit with the bench extra into $venv (standalone)"
  "$venv/bin/python" -m pip install -q -e "$root[bench]"
else
  todo=()
  for r in "${reqs[@]}"; do
    name="${r%%[<>=!~ ]*}"
    if [ "$name" = kenlm ] && "$main_venv/bin/python" -c 'import kenlm' 2>/dev/null; then
      log "kenlm: reusing the main venv's build"
      continue
    fi
    todo+=("$r")
  done
  log "installing ${todo[*]} into $venv"
  "$venv/bin/python" -m pip install -q "${todo[@]}"
  main_site="$("$main_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # An "import" line runs site.addsitedir: the main venv's own .pth files (the editable asrkit)
  # are processed too, and its directory comes after this venv's, so numpy<2 here wins.
  echo "import site; site.addsitedir('$main_site')" > "$pth"
  log "reusing $main_site (torch, torchaudio, asrkit) through $(basename "$pth")"
fi

"$venv/bin/python" - <<'EOF'
import numpy, torch, pyctcdecode, kenlm, flashlight.lib.text.decoder  # noqa: F401
import asrkit.search.ctc_prefix  # noqa: F401
try:
    from torchaudio.models.decoder import ctc_decoder  # noqa: F401
    fl = "torchaudio.models.decoder.ctc_decoder (flashlight-text)"
except Exception as exc:  # torchaudio without the decoder wrapper: flashlight-text is used directly
    fl = f"flashlight-text directly (torchaudio: {exc})"
print(f"bench venv ok: numpy {numpy.__version__}, torch {torch.__version__}, "
      f"pyctcdecode {getattr(pyctcdecode, '__version__', '?')}, flashlight via {fl}")
EOF
log "done; run tools/bench/bench_decode.py with $venv/bin/python"
