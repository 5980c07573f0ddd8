#!/usr/bin/env bash
# Local Jaeger (v2, in-memory storage) for looking at xiaoclaw traces.
#
#   scripts/jaeger.sh build          build .tools/bin/jaeger once per version (about 5 min cold)
#   scripts/jaeger.sh start          start it on loopback, wait until OTLP and the query API answer
#   scripts/jaeger.sh stop           stop the instance recorded in the PID file
#   scripts/jaeger.sh status         say whether it runs
#   scripts/jaeger.sh query TRACE_ID print the trace as JSON from the query API
#   scripts/jaeger.sh recent [SVC]   list the newest trace ids of a service (default xiaoclaw-gateway)
#   scripts/jaeger.sh env            print the OTEL_* exports that point a service at it
#   scripts/jaeger.sh path           print the binary's path (builds it first when missing)
#
# Only the module github.com/jaegertracing/jaeger v1.62.0 (Jaeger v2.0.0-rc2) builds from the
# filtered module mirror; its web UI is a placeholder page, while OTLP (4317 gRPC, 4318 HTTP) and
# the query API (/api/services, /api/traces/<id> on 16686) work. The official Jaeger image has the
# full UI.
#
# Environment: JAEGER_VERSION (module version, default v1.62.0), JAEGER_STATE_DIR (config, log,
# PID file; default .tmp/jaeger), JAEGER_OTLP_GRPC_PORT (4317), JAEGER_OTLP_HTTP_PORT (4318),
# JAEGER_QUERY_PORT (16686), JAEGER_QUERY_GRPC_PORT (16685).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${JAEGER_VERSION:-v1.62.0}
TOOLS=$ROOT/.tools
BUILD_DIR=$TOOLS/jaeger
BIN_DIR=$TOOLS/jaeger@$VERSION
BIN=$TOOLS/bin/jaeger
STATE=${JAEGER_STATE_DIR:-$ROOT/.tmp/jaeger}
GRPC_PORT=${JAEGER_OTLP_GRPC_PORT:-4317}
HTTP_PORT=${JAEGER_OTLP_HTTP_PORT:-4318}
QUERY_PORT=${JAEGER_QUERY_PORT:-16686}
QUERY_GRPC_PORT=${JAEGER_QUERY_GRPC_PORT:-16685}
PIDFILE=$STATE/jaeger.pid
GO=${GO:-go}

die() { echo "jaeger.sh: $*" >&2; exit 1; }

build() {
	if [[ -x $BIN_DIR/jaeger ]]; then
		ln -sfn "../jaeger@$VERSION/jaeger" "$BIN"
		return 0
	fi
	mkdir -p "$BUILD_DIR" "$BIN_DIR" "$TOOLS/bin"
	# A tools module of our own: jaeger's go.mod carries a replace directive, so `go install` refuses it.
	cat >"$BUILD_DIR/go.mod" <<EOF
module local/jaegertool

go 1.26

require github.com/jaegertracing/jaeger $VERSION

replace github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0
EOF
	printf '//go:build tools\n\n// Package tools pins the Jaeger binary built by scripts/jaeger.sh.\npackage tools\n\nimport _ "github.com/jaegertracing/jaeger/cmd/jaeger"\n' >"$BUILD_DIR/tools.go"
	echo "jaeger.sh: building Jaeger $VERSION (about 5 minutes the first time)" >&2
	# -e: some test-only dependencies of Jaeger are missing from the filtered mirror.
	(cd "$BUILD_DIR" && GOWORK=off "$GO" mod tidy -e >"$BUILD_DIR/tidy.log" 2>&1) || { tail -20 "$BUILD_DIR/tidy.log" >&2; die "go mod tidy failed"; }
	(cd "$BUILD_DIR" && GOWORK=off "$GO" build -trimpath -ldflags '-s -w' -o "$BIN_DIR/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
	mv "$BIN_DIR/jaeger.tmp" "$BIN_DIR/jaeger"
	ln -sfn "../jaeger@$VERSION/jaeger" "$BIN"
	echo "jaeger.sh: built $BIN" >&2
}

running_pid() {
	[[ -f $PIDFILE ]] || return 1
	local pid
	pid=$(<"$PIDFILE")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_config() {
	cat >"$STATE/jaeger.yaml" <<EOF
# Written by scripts/jaeger.sh: everything on loopback, traces in memory.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces: {receivers: [otlp], processors: [batch], exporters: [jaeger_storage_exporter]}
  telemetry: {metrics: {level: none}}
extensions:
  jaeger_query:
    storage: {traces: mem}
    http: {endpoint: 127.0.0.1:$QUERY_PORT}
    grpc: {endpoint: 127.0.0.1:$QUERY_GRPC_PORT}
  jaeger_storage:
    backends: {mem: {memory: {max_traces: 100000}}}
receivers:
  otlp:
    protocols:
      grpc: {endpoint: 127.0.0.1:$GRPC_PORT}
      http: {endpoint: 127.0.0.1:$HTTP_PORT}
processors: {batch: {timeout: 200ms}}
exporters: {jaeger_storage_exporter: {trace_storage: mem}}
EOF
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
	if pid=$(running_pid); then
		echo "jaeger.sh: already running (pid $pid), UI/API http://127.0.0.1:$QUERY_PORT"
		return 0
	fi
	[[ -x $BIN ]] || build
	mkdir -p "$STATE"
	write_config
	for p in "$GRPC_PORT" "$HTTP_PORT" "$QUERY_PORT" "$QUERY_GRPC_PORT"; do
		! port_open "$p" || die "port 127.0.0.1:$p is already in use (set JAEGER_*_PORT)"
	done
	# Jaeger traces its own queries to OTLP localhost:4317 and, at exit, waits for that export to
	# give up; sampling nothing leaves it nothing to send. env -u: a shell set up for xiaoclaw
	# (scripts/jaeger.sh env) must not redirect Jaeger's own exporter.
	env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT -u OTEL_TRACES_EXPORTER \
		OTEL_TRACES_SAMPLER=always_off OTEL_EXPORTER_OTLP_TIMEOUT=500 \
		nohup "$BIN" --config="file:$STATE/jaeger.yaml" >"$STATE/jaeger.log" 2>&1 &
	echo $! >"$PIDFILE"
	local deadline=$((SECONDS + 30))
	until curl -fsS "http://127.0.0.1:$QUERY_PORT/api/services" >/dev/null 2>&1 &&
		port_open "$GRPC_PORT" && port_open "$HTTP_PORT"; do
		if ! running_pid >/dev/null; then
			tail -20 "$STATE/jaeger.log" >&2
			die "jaeger exited during start (log: $STATE/jaeger.log)"
		fi
		((SECONDS < deadline)) || die "jaeger not ready after 30 s (log: $STATE/jaeger.log)"
		sleep 0.2
	done
	echo "jaeger.sh: running (pid $(<"$PIDFILE")): OTLP grpc 127.0.0.1:$GRPC_PORT http 127.0.0.1:$HTTP_PORT, API http://127.0.0.1:$QUERY_PORT"
}

stop() {
	local pid
	if ! pid=$(running_pid); then
		rm -f "$PIDFILE"
		echo "jaeger.sh: not running"
		return 0
	fi
	kill "$pid"
	local deadline=$((SECONDS + 10))
	while kill -0 "$pid" 2>/dev/null; do
		((SECONDS < deadline)) || { kill -9 "$pid" 2>/dev/null || true; break; }
		sleep 0.1
	done
	rm -f "$PIDFILE"
	echo "jaeger.sh: stopped (pid $pid)"
}

query() {
	local id=${1:-}
	[[ $id =~ ^[0-9a-f]{32}$ ]] || die "query needs a trace id of 32 lowercase hex digits, got '${id}'"
	curl -fsS "http://127.0.0.1:$QUERY_PORT/api/traces/$id" || die "trace $id not found (is jaeger running? scripts/jaeger.sh status)"
	echo
}

case ${1:-} in
build) build ;;
start) start ;;
stop) stop ;;
status)
	if pid=$(running_pid); then echo "jaeger.sh: running (pid $pid)"; else echo "jaeger.sh: not running"; exit 1; fi
	;;
query) query "${2:-}" ;;
recent)
	# Each span repeats its trace id and a trace's spans are adjacent: uniq keeps one per trace.
	curl -fsS "http://127.0.0.1:$QUERY_PORT/api/traces?service=${2:-xiaoclaw-gateway}&limit=${3:-20}&lookback=1h" |
		grep -o '"traceID":"[0-9a-f]*"' | cut -d'"' -f4 | uniq
	;;
env)
	echo "export OTEL_TRACES_EXPORTER=otlp"
	echo "export OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
	echo "export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$GRPC_PORT"
	echo "export OTEL_TRACES_SAMPLER=always_on"
	echo "export OTEL_BSP_SCHEDULE_DELAY=500"
	;;
path)
	[[ -x $BIN ]] || build
	echo "$BIN"
	;;
*)
	sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
