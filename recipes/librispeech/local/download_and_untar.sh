#!/usr/bin/env bash
# Usage: local/download_and_untar.sh CORPUS_DIR PART   (e.g. train-clean-100)
# Downloads PART of LibriSpeech from openslr.org (resource 12) and unpacks it into CORPUS_DIR/LibriSpeech/PART.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,3p' "$0"; exit 1; }
dir=$1; part=$2
[ -f "$dir/LibriSpeech/$part/.complete" ] && { echo "$part already present"; exit 0; }
mkdir -p "$dir"
wget --continue -O "$dir/$part.tar.gz" "https://www.openslr.org/resources/12/$part.tar.gz"
tar -C "$dir" -xzf "$dir/$part.tar.gz"
touch "$dir/LibriSpeech/$part/.complete"
