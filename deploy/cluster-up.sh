#!/usr/bin/env bash
# Creates (or reuses) the k3d cluster for ckptflow and installs everything into it:
#   Argo Workflows v4.1.2 from its pinned release manifest (namespace argo), the Argo Server
#   on plain HTTP with server auth (development only), Argo Events v1.9.11 from its pinned
#   release manifest (namespace argo-events), and deploy/k8s: MinIO with its buckets, MLflow,
#   the workflow service account and RBAC, the S3 Secret, the controller config, the EventBus,
#   the Sensor's service account and RBAC and the submitter Role.
# Then it imports the step image and waits until every part is ready.
#
#   deploy/cluster-up.sh            (or: make cluster, which builds the image first)
# Environment: CLUSTER (default ckptflow), IMAGE (default ckptflow-steps:0.1.0, platform.image).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-ckptflow}
IMAGE=${IMAGE:-ckptflow-steps:0.1.0}
ARGO_VERSION=v4.1.2
ARGO_MANIFEST=https://github.com/argoproj/argo-workflows/releases/download/${ARGO_VERSION}/install.yaml
ARGO_EVENTS_VERSION=v1.9.11
ARGO_EVENTS_MANIFEST=https://github.com/argoproj/argo-events/releases/download/${ARGO_EVENTS_VERSION}/install.yaml
CONTEXT=k3d-${CLUSTER}

need() {
  command -v "$1" > /dev/null || { echo "cluster-up: '$1' is not on PATH; $2" >&2; exit 1; }
}
need docker "install Docker (https://docs.docker.com/get-docker/)"
need k3d "install k3d v5.8.3 (https://k3d.io/#installation)"
need kubectl "install kubectl, or run 'make test' once: .venv/bin has one"
need curl "install curl"

kc() { kubectl --context "$CONTEXT" "$@"; }
step() { printf '\n== %s\n' "$*"; }

if ! docker image inspect "$IMAGE" > /dev/null 2>&1; then
  echo "cluster-up: image $IMAGE not found; build it first: make image" >&2
  exit 1
fi

step "k3d cluster $CLUSTER"
if k3d cluster get "$CLUSTER" > /dev/null 2>&1; then
  echo "reusing the existing cluster $CLUSTER"
  k3d cluster start "$CLUSTER"
else
  k3d cluster create "$CLUSTER" --config deploy/k3d/cluster.yaml
fi

step "import $IMAGE"
k3d image import "$IMAGE" --cluster "$CLUSTER"

step "Argo Workflows $ARGO_VERSION"
kc create namespace argo --dry-run=client -o yaml | kc apply -f -
# v4 ships full CRDs, too large for client-side apply: server-side apply is required. Separate
# field managers keep a re-run of this apply from removing the settings deploy/k8s adds to
# the controller ConfigMap.
kc apply --namespace argo --server-side --force-conflicts --field-manager=argo-install \
  -f "$ARGO_MANIFEST"
kc -n argo patch deployment argo-server --type json --patch-file deploy/k3d/argo-server-patch.json
kc -n argo patch service argo-server --patch-file deploy/k3d/argo-server-service-patch.yaml

step "Argo Events $ARGO_EVENTS_VERSION"
# before deploy/k8s: its EventBus needs the CRD this manifest installs
kc create namespace argo-events --dry-run=client -o yaml | kc apply -f -
kc apply --namespace argo-events --server-side --force-conflicts --field-manager=argo-events-install \
  -f "$ARGO_EVENTS_MANIFEST"
kc wait --for=condition=established --timeout=120s crd/eventbus.argoproj.io

step "ckptflow resources (deploy/k8s)"
kc apply --server-side --force-conflicts --field-manager=ckptflow -k deploy/k8s

step "waiting for readiness"
kc -n argo rollout status deployment/workflow-controller --timeout=300s
kc -n argo rollout status deployment/argo-server --timeout=300s
kc -n argo-events rollout status deployment/controller-manager --timeout=300s
# the EventBus is ready once its JetStream StatefulSet is (status condition Deployed)
kc -n ckptflow wait --for=condition=Deployed eventbus/default --timeout=300s
kc -n ckptflow rollout status deployment/minio --timeout=300s
kc -n ckptflow wait --for=condition=complete job/minio-buckets --timeout=300s
kc -n ckptflow rollout status deployment/mlflow --timeout=600s

step "MLflow experiment ckptflow"
# The Argo UI's "MLflow run" link names the experiment by id: create the experiment the
# workflows log to, and point the link at its id.
MLFLOW=http://localhost:5050
for _ in $(seq 60); do curl -fsS -o /dev/null "$MLFLOW/health" && break; sleep 2; done
curl -sS -o /dev/null -X POST "$MLFLOW/api/2.0/mlflow/experiments/create" \
  -H 'Content-Type: application/json' -d '{"name": "ckptflow"}' || true  # exists: fine
EXP_ID=$(curl -fsS "$MLFLOW/api/2.0/mlflow/experiments/get-by-name?experiment_name=ckptflow" \
  | tr -d '\n' | sed -E 's/.*"experiment_id": *"([0-9]+)".*/\1/')
echo "experiment ckptflow has id $EXP_ID"
kubectl kustomize deploy/k8s \
  | sed -E "s#/experiments/[0-9]+\?workflowType=machine_learning&searchFilter#/experiments/${EXP_ID}?workflowType=machine_learning\&searchFilter#" \
  | kc apply --server-side --force-conflicts --field-manager=ckptflow -f -

cat <<DONE

ckptflow cluster '$CLUSTER' is ready (kubectl context $CONTEXT).
  Argo UI      http://localhost:2746
  MLflow UI    http://localhost:5050
  MinIO API    http://localhost:9090   console http://localhost:9091 (minioadmin / minioadmin, development only)
Submit the pipeline:
  .venv/bin/ckptflow submit pipeline --wait --namespace ckptflow --host http://localhost:2746
DONE
