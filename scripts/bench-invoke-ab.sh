#!/usr/bin/env bash
# node.invoke before and after a change, in one run: the devstack benchmarks (whole stack in one
# process: operator WS → gateway → NATS → shim → devicehub → simulated device, audit to JetStream and
# SQLite, Casbin policy) of two commits, built side by side and run in turns (the order alternates
# every round) so the drift of a noisy machine spreads over both. It prints the medians of the rounds
# and new/base ratios: throughput (64 calls in flight), its p50, sequential full-path p50, and CPU
# seconds of the throughput process.
#
#   scripts/bench-invoke-ab.sh BASE [NEW]     NEW defaults to the work tree; ROUNDS=7 THR=5000 LAT=2000
#   BASE_BIN=/path/base.test …                 reuse a base test binary built before
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${1:?usage: bench-invoke-ab.sh BASE-COMMIT [NEW-COMMIT]}
NEW=${2:-}
ROUNDS=${ROUNDS:-7}
THR=${THR:-5000}
LAT=${LAT:-2000}
GO=${GO:-go}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/xc-bench-ab.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

build() { # build NAME COMMIT ("" = work tree)
	local src=$ROOT
	if [[ -n $2 ]]; then
		src=$OUT/src-$1
		mkdir -p "$src"
		git -C "$ROOT" archive "$2" | tar -x -C "$src"
	fi
	(cd "$src/cmd/xiaoclaw" && "$GO" test -c -o "$OUT/$1.test" ./internal/devstack/)
}
echo "bench-invoke-ab: building base ($BASE) and new (${NEW:-work tree})" >&2
if [[ -n ${BASE_BIN:-} ]]; then cp "$BASE_BIN" "$OUT/base.test"; else build base "$BASE"; fi
build new "$NEW"

# run NAME BENCH N: appends "NAME BENCH metric value…" and the process CPU seconds to results.
run() {
	local line cpu
	line=$( { /usr/bin/time -f "cpu %U %S" "$OUT/$1.test" -test.run '^$' -test.bench "^$2\$" -test.benchtime "$3x" -test.count 1 2>&1; } |
		grep -E "^$2-|^cpu [0-9]" | tr '\n' ' ')
	if [[ $line != *"$2-"* ]]; then
		echo "bench-invoke-ab: $1 $2 produced no result" >&2
		exit 1
	fi
	awk -v n="$1" -v b="$2" '{for (i = 1; i < NF; i++) {
		if ($(i+1) ~ /^(invokes\/s|p50-µs|full-p50-µs)$/) printf "%s %s %s %s\n", n, b, $(i+1), $i
		if ($i == "cpu") printf "%s %s cpu-s %s\n", n, b, $(i+1) + $(i+2)}}' <<<"$line" | tee -a "$OUT/results" >&2
}

for ((r = 0; r < ROUNDS; r++)); do
	echo "bench-invoke-ab: round $((r + 1))/$ROUNDS" >&2
	order=(base new)
	((r % 2)) && order=(new base)
	for v in "${order[@]}"; do run "$v" BenchmarkInvokeThroughput "$THR"; done
	for v in "${order[@]}"; do run "$v" BenchmarkInvokeLatency "$LAT"; done
done

median() { # median NAME BENCH METRIC
	awk -v n="$1" -v b="$2" -v m="$3" '$1 == n && $2 == b && $3 == m {print $4}' "$OUT/results" | sort -g |
		awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
echo
printf 'median of %d rounds (throughput %d invokes, latency %d), %s CPUs\n' "$ROUNDS" "$THR" "$LAT" "$(nproc)"
printf '%-26s %-12s %12s %12s %8s\n' benchmark metric base new new/base
for bm in "BenchmarkInvokeThroughput invokes/s" "BenchmarkInvokeThroughput p50-µs" "BenchmarkInvokeThroughput cpu-s" \
	"BenchmarkInvokeLatency full-p50-µs"; do
	read -r b m <<<"$bm"
	awk -v b="$b" -v m="$m" -v x="$(median base "$b" "$m")" -v y="$(median new "$b" "$m")" \
		'BEGIN {printf "%-26s %-12s %12.1f %12.1f %8.3f\n", b, m, x, y, y / x}'
done
