#!/usr/bin/env bash
# twctl follow's throughput beside a plain cat of the same log, on one core.
#
#   bench/follow/follow_throughput.sh TRAINWATCHD TWCTL [LINES] [REPS] [MIN_RATE]
#
# Generates a Megatron-LM log of LINES iteration lines (default 200,000;
# a checkpoint line every 1,000), starts a trainwatchd on a temporary
# database, then, REPS times (default 3) in alternation, pipes the log
# through `cat > /dev/null` and through `twctl follow -` (pinned to CPU 0
# with taskset, as is the cat), each timed from the first byte to its exit:
# for follow that is every line parsed, every record sent and acknowledged
# durable by the server. Prints lines/s of both per repetition, follow's own
# summary, and, for `make bench` (bench/run_all.py), one JSON object per
# figure: follow's lines/s end to end (the median over the repetitions, with
# cat's as the baseline) and its lines per CPU-second of the twctl process
# (user + sys: what a machine busy with other work does not inflate).
# Exits 1 when follow's median is under MIN_RATE lines/s (default 50,000;
# 0: never, for the smoke run's tiny sizes).
set -euo pipefail
TRAINWATCHD=$1
TWCTL=$2
LINES=${3:-200000}
REPS=${4:-3}
MIN_RATE=${5:-50000}
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
: > "$TMP/rates"
for rep in $(seq "$REPS"); do
  t0=$(now)
  taskset -c 0 cat "$TMP/train.log" | taskset -c 0 cat > /dev/null
  t1=$(now)
  # bash's time of the pipeline: its user + sys are follow's (cat's are
  # noise beside them).
  TIMEFORMAT='%U %S'
  { time (taskset -c 0 cat "$TMP/train.log" | taskset -c 0 "$TWCTL" follow - --run "bench-$rep" \
      --server "127.0.0.1:$PORT" --status-interval 0 2> "$TMP/follow.err"); } 2> "$TMP/cpu"
  t2=$(now)
  cat "$TMP/follow.err"
  read -r user sys < "$TMP/cpu"
  awk -v lines="$TOTAL" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v cpu="$user $sys" -v rep="$rep" 'BEGIN {
    split(cpu, c, " "); cat = lines / (t1 - t0); follow = lines / (t2 - t1)
    percpu = lines / (c[1] + c[2])
    printf "rep %d: cat %.0f lines/s (%.2f s), follow %.0f lines/s (%.2f s, acknowledged), %.0f lines per CPU-second\n", rep, cat, t1 - t0, follow, t2 - t1, percpu > "/dev/stderr"
    printf "%f %f %f\n", cat, follow, percpu
  }' >> "$TMP/rates"
done
awk -v lines="$TOTAL" -v min_rate="$MIN_RATE" '
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]; return m }
  function hi(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
  { n++; cat[n] = $1; fol[n] = $2; cpu[n] = $3 }
  END {
    c = median(cat, n); f = median(fol, n); p = median(cpu, n)
    printf "lines %d, %d repetitions\ncat     %.0f lines/s (median)\nfollow  %.0f lines/s (median, acknowledged; min %.0f, max %.0f)\nratio   cat/follow %.1f\nfollow  %.0f lines per CPU-second of twctl (median)\n", lines, n, c, f, lo(fol, n), hi(fol, n), c / f, p
    printf "{\"figure\": \"twctl follow, Megatron log to acknowledged, %dk lines (lines/s, one core)\", \"unit\": \"lines/s\", \"value\": %.0f, \"baseline\": %.0f, \"ratio\": %.6f, \"median\": %.0f, \"min\": %.0f, \"max\": %.0f}\n", lines / 1000, f, c, f / c, f, lo(fol, n), hi(fol, n)
    printf "{\"figure\": \"twctl follow, lines per CPU-second of twctl (user + sys)\", \"unit\": \"lines/s\", \"value\": %.0f, \"baseline\": null, \"ratio\": null, \"median\": %.0f, \"min\": %.0f, \"max\": %.0f}\n", p, p, lo(cpu, n), hi(cpu, n)
    exit f < min_rate ? 1 : 0
  }' "$TMP/rates"
