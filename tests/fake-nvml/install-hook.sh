#!/usr/bin/env bash
# Install the fake nvidia-container-runtime-hook into /usr/local/bin, so that a dockerd started AFTER
# this runs containers that have a GPU DeviceRequest (CI without a GPU). dockerd looks the hook up only
# when it starts: a dockerd already running must be restarted to pick it up.
# Refuses on a machine with a real NVIDIA container toolkit or driver: the fake would hide its GPUs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest=/usr/local/bin/nvidia-container-runtime-hook
if [ -e "$dest" ] && cmp -s "$here/nvidia-container-runtime-hook" "$dest"; then
  exit 0
fi
if [ -e /dev/nvidiactl ] || { existing=$(command -v nvidia-container-runtime-hook) && ! grep -q "Test double of the NVIDIA" "$existing"; }; then
  echo "install-hook.sh: this machine has a real NVIDIA driver or container toolkit (${existing:-/dev/nvidiactl}); not installing the fake hook" >&2
  exit 0
fi
install -m 0755 "$here/nvidia-container-runtime-hook" "$dest"
echo "installed the fake $dest (for GPU DeviceRequests in CI; dockerd must be (re)started after this)"
