#!/usr/bin/env bash
# Builds the chart-check tools into the git-ignored .tools/ directory:
#   .tools/bin/helm          helm (go install, pinned)
#   .tools/bin/kubeconform   kubeconform (go install, pinned)
#   .tools/schemas/v<K8S>-standalone-strict/*.json
#                            strict Kubernetes JSON schemas generated offline from the
#                            swagger.json shipped in the k8s.io/kubernetes module
# Each tool lands in a directory named after its version and .tools/bin links to it, so a
# second run is a no-op and a version bump rebuilds only what changed.
#
# Usage: deploy/scripts/helm-tools.sh [helm|kubeconform|schemas]...   (default: all)
set -euo pipefail

HELM_MODULE=${HELM_MODULE:-helm.sh/helm/v4}
HELM_VERSION=${HELM_VERSION:-v4.3.1}
KUBECONFORM_VERSION=${KUBECONFORM_VERSION:-v0.8.0}
K8S_VERSION=${K8S_VERSION:-1.36.3}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS=${XIAOCLAW_TOOLS_DIR:-$ROOT/.tools}
GO=${GO:-go}
mkdir -p "$TOOLS/bin"

log() { printf 'helm-tools: %s\n' "$*" >&2; }

# install_go_tool NAME PACKAGE VERSION: go install into .tools/NAME@VERSION, link .tools/bin/NAME.
install_go_tool() {
	local name=$1 pkg=$2 version=$3
	local dir="$TOOLS/$name@$version"
	if [[ ! -x "$dir/$name" ]]; then
		log "building $name $version (go install $pkg@$version)"
		local start=$SECONDS
		mkdir -p "$dir"
		# GOWORK=off: tools are built from their own modules, never from the workspace.
		GOWORK=off GOBIN="$dir" CGO_ENABLED=0 "$GO" install -trimpath -ldflags='-s -w' "$pkg@$version"
		log "built $name $version in $((SECONDS - start))s"
	else
		log "$name $version already built"
	fi
	ln -sfn "../$name@$version/$name" "$TOOLS/bin/$name"
}

build_schemas() {
	local out="$TOOLS/schemas/v$K8S_VERSION-standalone-strict"
	if [[ -f "$out/.complete" ]]; then
		log "schemas for Kubernetes $K8S_VERSION already generated"
		return
	fi
	log "generating strict schemas for Kubernetes $K8S_VERSION"
	local moddir
	moddir=$(cd "$TOOLS" && GOWORK=off GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z "$moddir" || ! -f "$moddir/api/openapi-spec/swagger.json" ]]; then
		log "k8s.io/kubernetes@v$K8S_VERSION has no api/openapi-spec/swagger.json (download failed?)"
		exit 1
	fi
	rm -rf "$out.tmp"
	(cd "$ROOT/deploy/helmtest" && GOWORK=off "$GO" run ./cmd/k8sschema \
		-in "$moddir/api/openapi-spec/swagger.json" -out "$out.tmp")
	touch "$out.tmp/.complete"
	rm -rf "$out"
	mv "$out.tmp" "$out"
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(kubeconform schemas helm)
for t in "${targets[@]}"; do
	case $t in
	helm) install_go_tool helm "$HELM_MODULE/cmd/helm" "$HELM_VERSION" ;;
	kubeconform) install_go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" ;;
	schemas) build_schemas ;;
	*)
		log "unknown target $t (want helm, kubeconform or schemas)"
		exit 2
		;;
	esac
done
log "tools in $TOOLS/bin; schemas in $TOOLS/schemas"
