#!/usr/bin/env bash
# Chart and image checks: builds the tools when missing (deploy/scripts/helm-tools.sh), then
# runs the deploy/helmtest module: helm lint, helm template with the default, production and
# external-services values, kubeconform against strict Kubernetes schemas, the production
# assertions, and BuildKit's Dockerfile checks.
#
# The module is tested on its own (GOWORK=off): its dependencies (buildkit, k8s.io/api) stay
# out of the services' workspace build list.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$ROOT/deploy/scripts/helm-tools.sh"
cd "$ROOT/deploy/helmtest"
GOWORK=off exec "${GO:-go}" test -count=1 "$@" ./...
