#!/usr/bin/env bash
# Run the built image once: `shoal --version`, then a master and a worker inside one
# container and the worker's health check (the same probe as the chart's readiness
# probe: the /health endpoint named by the worker's --url-file).
# Usage: deploy/image/smoke.sh [IMAGE]
set -euo pipefail
image=${1:-localhost/shoal:0.1.0}
# `buildah run` with chroot isolation, as the build's RUN steps: it works as root inside
# a container, where `podman run` cannot set the container's rlimits (crun: setrlimit
# RLIMIT_NPROC: operation not permitted); elsewhere `podman run IMAGE CMD` does the same
B=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")
ctr=$("${B[@]}" from --pull-never "$image")
trap '"${B[@]}" rm "$ctr" >/dev/null' EXIT
run=("${B[@]}" run --isolation chroot "$ctr" --)

"${run[@]}" shoal --version
"${run[@]}" id
"${run[@]}" sh -ec '
  shoal master --port 0 --state-dir /tmp/master --url-file /tmp/master.url &
  for i in $(seq 100); do [ -s /tmp/master.url ] && break; sleep 0.1; done
  shoal worker --master "$(cat /tmp/master.url)" --port 0 --dir /tmp/worker \
    --tier mem:/tmp/mem:64MiB --url-file /tmp/worker.json &
  for i in $(seq 100); do [ -s /tmp/worker.json ] && break; sleep 0.1; done
  python3 -c "import json, urllib.request; a = json.load(open(\"/tmp/worker.json\")); print(urllib.request.urlopen(\"http://127.0.0.1:%d/health\" % a[\"metrics_port\"], timeout=3).read().decode())"
  shoal report --master "$(cat /tmp/master.url)" --plain | head -5
'
