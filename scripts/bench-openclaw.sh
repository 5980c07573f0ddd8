#!/usr/bin/env bash
# Compares node.invoke latency of the real OpenClaw gateway and xiaoclaw in one run, with the same
# stock OpenClaw node host (`openclaw node run`) behind each and the shared bench-invoke.mjs client
# (sequential node.invoke of system.which). Everything runs on loopback; every process this script
# starts is stopped by PID at the end.
#
#   scripts/bench-openclaw.sh [N]        N invokes per gateway (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-300}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
REF="$SHARED/tools/openclaw/openclaw-ref.sh"
export OCL=${OCL:-${TMPDIR:-/tmp}/openclaw-ref}
export OCL_TOKEN=${OCL_TOKEN:-ocl-test-token-0123456789}
REF_PORT=${REF_PORT:-28789}
XC_PORT=${XC_PORT:-38789}
DEV_PORT=${DEV_PORT:-38000}
WORK=$(mktemp -d)
XC_PID=

cleanup() {
  bash "$REF" stop >/dev/null 2>&1 || true
  if [ -n "$XC_PID" ] && kill -0 "$XC_PID" 2>/dev/null; then kill "$XC_PID"; wait "$XC_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

bash "$REF" install >/dev/null
eval "$(bash "$REF" env)"
# The client imports "ws", installed beside openclaw: run it from there.
cp "$SHARED/tools/openclaw/bench-invoke.mjs" "$OCL/bench-invoke.mjs"
bench() { # url node
  local out
  for _ in $(seq 1 60); do
    if out=$(cd "$OCL" && node bench-invoke.mjs --url "$1" --token "$OCL_TOKEN" --node "$2" --n "$N" --warmup 20 \
        --command system.which --params '{"bins":["sh"]}' 2>"$WORK/bench.err"); then
      echo "$out"; return 0
    fi
    sleep 1   # the node host is still connecting or awaiting approval
  done
  cat "$WORK/bench.err" >&2; return 1
}

echo "== reference OpenClaw gateway on :$REF_PORT" >&2
bash "$REF" gateway "$REF_PORT" >&2
bash "$REF" node "$REF_PORT" bench-ref >&2
bash "$REF" approve "$REF_PORT" bench-ref >/dev/null 2>&1 || true
REF_OUT=$(bench "ws://127.0.0.1:$REF_PORT" bench-ref)

echo "== xiaoclaw on :$XC_PORT" >&2
make -s build-cli >&2
bin/xiaoclaw dev --data-dir "$WORK/xc" --gateway-addr "127.0.0.1:$XC_PORT" --device-addr "127.0.0.1:$DEV_PORT" \
  --operator-token "$OCL_TOKEN" --log-level warn >"$WORK/xc.log" 2>&1 &
XC_PID=$!
bash "$REF" node "$XC_PORT" bench-xc >&2
XC_OUT=$(bench "ws://127.0.0.1:$XC_PORT" bench-xc)

echo "reference: $REF_OUT"
echo "xiaoclaw:  $XC_OUT"
node -e '
const r = JSON.parse(process.argv[1]), x = JSON.parse(process.argv[2]);
console.log(`p50 ${r.p50_ms} ms -> ${x.p50_ms} ms (${(r.p50_ms / x.p50_ms).toFixed(1)}x lower); ` +
            `p99 ${r.p99_ms} ms -> ${x.p99_ms} ms (${(r.p99_ms / x.p99_ms).toFixed(1)}x lower)`);
' "$REF_OUT" "$XC_OUT"
