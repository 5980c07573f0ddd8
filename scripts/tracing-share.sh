#!/usr/bin/env bash
# What tracing costs the whole stack, read from inside each run so the machine's drift cannot move
# it: node.invoke in a closed loop (64 in flight, 8 operators, 8 simulated devices, every service in
# one process), one process under a CPU profile for each of
#
#   none      no tracer provider in the services (their no-op default): the baseline
#   off       tracing off: the SDK's provider sampling nothing (every call still gets a trace id)
#   sampled10 a tenth of the invokes sampled (parentbased_traceidratio 0.1, the Helm default) into
#             the batch span processor and an exporter that drops them (SAMPLED10=exported10: over
#             OTLP/HTTP like sampled)
#   sampled   every invoke sampled and exported over OTLP/HTTP by the official exporter (to a
#             receiver in the same process that discards what it gets)
#
# Of each profile:
#
#   direct  the share of CPU samples in tracing code: the OpenTelemetry SDK, API and exporters
#           (protobuf encoding, the HTTP client's connection), the span and propagation helpers of
#           pkg/telemetry, and nats-server's look for trace headers (which it does for every
#           message with headers, so the baseline has some too); samples collecting garbage are
#           left to the next line
#   gc      the share of CPU collecting garbage, times the share of the bytes allocated per invoke
#           that the mode adds to the baseline (collection work grows with the allocation rate)
#
# A mode's cost = its direct minus the baseline's + its gc. The loop is CPU-bound, so throughput
# falls by that share of the CPU. Not counted: the receiver's work (a trace backend's) and
# headers that a traceparent makes longer but that travel anyway.
# Budgets: off within 2 %, sampled10 within 3 %; 100 % sampling is reported.
#
#   scripts/tracing-share.sh                 ROUNDS=5 INVOKES=30000 by default
#   SAMPLED=sampled scripts/tracing-share.sh spans into an exporter that drops them (no OTLP)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-5}
INVOKES=${INVOKES:-30000}
GO=${GO:-go}
SAMPLED=${SAMPLED:-exported}
SAMPLED10=${SAMPLED10:-sampled10}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/xc-tracing-share.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

GC_RE='^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge)$'
TRACING_RE='^go\.opentelemetry\.io/|^google\.golang\.org/protobuf/|^github\.com/xiaoclaw/xiaoclaw/pkg/telemetry\.(Start|\(\*Span\)|Inject|Extract|ContextWithTraceparent|traceparentCarrier|TraceIDs|HeaderCarrier|SubjectTemplate)|^net/http\.\(\*persistConn\)|^github\.com/nats-io/nats-server/v2/server\.genHeaderMapIfTraceHeadersPresent$'

echo "tracing-share: building the devstack benchmarks" >&2
(cd "$ROOT/cmd/xiaoclaw" && "$GO" test -c -o "$OUT/devstack.test" ./internal/devstack/)

# percent BINARY PROFILE PPROF-ARGS...: the share of the profile's CPU samples the filter keeps, in percent.
percent() {
	local bin=$1 prof=$2
	shift 2
	"$GO" tool pprof -top -nodefraction=0 -edgefraction=0 -nodecount=1000000 "$@" "$bin" "$prof" 2>/dev/null |
		awk '/^Showing nodes accounting for/ {gsub(/[,%]/, "", $6); print $6; found = 1} END {if (!found) print 0}'
}

# run MODE: one process under a CPU profile; prints "bytes/invoke tracing% gc%".
run() {
	local bin="$OUT/devstack.test" mode=$1 prof="$OUT/$1.prof" line bytes
	line=$("$bin" -test.run '^$' -test.bench "^BenchmarkInvokeTracingMode\$/^$mode\$" \
		-test.benchtime "${INVOKES}x" -test.benchmem -test.count 1 -test.cpuprofile "$prof" 2>/dev/null |
		grep -E 'invokes/s' || true)
	if [[ -z $line ]]; then
		echo "tracing-share: $mode produced no result" >&2
		exit 1
	fi
	bytes=$(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "B/op") print $i}' <<<"$line")
	echo "$bytes $(percent "$bin" "$prof" -focus="$TRACING_RE" -ignore="$GC_RE") $(percent "$bin" "$prof" -focus="$GC_RE")"
}

# cost BASE-BYTES BASE-DIRECT BYTES DIRECT GC: a mode's share of the CPU against the baseline.
cost() {
	awk -v ob="$1" -v od="$2" -v b="$3" -v d="$4" -v g="$5" 'BEGIN {printf "%.2f", d - od + g * (b - ob) / b}'
}

printf '%-6s %10s %10s %10s %10s %10s %10s %10s\n' round none-B/inv off-B/inv s10-B/inv smpl-B/inv off-% s10-% sampled-%
for ((r = 1; r <= ROUNDS; r++)); do
	read -r n_bytes n_direct _ < <(run none)
	read -r o_bytes o_direct o_gc < <(run off)
	read -r t_bytes t_direct t_gc < <(run "$SAMPLED10")
	read -r s_bytes s_direct s_gc < <(run "$SAMPLED")
	printf '%-6d %10d %10d %10d %10d %10s %10s %10s\n' "$r" "$n_bytes" "$o_bytes" "$t_bytes" "$s_bytes" \
		"$(cost "$n_bytes" "$n_direct" "$o_bytes" "$o_direct" "$o_gc")" \
		"$(cost "$n_bytes" "$n_direct" "$t_bytes" "$t_direct" "$t_gc")" \
		"$(cost "$n_bytes" "$n_direct" "$s_bytes" "$s_direct" "$s_gc")" | tee -a "$OUT/results"
done

# summary COLUMN WHAT
summary() {
	sort -g -k"$1" "$OUT/results" | awk -v c="$1" -v n="$ROUNDS" -v what="$2" '{v[NR] = $c} END {
		printf "%s takes %.2f %% of the CPU against no tracer provider (median of %d rounds, %.2f to %.2f)\n", what, v[int((n + 1) / 2)], n, v[1], v[n]
	}'
}
echo
summary 6 "tracing off"
summary 7 "tracing at 10% sampling ($SAMPLED10)"
summary 8 "tracing at 100% sampling ($SAMPLED)"
