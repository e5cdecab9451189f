#!/usr/bin/env bash
# Set up and run every Gantry test on Debian 12: Rust unit + integration tests against the real
# Docker engine and a real single-node Slurm, the UI's unit tests, and the end-to-end test of the real app under Xvfb.
set -euo pipefail
cd "$(dirname "$0")/.."
# No libssl-dev: email and https webhooks use rustls. openssl (the tool): tests/notify.rs makes its test
# CAs with it. prometheus (19 MB download): its promtool checks the engine's /metrics (tests/metrics.rs);
# no service is started.
scripts/setup-ci-deps.sh docker.io busybox-static build-essential pkg-config curl file util-linux \
  openssh-server openssh-client python3-venv dpkg-dev libwebkit2gtk-4.1-dev libxdo-dev libayatana-appindicator3-dev librsvg2-dev xvfb webkit2gtk-driver \
  openssl prometheus
STARTED_DOCKERD=0
# GPU DeviceRequests without a GPU (tests/nvml.rs): dockerd registers its "nvidia" device driver only if
# a (fake) nvidia-container-runtime-hook is on its PATH when it starts, so install it first. A dockerd
# already running without it must be restarted once. Refuses on machines with real NVIDIA parts.
tests/fake-nvml/install-hook.sh
. scripts/docker-up.sh
# A real single-node Slurm (munged, slurmctld, slurmd; 4 fake GPUs) for tests/slurm.rs: installs
# slurm-wlm and munge if missing, idempotent. scripts/slurm-down.sh stops it.
scripts/slurm-up.sh
# tensorboardX in a venv (cached) for the results tests' real TensorBoard client.
scripts/results-venv.sh
# mlflow-skinny in a venv (cached) for the MLflow endpoint's tests' real client.
scripts/mlflow-venv.sh
cleanup() { if [ "$STARTED_DOCKERD" = 1 ]; then echo "==> stopping the dockerd we started"; { [ -n "${DOCKERD_PID:-}" ] && kill -TERM "$DOCKERD_PID"; } || true; fi; }
trap cleanup EXIT

# The MCP Python SDK for tests/mcp.rs (made once per machine, outside the checkout).
echo "==> MCP Python SDK: $(scripts/mcp-venv.sh)"

echo "==> UI: npm ci, type check, build, unit tests"
npm --prefix ui ci --no-audit --no-fund
npm --prefix ui run build
npm --prefix ui test

echo "==> Rust: clippy, every target, warnings are errors (a lint is allowed only where the code says why)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> Rust: unit and integration tests (real Docker, simulated GPUs)"
cargo test --workspace --locked

echo "==> The installed package: .deb, the service's ExecStart, real users, an upgrade while a job runs"
cargo build --workspace --all-targets --locked   # the binaries the tests used (same features: no rebuild)
scripts/test-installed.sh

echo "==> End to end: the real app under Xvfb through tauri-driver"
scripts/e2e.sh
