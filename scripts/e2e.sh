#!/usr/bin/env bash
# Build the app and drive it end to end: Xvfb + tauri-driver + WebKitWebDriver, real Docker,
# simulated GPUs. Screenshots land in target/e2e-shots/. Assumes scripts/test.sh set up deps.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v tauri-driver >/dev/null || [ -x "$HOME/.cargo/bin/tauri-driver" ] || cargo install tauri-driver --locked --version 2.1.0
export PATH="$HOME/.cargo/bin:$PATH"
npm --prefix ui run build
cargo build -p gantry-app --locked
STARTED_XVFB=""
if [ -z "${DISPLAY:-}" ]; then
  Xvfb :97 -screen 0 1280x800x24 >/tmp/gantry-xvfb.log 2>&1 &
  STARTED_XVFB=$!
  export DISPLAY=:97
  sleep 1
fi
trap '[ -n "$STARTED_XVFB" ] && kill $STARTED_XVFB 2>/dev/null || true' EXIT
export LANG="${LANG:-C.UTF-8}"
rm -rf target/e2e-shots
timeout 600 npm --prefix ui run e2e
echo "==> screenshots in target/e2e-shots/"; ls target/e2e-shots
