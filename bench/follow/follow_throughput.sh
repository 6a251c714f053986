#!/usr/bin/env bash
# twctl follow's throughput beside a plain cat of the same log, on one core.
#
#   bench/follow/follow_throughput.sh TRAINWATCHD TWCTL [LINES]
#
# Generates a Megatron-LM log of LINES iteration lines (default 1,000,000;
# a checkpoint line every 1,000), starts a trainwatchd on a temporary
# database, then pipes the log through `cat > /dev/null` and through `twctl
# follow -` (pinned to CPU 0 with taskset, as is the cat), each timed from
# the first byte to its exit: for follow that is every line parsed, every
# record sent and acknowledged durable by the server. Prints lines/s of
# both, the ratio, and follow's own summary (its read rate without the
# final wait for acks). Exits 1 when follow reads fewer than 50,000 lines/s.
set -euo pipefail
TRAINWATCHD=$1
TWCTL=$2
LINES=${3:-1000000}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tw-follow-bench.XXXXXX")
DAEMON=""
cleanup() {
  if [ -n "$DAEMON" ]; then kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

awk -v n="$LINES" 'BEGIN {
  for (i = 1; i <= n; i++) {
    printf " [2024-05-01 10:00:00] iteration %8d/%8d | consumed samples: %d | elapsed time per iteration (ms): 901.2 | learning rate: 3.000000E-04 | global batch size: 8 | lm loss: %.6E | loss scale: 1.0 | grad norm: %.3f | number of skipped iterations: 0 | number of nan iterations: 0 |\n", i, n, i * 8, 4 + (i % 7) / 1000.0, 1 + (i % 5) / 100.0
    if (i % 1000 == 0) printf "saving checkpoint at iteration %d to /ckpt/bench\n", i
  }
}' > "$TMP/train.log"
TOTAL=$(wc -l < "$TMP/train.log")

"$TRAINWATCHD" --listen 127.0.0.1:0 --metrics_listen= --db "$TMP/tw.db" > "$TMP/d.log" 2>&1 &
DAEMON=$!
for _ in $(seq 100); do
  PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/d.log" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "${PORT:-}" ] || { echo "trainwatchd did not start:"; cat "$TMP/d.log"; exit 1; }

now() { date +%s.%N; }
t0=$(now)
taskset -c 0 cat "$TMP/train.log" | taskset -c 0 cat > /dev/null
t1=$(now)
taskset -c 0 cat "$TMP/train.log" | taskset -c 0 "$TWCTL" follow - --run bench \
  --server "127.0.0.1:$PORT" --status-interval 0 2> "$TMP/follow.err"
t2=$(now)
cat "$TMP/follow.err"
awk -v lines="$TOTAL" -v t0="$t0" -v t1="$t1" -v t2="$t2" 'BEGIN {
  cat = lines / (t1 - t0); follow = lines / (t2 - t1)
  printf "lines %d\ncat     %.0f lines/s (%.2f s)\nfollow  %.0f lines/s (%.2f s, acknowledged)\nratio   cat/follow %.1f\n", lines, cat, t1 - t0, follow, t2 - t1, cat / follow
  exit follow < 50000 ? 1 : 0
}'
