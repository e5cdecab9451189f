#!/usr/bin/env bash
# App benchmark: resident memory of the app (+ its WebKit processes) with 8 simulated GPUs after an
# hour's worth of samples (sampled every 10 ms for 45 s) and 100,000 history rows, then CPU and memory
# while idle on the GPUs view at the normal 1 Hz. Writes target/bench/app.md. (Debug build.)
set -euo pipefail
cd "$(dirname "$0")/.."
STARTED_DOCKERD=0
. scripts/docker-up.sh
npm --prefix ui run build
cargo build -p gantry-app --locked
state=$(mktemp -d)/state
cargo run --release --locked -p gantry-core --example seed_history -- "$state" 100000
if [ -z "${DISPLAY:-}" ]; then Xvfb :96 -screen 0 1280x800x24 >/dev/null 2>&1 & XV=$!; export DISPLAY=:96; sleep 1; fi
export LANG="${LANG:-C.UTF-8}"
tree() { local p=$1; echo "$p"; for c in $(pgrep -P "$p"); do tree "$c"; done; }
rss() { for p in $(tree "$1"); do awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null; done | awk '{s+=$1} END {printf "%.0f", s/1024}'; }
ticks() { for p in $(tree "$1"); do awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s+=$1} END {print s}'; }
app=target/debug/gantry-app
GANTRY_STATE_DIR=$state GANTRY_GPUS=sim:8x80GiB GANTRY_SAMPLE_MS=10 $app >/dev/null 2>&1 & pid=$!
sleep 45; full=$(rss $pid); kill $pid; wait $pid 2>/dev/null || true; sleep 1
GANTRY_STATE_DIR=$state GANTRY_GPUS=sim:8x80GiB $app >/dev/null 2>&1 & pid=$!
sleep 8; t0=$(ticks $pid); sleep 30; t1=$(ticks $pid); idle_rss=$(rss $pid); kill $pid; wait $pid 2>/dev/null || true
mkdir -p target/bench
{
  echo "| app benchmark (debug build, 8 simulated GPUs, 100k runs) | result |"
  echo "|---|---|"
  echo "| resident memory, app + WebKit, after ~4,500 samples per GPU | ${full} MB |"
  echo "| CPU while idle on the GPUs view (8 live charts, 1 Hz) | $(echo "scale=1; ($t1-$t0)/30" | bc)% of one core |"
  echo "| resident memory while idle | ${idle_rss} MB |"
} | tee target/bench/app.md
[ -n "${XV:-}" ] && kill $XV || true
