#!/usr/bin/env bash
# What tracing costs the whole stack: node.invoke throughput (64 in flight, 8 operators, 8 simulated
# devices, every service in one process) of
#
#   none      no tracer provider in the services (their no-op default): the baseline without tracing
#   off       tracing off as `xiaoclaw dev` and a service run without OTEL_* variables: the SDK's
#             provider sampling nothing, so every call still gets a trace id
#   sampled10 a tenth of the invokes sampled (parentbased_traceidratio 0.1, the Helm chart's default)
#             into the SDK's batch span processor and an exporter that drops them
#   sampled   every invoke sampled likewise
#   exported10, exported  (MODES="none off exported10 exported") like sampled10 and sampled, the
#             spans sent over OTLP/HTTP by the official exporter to a receiver in the process
#
# Each mode runs in a process of its own, in turns (the order rotates every round), so drift of a
# noisy machine spreads over all four; the table gives the medians of the rounds and their ratios
# to "none": throughput, and CPU time per invoke of the whole process (services, simulated
# devices and operators), the steadier of the two. Budgets: off within 2 %, sampled10 within 3 %.
#
#   scripts/bench-tracing.sh                ROUNDS=7 INVOKES=30000 MODES="none off sampled10 sampled" by default
#   ROUNDS=3 INVOKES=10000 scripts/bench-tracing.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-7}
INVOKES=${INVOKES:-30000}
GO=${GO:-go}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/xc-bench-tracing.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

echo "bench-tracing: building the devstack benchmarks" >&2
(cd "$ROOT/cmd/xiaoclaw" && "$GO" test -c -o "$OUT/devstack.test" ./internal/devstack/)

# run MODE: one process, one benchmark; appends "MODE invokes/s cpu-µs/invoke" to results.
run() {
	local mode=$1 line
	line=$("$OUT/devstack.test" -test.run '^$' -test.bench "^BenchmarkInvokeTracingMode\$/^$mode\$" \
		-test.benchtime "${INVOKES}x" -test.count 1 2>/dev/null | grep -E 'invokes/s' || true)
	if [[ -z $line ]]; then
		echo "bench-tracing: $mode produced no result" >&2
		"$OUT/devstack.test" -test.run '^$' -test.bench "^BenchmarkInvokeTracingMode\$/^$mode\$" \
			-test.benchtime "${INVOKES}x" -test.count 1 >&2 || true
		exit 1
	fi
	awk -v m="$mode" '{for (i = 1; i < NF; i++) {if ($(i+1) == "invokes/s") r = $i; if ($(i+1) == "cpu-µs/invoke") c = $i}} END {print m, r, c}' <<<"$line" >>"$OUT/results"
	read -r _ rate cpu < <(tail -1 "$OUT/results")
	printf '  %-9s %6.0f invokes/s %7.1f cpu-µs/invoke\n' "$mode" "$rate" "$cpu" >&2
}

read -r -a modes <<<"${MODES:-none off sampled10 sampled}"
[[ ${modes[0]} == none ]] || { echo "bench-tracing: MODES must start with none, the baseline" >&2; exit 2; }
for ((r = 0; r < ROUNDS; r++)); do
	echo "bench-tracing: round $((r + 1))/$ROUNDS" >&2
	for ((k = 0; k < ${#modes[@]}; k++)); do
		run "${modes[(k + r) % ${#modes[@]}]}"
	done
done

# median COLUMN MODE
median() {
	awk -v m="$2" -v c="$1" '$1 == m {print $c}' "$OUT/results" | sort -g |
		awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}

echo
printf 'median of %d rounds, %d invokes each, %s CPUs\n' "$ROUNDS" "$INVOKES" "$(nproc)"
printf '%-10s %10s %10s %14s %10s\n' mode invokes/s vs-none cpu-µs/invoke vs-none
base_rate=$(median 2 none) base_cpu=$(median 3 none)
for mode in "${modes[@]}"; do
	awk -v mode="$mode" -v r="$(median 2 "$mode")" -v c="$(median 3 "$mode")" -v br="$base_rate" -v bc="$base_cpu" \
		'BEGIN {printf "%-10s %10.0f %10.3f %14.1f %10.3f\n", mode, r, r / br, c, c / bc}'
done
