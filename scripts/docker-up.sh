#!/usr/bin/env bash
# Source this: starts dockerd if none answers, sets STARTED_DOCKERD=1 when it did, and builds the
# tiny test image (Debian's static busybox; no registry needed).
if ! docker info >/dev/null 2>&1; then
  echo "==> starting dockerd"
  (dockerd >/tmp/gantry-dockerd.log 2>&1 &)
  STARTED_DOCKERD=1
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  DOCKERD_PID=$(cat /var/run/docker.pid 2>/dev/null || true)  # stop exactly this one later, never by name
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/gantry-dockerd.log"; tail -20 /tmp/gantry-dockerd.log; exit 1; }
fi
if ! docker image inspect gantry-test/busybox:1 >/dev/null 2>&1; then
  echo "==> building test image gantry-test/busybox:1"
  r=$(mktemp -d); mkdir -p "$r/bin" "$r/tmp"; cp /bin/busybox "$r/bin/busybox"
  for c in sh echo env sleep cat id grep true false ls; do ln -s busybox "$r/bin/$c"; done
  tar -C "$r" -c . | docker import - gantry-test/busybox:1 >/dev/null; rm -rf "$r"
fi
