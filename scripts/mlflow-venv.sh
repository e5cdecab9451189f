#!/usr/bin/env bash
# The real MLflow client the MLflow endpoint's tests drive from an image-less job
# (tests/results_mlflow.rs): mlflow-skinny, pinned, in a venv every test user may read. Cached: made
# once, then reused. GANTRY_TEST_MLFLOW_VENV moves it.
set -euo pipefail
VERSION=3.18.0
VENV=${GANTRY_TEST_MLFLOW_VENV:-/var/cache/gantry-test/mlflow-venv}
if grep -qx "home = /usr/bin" "$VENV/pyvenv.cfg" 2>/dev/null \
  && [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mlflow-skinny"))' 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
echo "==> mlflow venv: mlflow-skinny $VERSION into $VENV"
mkdir -p "$(dirname "$VENV")"
chmod a+rx "$(dirname "$VENV")"
# The system's Python (a per-user one, e.g. pyenv under /root, is not every user's).
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "mlflow-skinny==$VERSION"
chmod -R a+rX "$VENV"
