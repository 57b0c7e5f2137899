#!/usr/bin/env bash
# Deletes the k3d cluster made by deploy/cluster-up.sh, with everything in it (MinIO data too).
set -euo pipefail
CLUSTER=${CLUSTER:-ckptflow}
command -v k3d > /dev/null || { echo "cluster-down: 'k3d' is not on PATH" >&2; exit 1; }
if k3d cluster get "$CLUSTER" > /dev/null 2>&1; then
  k3d cluster delete "$CLUSTER"
else
  echo "cluster-down: no k3d cluster named $CLUSTER"
fi
