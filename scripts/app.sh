#!/usr/bin/env bash
# Set up and launch the Gantry desktop app. It hosts the engine in-process when none runs
# (simulated GPUs, clearly labeled, when there is no NVIDIA driver) and uses the real Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-ci-deps.sh docker.io busybox-static build-essential pkg-config curl file \
  libwebkit2gtk-4.1-dev libxdo-dev libayatana-appindicator3-dev librsvg2-dev
STARTED_DOCKERD=0
. scripts/docker-up.sh   # also builds the demo image gantry-test/busybox:1
[ -d ui/node_modules ] || npm --prefix ui ci --no-audit --no-fund
npm --prefix ui run build
cargo build -p gantry-app --locked
cargo build -p gantry --locked
if [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  echo "No display found: starting a virtual one (Xvfb :98). Screenshot it with: DISPLAY=:98 import -window root shot.png"
  scripts/setup-ci-deps.sh xvfb
  Xvfb :98 -screen 0 1280x800x24 >/tmp/gantry-xvfb.log 2>&1 &
  export DISPLAY=:98
  sleep 1
fi
export LANG="${LANG:-C.UTF-8}"
echo "==> Gantry app. CLI: target/debug/gantry (try: target/debug/gantry gpus)"
exec target/debug/gantry-app "$@"
