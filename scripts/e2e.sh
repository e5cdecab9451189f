#!/usr/bin/env bash
# Build the app and drive it end to end: Xvfb + tauri-driver + WebKitWebDriver, real Docker,
# simulated GPUs. Three scenarios (ui/e2e/): the app hosting its own engine; the app started as the
# real user gantry-alice with an empty environment finding the system engine (see system.e2e.mjs for
# how it runs as alice and which system engine it uses); and the app on a "laptop" using a workstation
# through a real sshd on 127.0.0.1 (remote.e2e.mjs; needs openssh-server). Screenshots land in
# target/e2e-shots/.
# Assumes scripts/test.sh set up deps; runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v tauri-driver >/dev/null || [ -x "$HOME/.cargo/bin/tauri-driver" ] || cargo install tauri-driver --locked --version 2.1.0
export PATH="$HOME/.cargo/bin:$PATH"
npm --prefix ui run build
cargo build --workspace --all-targets --locked   # the app and CLI; the same features as `cargo test --workspace`, so no rebuild after it
# The same plain user the integration tests use (never in the docker group).
id -u gantry-alice >/dev/null 2>&1 || useradd -m -U -s /bin/sh gantry-alice
STARTED_XVFB=""
if [ -z "${DISPLAY:-}" ]; then
  # A display nobody else uses: other runs on this machine may hold :97.
  n=97; while [ -e /tmp/.X11-unix/X$n ] || [ -e /tmp/.X$n-lock ]; do n=$((n + 1)); done
  Xvfb :$n -screen 0 1280x800x24 >/tmp/gantry-xvfb.log 2>&1 &
  STARTED_XVFB=$!
  export DISPLAY=:$n
  sleep 1
fi
trap '[ -n "$STARTED_XVFB" ] && kill $STARTED_XVFB 2>/dev/null || true' EXIT
export LANG="${LANG:-C.UTF-8}"
rm -rf target/e2e-shots
timeout 600 npm --prefix ui run e2e
echo "==> screenshots in target/e2e-shots/"; ls target/e2e-shots
