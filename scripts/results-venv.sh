#!/usr/bin/env bash
# The real metric clients the results tests drive from an image-less job (tests/results.rs):
# tensorboardX (a SummaryWriter, as PyTorch's) in a venv every test user may read. Cached: made
# once, then reused. GANTRY_TEST_RESULTS_VENV moves it.
set -euo pipefail
VENV=${GANTRY_TEST_RESULTS_VENV:-/var/cache/gantry-test/results-venv}
if grep -qx "home = /usr/bin" "$VENV/pyvenv.cfg" 2>/dev/null && "$VENV/bin/python" -c "import tensorboardX" 2>/dev/null; then exit 0; fi
echo "==> results venv: tensorboardX into $VENV"
mkdir -p "$(dirname "$VENV")"
chmod a+rx "$(dirname "$VENV")"
# The system's Python (a per-user one, e.g. pyenv under /root, is not every user's).
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "tensorboardX==2.6.5"
chmod -R a+rX "$VENV"
