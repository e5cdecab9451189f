#!/usr/bin/env bash
# The official MCP Python SDK (`mcp<2`) in a venv, for tests/mcp.rs (an agent's session with
# `gantry mcp`, as real users): made once, kept while it imports. Prints its python.
# The venv lives outside the checkout (default /var/cache/gantry-test/mcp-venv, or $GANTRY_MCP_VENV)
# so the tests' users can run it, and across runs of the tests on one machine.
set -euo pipefail
venv="${GANTRY_MCP_VENV:-/var/cache/gantry-test/mcp-venv}"
if ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
  # Debian's python3 needs python3-venv for `-m venv` (scripts/test.sh installs it).
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  # The system's python (not a per-user one, e.g. root's pyenv): the tests' users run this venv.
  py=/usr/bin/python3
  [ -x "$py" ] || py="$(command -v python3)"
  "$py" -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp<2" >&2
fi
chmod -R a+rX "$venv"
echo "$venv/bin/python"
