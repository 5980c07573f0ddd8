#!/usr/bin/env bash
# What tracing costs the whole stack against a build without it, read from inside each run so the
# machine's drift cannot move it: node.invoke in a closed loop (64 in flight, 8 operators, 8
# simulated devices, every service in one process), one process under a CPU profile for each of
#
#   omitted  a build with -tags xc_omit_tracing: span helpers and trace propagation compiled out
#   off      the normal build with tracing off
#   sampled  the normal build with every invoke sampled and exported over OTLP/HTTP (to a receiver
#            in the same process that discards what it gets)
#
# Of each profile:
#
#   direct  the share of CPU samples in tracing code: the OpenTelemetry SDK and API, the span and
#           propagation helpers of pkg/telemetry, its batch processor and OTLP exporter (encoding,
#           compression, the HTTP client's connection), and nats-server's look for trace headers
#           (which it does for every message with headers, so the omitted build has some too);
#           samples collecting garbage are left to the next line
#   gc      the share of CPU collecting garbage, times the share of the bytes allocated per invoke
#           that the mode adds to the omitted build (collection work grows with the allocation rate)
#
# A mode's cost = its direct minus the omitted build's + its gc. The loop is CPU-bound, so
# throughput falls by that share of the CPU. Not counted: the receiver's work (a trace backend's),
# headers that a traceparent makes longer but that travel anyway, and the trace ids in audit rows.
# performance.md goal 8: sampled within 5 %, off within 2 %.
#
#   scripts/tracing-share.sh                 ROUNDS=5 INVOKES=30000 by default
#   SAMPLED=sampled scripts/tracing-share.sh spans into an exporter that drops them (no OTLP)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-5}
INVOKES=${INVOKES:-30000}
GO=${GO:-go}
SAMPLED=${SAMPLED:-exported}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/xc-tracing-share.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

GC_RE='^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge)$'
TRACING_RE='^go\.opentelemetry\.io/otel|^github\.com/xiaoclaw/xiaoclaw/pkg/telemetry\.(Start|\(\*Span\)|\(\*BatchProcessor\)|Inject|Extract|ContextWithTraceparent|FormatTraceparent|ParseTraceparent|TraceIDs|HeaderCarrier|SubjectTemplate)|^github\.com/xiaoclaw/xiaoclaw/pkg/telemetry/otlphttp\.|^net/http\.\(\*persistConn\)|^github\.com/nats-io/nats-server/v2/server\.genHeaderMapIfTraceHeadersPresent$'

echo "tracing-share: building the devstack benchmarks twice (normal, -tags xc_omit_tracing)" >&2
(cd "$ROOT/cmd/xiaoclaw" && "$GO" test -c -o "$OUT/normal.test" ./internal/devstack/)
(cd "$ROOT/cmd/xiaoclaw" && "$GO" test -c -tags xc_omit_tracing -o "$OUT/omitted.test" ./internal/devstack/)

# percent BINARY PROFILE PPROF-ARGS...: the share of the profile's CPU samples the filter keeps, in percent.
percent() {
	local bin=$1 prof=$2
	shift 2
	"$GO" tool pprof -top -nodefraction=0 -edgefraction=0 -nodecount=1000000 "$@" "$bin" "$prof" 2>/dev/null |
		awk '/^Showing nodes accounting for/ {gsub(/[,%]/, "", $6); print $6; found = 1} END {if (!found) print 0}'
}

# run BINARY MODE: one process under a CPU profile; prints "bytes/invoke tracing% gc%".
run() {
	local bin="$OUT/$1.test" mode=$2 prof="$OUT/$1-$2.prof" line bytes
	line=$("$bin" -test.run '^$' -test.bench "^BenchmarkInvokeTracingMode\$/^$mode\$" \
		-test.benchtime "${INVOKES}x" -test.benchmem -test.count 1 -test.cpuprofile "$prof" 2>&1 |
		grep -E '^BenchmarkInvokeTracingMode/' || true)
	if [[ -z $line ]]; then
		echo "tracing-share: $1 $mode produced no result" >&2
		exit 1
	fi
	bytes=$(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "B/op") print $i}' <<<"$line")
	echo "$bytes $(percent "$bin" "$prof" -focus="$TRACING_RE" -ignore="$GC_RE") $(percent "$bin" "$prof" -focus="$GC_RE")"
}

# cost OMITTED-BYTES OMITTED-DIRECT BYTES DIRECT GC: a mode's share of the CPU against the omitted build.
cost() {
	awk -v ob="$1" -v od="$2" -v b="$3" -v d="$4" -v g="$5" 'BEGIN {printf "%.2f", d - od + g * (b - ob) / b}'
}

printf '%-6s %10s %10s %10s %10s %10s\n' round omit-B/inv off-B/inv smpl-B/inv off-% sampled-%
for ((r = 1; r <= ROUNDS; r++)); do
	read -r n_bytes n_direct _ < <(run omitted off)
	read -r o_bytes o_direct o_gc < <(run normal off)
	read -r s_bytes s_direct s_gc < <(run normal "$SAMPLED")
	printf '%-6d %10d %10d %10d %10s %10s\n' "$r" "$n_bytes" "$o_bytes" "$s_bytes" \
		"$(cost "$n_bytes" "$n_direct" "$o_bytes" "$o_direct" "$o_gc")" \
		"$(cost "$n_bytes" "$n_direct" "$s_bytes" "$s_direct" "$s_gc")" | tee -a "$OUT/results"
done

# summary COLUMN WHAT
summary() {
	sort -g -k"$1" "$OUT/results" | awk -v c="$1" -v n="$ROUNDS" -v what="$2" '{v[NR] = $c} END {
		printf "%s takes %.2f %% of the CPU against a build without tracing (median of %d rounds, %.2f to %.2f)\n", what, v[int((n + 1) / 2)], n, v[1], v[n]
	}'
}
echo
summary 5 "tracing off"
summary 6 "tracing at 100% sampling"
