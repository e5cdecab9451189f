#!/usr/bin/env bash
# Fuzz the job spec parser for a fixed time (default 60 s): generated, mutated and random YAML/TOML
# specs into spec::validate_text, parse_template and expand; fails on a panic, a stack overflow, a
# slow input or a broken invariant. Not part of CI. Findings go to target/fuzz-spec/.
# Usage: scripts/fuzz-spec.sh [SECONDS] [SEED]   (the seed is printed; pass it to replay a run)
set -euo pipefail
cd "$(dirname "$0")/.."
# Optimized, but with overflow checks and debug assertions in gantry-core: an arithmetic overflow in
# the parser is a crash, not a silent wrap.
exec cargo --config 'profile.bench.package.gantry-core.overflow-checks=true' \
  --config 'profile.bench.package.gantry-core.debug-assertions=true' \
  bench --locked -p gantry-core --bench fuzz_spec -- "${1:-60}" ${2:+"$2"}
