#!/usr/bin/env bash
# Optional: installs Kueue v0.19.2 (pinned release manifest) on the ckptflow k3d cluster and the
# queues of deploy/gang/kueue/queues.yaml, for `--set platform.gang_scheduler=kueue`.
# Run after deploy/cluster-up.sh:
#
#   deploy/gang/kueue/install.sh
#
# The release's own configuration (kueue-manager-config) enables the `pod` integration that
# plain-pod groups need, and its default managedJobsNamespaceSelector leaves kube-system and
# kueue-system alone. Environment: CLUSTER (default ckptflow).
set -euo pipefail
cd "$(dirname "$0")/../../.."

CLUSTER=${CLUSTER:-ckptflow}
CONTEXT=k3d-${CLUSTER}
KUEUE_VERSION=v0.19.2
KUEUE_MANIFEST=https://github.com/kubernetes-sigs/kueue/releases/download/${KUEUE_VERSION}/manifests.yaml

command -v kubectl > /dev/null || { echo "kueue install: kubectl is not on PATH" >&2; exit 1; }
kc() { kubectl --context "$CONTEXT" "$@"; }

echo "== Kueue $KUEUE_VERSION"
# Kueue's CRDs are too large for client-side apply (its installation guide uses server-side)
kc apply --server-side --force-conflicts --field-manager=kueue-install -f "$KUEUE_MANIFEST"
kc -n kueue-system wait deploy/kueue-controller-manager --for=condition=available --timeout=300s

echo "== queues (deploy/gang/kueue/queues.yaml)"
# the queues go through Kueue's webhook, which answers a little after the Deployment is up
for attempt in $(seq 30); do
  if kc apply --server-side --field-manager=ckptflow -f deploy/gang/kueue/queues.yaml; then
    break
  fi
  [ "$attempt" = 30 ] && { echo "kueue install: the webhook never accepted the queues" >&2; exit 1; }
  sleep 2
done
kc wait clusterqueue/ckptflow --for=condition=Active --timeout=120s
kc -n ckptflow wait localqueue/ckptflow --for=condition=Active --timeout=120s

cat <<DONE

Kueue $KUEUE_VERSION is ready: ClusterQueue ckptflow and LocalQueue ckptflow/ckptflow are Active.
Render and submit with gang-scheduled ranks:
  .venv/bin/ckptflow submit pipeline --set platform.gang_scheduler=kueue --wait \\
    --namespace ckptflow --host http://localhost:2746
DONE
