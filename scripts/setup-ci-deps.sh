#!/usr/bin/env bash
# Install what Gantry's build and tests need on Debian 12, only what is missing. Idempotent.
set -euo pipefail
need=()
for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "==> apt-get install ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
