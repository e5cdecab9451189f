#!/usr/bin/env bash
# App benchmark: memory with 8 simulated GPUs after an hour of samples and 100,000 history rows,
# time to open and scroll History, CPU when idle. Writes target/bench/app.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STARTED_DOCKERD=0
. scripts/docker-up.sh
npm --prefix ui run build
cargo build -p gantry-app --locked
state=$(mktemp -d)/state
cargo run --release --locked -p gantry-core --example seed_history -- "$state" 100000
if [ -z "${DISPLAY:-}" ]; then Xvfb :96 -screen 0 1280x800x24 >/dev/null 2>&1 & XV=$!; export DISPLAY=:96; sleep 1; fi
export LANG="${LANG:-C.UTF-8}" PATH="$HOME/.cargo/bin:$PATH"
node ui/e2e/bench.mjs "$state"
[ -n "${XV:-}" ] && kill $XV || true
