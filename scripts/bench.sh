#!/usr/bin/env bash
# Engine benchmarks (dispatch latency, submit cost with a deep queue, history queries, idle cost)
# and the trace simulator on the Alibaba trace. Writes target/bench/engine.md and target/bench/sim.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-ci-deps.sh docker.io busybox-static build-essential pkg-config
STARTED_DOCKERD=0
. scripts/docker-up.sh
trap '[ "$STARTED_DOCKERD" = 1 ] && { [ -n "${DOCKERD_PID:-}" ] && kill -TERM "$DOCKERD_PID"; } || true' EXIT
cargo bench --locked --bench engine
cargo build --release --locked -p gantry
trace=../shared/traces/alibaba-openb-pod-list-default.csv
if [ -f "$trace" ]; then
  target/release/gantry sim --trace "$trace" --gpus 8x32GiB --load 1.2 | tee target/bench/sim.txt
fi
target/release/gantry sim --trace traces/lab-week.csv --gpus 4x24GiB --policy gantry --fair-share 24h | tee -a target/bench/sim.txt
