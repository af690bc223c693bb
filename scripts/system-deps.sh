#!/usr/bin/env bash
# Installs the Debian packages the project needs, only when something is missing.
#   scripts/system-deps.sh demo   what `make demo` needs: Java 17 for Spark and the Kafka broker
#   scripts/system-deps.sh [test] that, plus what only the tests need: headless Chromium and
#                                 docker-compose (`make test`)
set -euo pipefail

needs="${1:-test}"
case "$needs" in
    demo|test) ;;
    *) echo "usage: $0 [demo|test]" >&2; exit 2 ;;
esac

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
if [ "$needs" = test ]; then
    # The browser tests drive Debian's Chromium (tests/integration/test_dashboard_browser.py).
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    # docker-compose validates docker-compose.yml without a Docker engine (tests/unit/test_compose.py).
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
fi

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
