#!/usr/bin/env bash
# Builds the container images: gateway, shim, devicehub and xiaoclaw (CLI, migrations, dev).
# The build context is the files git knows about (tracked, plus untracked ones that are not
# ignored), so .tools/, .tmp/ and bin/ never reach the daemon.
#
# Environment:
#   REGISTRY  image name prefix             (default ghcr.io/xiaoclaw)
#   VERSION   tag and main.version          (default: git describe, else dev)
#   IMAGES    which images                  (default "gateway shim devicehub xiaoclaw")
#   PUSH=1    push after building
#   DOCKER    the docker CLI                (default docker)
# Without a reachable docker engine it prints the commands it would run and exits 0.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
REGISTRY=${REGISTRY:-ghcr.io/xiaoclaw}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGES=${IMAGES:-gateway shim devicehub xiaoclaw}
DOCKER=${DOCKER:-docker}

dockerfile_of() {
	case $1 in
	gateway | shim | devicehub) echo "services/$1/Dockerfile" ;;
	xiaoclaw) echo "cmd/xiaoclaw/Dockerfile" ;;
	*)
		echo "images: unknown image $1 (want gateway, shim, devicehub or xiaoclaw)" >&2
		exit 2
		;;
	esac
}

# The build context: every file git tracks or could track (deleted ones are skipped).
CONTEXT="git ls-files -z --cached --others --exclude-standard | tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null"

have_engine=1
if ! command -v "$DOCKER" >/dev/null 2>&1 || ! "$DOCKER" info >/dev/null 2>&1; then
	have_engine=0
	echo "images: no docker engine reachable ($DOCKER info failed); printing the commands instead of running them" >&2
fi

for name in $IMAGES; do
	df=$(dockerfile_of "$name")
	tag="$REGISTRY/$name:$VERSION"
	cmd=("$DOCKER" build -f "$df" --build-arg "VERSION=$VERSION" -t "$tag" -)
	if [[ $have_engine == 0 ]]; then
		echo "$CONTEXT | ${cmd[*]}"
		[[ ${PUSH:-0} == 1 ]] && echo "$DOCKER push $tag"
		continue
	fi
	echo "images: building $tag from $df" >&2
	start=$SECONDS
	bash -o pipefail -c "$CONTEXT" | DOCKER_BUILDKIT=1 "${cmd[@]}"
	echo "images: built $tag in $((SECONDS - start))s" >&2
	if [[ ${PUSH:-0} == 1 ]]; then
		"$DOCKER" push "$tag"
	fi
done
if [[ $have_engine == 0 ]]; then
	echo "images: nothing was built (no docker engine); the Dockerfiles are checked by 'make helm-test' (deploy/helmtest)" >&2
fi
