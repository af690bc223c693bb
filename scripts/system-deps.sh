#!/usr/bin/env bash
# Installs the Debian packages the stack and the tests need, only when something is missing.
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# docker-compose validates docker-compose.yml without a Docker engine (tests/unit/test_compose.py).
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    echo "Missing Debian packages: ${missing[*]}. Install them as root (apt-get install ${missing[*]})." >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
