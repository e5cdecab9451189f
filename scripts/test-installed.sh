#!/usr/bin/env bash
# Install the .deb on this machine and test it as a lab uses it: the engine started by the systemd
# unit's ExecStart line (containers have no systemd), real users with no setup, an upgrade while a job
# runs. Needs root and the debug binaries (scripts/test.sh builds them first). Leaves the package
# installed and the service stopped only if it was not installed before.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test-installed.sh: run as root (it installs a package)" >&2; exit 1; }
BASE="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
GANTRY_DEB_VERSION="$BASE" scripts/package.sh --debug
GANTRY_DEB_VERSION="$BASE+upgrade1" scripts/package.sh --debug
ARCH="$(dpkg --print-architecture)"
WAS_INSTALLED=0; dpkg-query -W -f='${Status}' gantry 2>/dev/null | grep -q "ok installed" && WAS_INSTALLED=1
stop_service() { pkill -TERM -f '^/usr/bin/gantry daemon --system$' 2>/dev/null || true; }
cleanup() {
  stop_service
  if [ "$WAS_INSTALLED" = 0 ]; then dpkg --purge gantry >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
stop_service
# A fresh install: the package's own config, not one left by an earlier run.
dpkg --purge gantry >/dev/null 2>&1 || true
rm -f /etc/gantry/config.toml
dpkg -i "target/gantry_${BASE}_${ARCH}.deb"
GANTRY_UPGRADE_DEB="$PWD/target/gantry_${BASE}+upgrade1_${ARCH}.deb" \
  cargo test --locked -p gantry --test installed -- --test-threads=1
