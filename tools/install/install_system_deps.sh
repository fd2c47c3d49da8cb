#!/usr/bin/env bash
# Usage: tools/install/install_system_deps.sh
# Installs the Debian packages asrkit's demo and tests need if any is missing: the speech synthesizers of
# tools/make_synthetic_corpus.py (espeak-ng; festival with the kal, ked and slt HTS voices; flite), sox, flac;
# chromium and chromium-driver: the browser that tests/serve/test_page.py drives (Debian's: no browser download).
set -euo pipefail
pkgs=(espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts sox flac chromium chromium-driver)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
