#!/usr/bin/env bash
# Usage: local/download_and_untar.sh [--mirror URL] [--checksums FILE] [--retries N] [--remove-archive true]
#            DIR NAME
# NAME is either a LibriSpeech part (dev-clean dev-other test-clean test-other train-clean-100
# train-clean-360 train-other-500; OpenSLR resource 12): DIR/NAME.tar.gz is unpacked into
# DIR/LibriSpeech/NAME and DIR/LibriSpeech/NAME/.complete written;
# or a file of the LM resources (OpenSLR resource 11: librispeech-lm-norm.txt.gz, 3-gram.arpa.gz,
# 4-gram.arpa.gz, librispeech-lexicon.txt, librispeech-vocab.txt, ...): kept as DIR/NAME, with
# DIR/NAME.complete once verified;
# or musan (OpenSLR 17: musan.tar.gz unpacked into DIR/musan) or rirs_noises (OpenSLR 28: rirs_noises.zip
# unpacked into DIR/RIRS_NOISES), the noises and impulse responses of multi-condition training, with
# DIR/musan/.complete and DIR/RIRS_NOISES/.complete.
# All the work is tools/download.py's: resumed with HTTP Range requests, checked against
# --checksums (default local/checksums.txt) before anything is unpacked, a mismatch deleted and
# fetched again up to --retries times, and nothing done again once the marker exists.
# --mirror (or the environment variable OPENSLR_MIRROR) replaces https://www.openslr.org/resources,
# e.g. https://us.openslr.org/resources, https://openslr.elda.org/resources, or a local server (tests).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

mirror="${OPENSLR_MIRROR:-https://www.openslr.org/resources}"
checksums="$here/checksums.txt"
retries=3
remove_archive=false
. "$root/tools/parse_options.sh"
[ $# -eq 2 ] || { sed -n '2,3p' "$0" >&2; exit 1; }
dir=$1; name=$2
python="$root/.venv/bin/python"; [ -x "$python" ] || python=python3

case "$name" in
  dev-clean|dev-other|test-clean|test-other|train-clean-100|train-clean-360|train-other-500)
    unpack=(--unpack "$dir" --marker "$dir/LibriSpeech/$name/.complete")
    [ "$remove_archive" = true ] && unpack+=(--remove-archive)
    "$python" "$root/tools/download.py" --checksums "$checksums" --retries "$retries" "${unpack[@]}" \
      "$mirror/12/$name.tar.gz" "$dir" ;;
  musan|rirs_noises)
    case "$name" in
      musan) url="$mirror/17/musan.tar.gz"; unpacked=musan ;;
      *) url="$mirror/28/rirs_noises.zip"; unpacked=RIRS_NOISES ;;
    esac
    unpack=(--unpack "$dir" --marker "$dir/$unpacked/.complete")
    [ "$remove_archive" = true ] && unpack+=(--remove-archive)
    "$python" "$root/tools/download.py" --checksums "$checksums" --retries "$retries" "${unpack[@]}" "$url" "$dir" ;;
  *)
    "$python" "$root/tools/download.py" --checksums "$checksums" --retries "$retries" \
      "$mirror/11/$name" "$dir" ;;
esac
