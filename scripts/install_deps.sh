#!/usr/bin/env bash
# Installs the Debian packages hubrt builds against, only when missing;
# with --test also what the tests drive (Chromium for the serve page test).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libcjson-dev libpcre2-dev libutf8proc-dev
      libcmocka-dev libdlpack-dev libcurl4-openssl-dev libmicrohttpd-dev libssl-dev libpng-dev libopenmpi-dev openmpi-bin clang libclang-rt-14-dev python3-venv)
[ "${1:-}" = "--test" ] && pkgs+=(chromium chromium-driver)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# cmake and ninja may come from pip instead of Debian; accept either.
command -v cmake >/dev/null && missing=("${missing[@]/cmake}")
command -v ninja >/dev/null && missing=("${missing[@]/ninja-build}")
python3 -m venv --help >/dev/null 2>&1 && missing=("${missing[@]/python3-venv}")
read -r -a missing <<<"${missing[*]}"
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
