#!/usr/bin/env bash
# Set up and run every Gantry test: Rust unit + integration tests against the real Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-ci-deps.sh docker.io busybox-static build-essential pkg-config util-linux
STARTED_DOCKERD=0
. scripts/docker-up.sh
cleanup() { if [ "$STARTED_DOCKERD" = 1 ]; then echo "==> stopping the dockerd we started"; pkill -TERM -x dockerd || true; fi; }
trap cleanup EXIT
echo "==> cargo test"
cargo test --workspace --locked
