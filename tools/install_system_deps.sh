#!/usr/bin/env bash
# Usage: tools/install_system_deps.sh
# Installs the Debian packages asrkit's demo and tests need (espeak-ng, sox, flac) if any is missing.
set -euo pipefail
pkgs=(espeak-ng sox flac)
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
