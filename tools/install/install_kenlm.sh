#!/usr/bin/env bash
# Build KenLM's lmplz and build_binary into tools/kenlm/bin (used by `asrkit train-ngram`).
#
# Usage: tools/install/install_kenlm.sh [--jobs N] [--prefix DIR]
#   --jobs N      parallel compile jobs (default: number of cores)
#   --prefix DIR  install directory (default: tools/kenlm of this checkout); binaries go to DIR/bin
#
# The source is the kenlm source distribution from the Python package registry (it ships the
# lmplz builder too), fetched with `pip download`; set KENLM_SPEC to build another version
# (default kenlm==0.3.0). Needs cmake, a C++ compiler, Debian's Boost (program_options, system,
# thread, test) and the zlib/bz2/lzma headers; missing Debian packages are installed with
# apt-get (one `apt-get update` first). Idempotent: exits at once when both binaries already run.
# Takes about a minute on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prefix="$root/tools/kenlm"
jobs="$(nproc 2>/dev/null || echo 2)"
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
spec="${KENLM_SPEC:-kenlm==0.3.0}"
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') install_kenlm: $*"; }

# Both tools exit non-zero on --help; "works" means the binary starts and prints its usage.
works() {
  [ -x "$1" ] || return 1
  local out
  out="$("$1" --help 2>&1 || true)"
  case "$out" in *[Uu]sage*|*[Oo]ptions*) return 0 ;; *) return 1 ;; esac
}
if works "$prefix/bin/lmplz" && works "$prefix/bin/build_binary"; then
  log "already installed in $prefix/bin"
  exit 0
fi

packages=(cmake g++ make libboost-program-options-dev libboost-system-dev libboost-thread-dev
          libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Prefer the project's virtual environment for pip (any pip can download an sdist).
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kenlm_build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "downloading $spec source distribution"
"$python" -m pip download "$spec" --no-binary kenlm --only-binary cmake,ninja --no-deps --quiet -d "$work"
archive="$(ls "$work"/kenlm-*.tar.gz | head -n 1)"
tar -xzf "$archive" -C "$work"
src="$(ls -d "$work"/kenlm-*/ | head -n 1)"

log "building lmplz and build_binary with $jobs jobs"
start=$(date +%s)
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 \
  || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target lmplz build_binary -j "$jobs" >"$work/make.log" 2>&1 \
  || { tail -n 50 "$work/make.log" >&2; exit 1; }

mkdir -p "$prefix/bin"
install -m 755 "$work/build/bin/lmplz" "$work/build/bin/build_binary" "$prefix/bin/"
works "$prefix/bin/lmplz" || { echo "$0: built lmplz does not run" >&2; exit 1; }
log "installed $prefix/bin/lmplz and $prefix/bin/build_binary in $(( $(date +%s) - start )) s"
