#!/usr/bin/env bash
# twctl follow's throughput beside a plain cat of the same log, on one core,
# per log format.
#
#   bench/follow/follow_throughput.sh TRAINWATCHD TWCTL [LINES] [REPS] [MIN_RATE] [FORMATS]
#
# For each of FORMATS (comma-separated, default megatron; "all": megatron,
# nanogpt, hf, torchtitan, composer, nemo, lightning), generates a log of
# about LINES lines (default 200,000) as that trainer prints it (Megatron-LM
# iteration lines with a checkpoint line every 1,000; nanoGPT iter lines;
# Hugging Face dicts each after its tqdm bar, on '\r'-joined lines; torchtitan
# coloured step lines from two ranks; Composer ConsoleLogger blocks of five
# lines; NeMo 2 "Training epoch" lines; a Lightning metrics.csv with a
# validation row every 10 steps), starts a trainwatchd on a temporary
# database, then, REPS times (default 3) in alternation, pipes the log
# through `cat > /dev/null` and through `twctl follow -` (pinned to CPU 0
# with taskset, as is the cat), each timed from the first byte to its exit:
# for follow that is every line parsed, every record sent and acknowledged
# durable by the server. Prints lines/s of both per repetition, follow's own
# summary, and, for `make bench` (bench/run_all.py), per format one JSON
# object per figure: follow's lines/s end to end (the median over the
# repetitions, with cat's as the baseline) and its lines per CPU-second of
# the twctl process (user + sys: what a machine busy with other work does
# not inflate). Exits 1 when a format's median is under MIN_RATE lines/s
# (default 50,000; 0: never, for the smoke run's tiny sizes).
set -euo pipefail
TRAINWATCHD=$1
TWCTL=$2
LINES=${3:-200000}
REPS=${4:-3}
MIN_RATE=${5:-50000}
FORMATS=${6:-megatron}
[ "$FORMATS" = all ] && FORMATS=megatron,nanogpt,hf,torchtitan,composer,nemo,lightning
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tw-follow-bench.XXXXXX")
DAEMON=""
cleanup() {
  if [ -n "$DAEMON" ]; then kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# The log of format $1, about $LINES lines, on stdout.
generate() {
  case $1 in
  megatron) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n; i++) {
      printf " [2024-05-01 10:00:00] iteration %8d/%8d | consumed samples: %d | elapsed time per iteration (ms): 901.2 | learning rate: 3.000000E-04 | global batch size: 8 | lm loss: %.6E | loss scale: 1.0 | grad norm: %.3f | number of skipped iterations: 0 | number of nan iterations: 0 |\n", i, n, i * 8, 4 + (i % 7) / 1000.0, 1 + (i % 5) / 100.0
      if (i % 1000 == 0) printf "saving checkpoint at iteration %d to /ckpt/bench\n", i
    }
  }' ;;
  nanogpt) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "iter %d: loss %.4f, time 901.20ms, mfu 12.34%%\n", i, 4 + (i % 7) / 1000.0
  }' ;;
  hf) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "\r 10%%|#         | %d/%d [00:10<01:30, 1.00it/s]\r                                        \r{\047loss\047: %.4f, \047grad_norm\047: %.4f, \047learning_rate\047: 0.0003, \047epoch\047: 0.01}\n", i, n, 4 + (i % 7) / 1000.0, 1 + (i % 5) / 100.0
  }' ;;
  torchtitan) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n / 2; i++) for (r = 0; r < 2; r++)
      printf "[rank%d]:[titan] 2025-01-01 12:00:00,000 - root - INFO - \033[31mstep: %2d  \033[32mloss: %7.4f  \033[38;2;180;60;0mgrad_norm: %7.4f  \033[38;2;54;234;195mmemory: 12.34GiB(15.00%%)  \033[34mtps: 1,234  \033[36mtflops: 56.78  \033[35mmfu: 12.34%%\033[39m\n", r, i, 4 + (i % 7) / 1000.0, 1 + (i % 5) / 100.0
  }' ;;
  composer) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n / 5; i++)
      printf "[batch=%d/%d]:\n\t Train time/batch: %d\n\t Train loss/train/total: %.4f\n\t Train l2_norm/grad/global: %.4f\n\t Train lr-DecoupledAdamW/group0: 0.0003\n", i, n / 5, i - 1, 4 + (i % 7) / 1000.0, 1 + (i % 5) / 100.0
  }' ;;
  nemo) awk -v n="$LINES" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "Training epoch 0, iteration %d/%d | lr: 3e-05 | consumed_samples: %d | global_batch_size: 8 | global_step: %d | reduced_train_loss: %.4f | train_step_timing in s: 0.0315\n", i, n, i * 8, i, 4 + (i % 7) / 1000.0
  }' ;;
  lightning) awk -v n="$LINES" 'BEGIN {
    print "epoch,grad_2.0_norm_total,step,train_loss,val_loss"
    for (i = 1; i <= n; i++) {
      printf "0,%.4f,%d,%.4f,\n", 1 + (i % 5) / 100.0, i, 4 + (i % 7) / 1000.0
      if (i % 10 == 0) printf "0,,%d,,3.5\n", i
    }
  }' ;;
  *) echo "unknown format $1" >&2; return 1 ;;
  esac
}
label() {
  case $1 in
  megatron) echo Megatron ;; nanogpt) echo nanoGPT ;; hf) echo "Hugging Face" ;;
  torchtitan) echo torchtitan ;; composer) echo Composer ;; nemo) echo NeMo ;;
  lightning) echo "Lightning CSV" ;;
  esac
}

"$TRAINWATCHD" --listen 127.0.0.1:0 --metrics_listen= --db "$TMP/tw.db" > "$TMP/d.log" 2>&1 &
DAEMON=$!
for _ in $(seq 100); do
  PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/d.log" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "${PORT:-}" ] || { echo "trainwatchd did not start:"; cat "$TMP/d.log"; exit 1; }

now() { date +%s.%N; }
failed=0
for fmt in ${FORMATS//,/ }; do
generate "$fmt" > "$TMP/train.log"
TOTAL=$(wc -l < "$TMP/train.log")
LABEL=$(label "$fmt")
echo "== $LABEL: $TOTAL lines" >&2
: > "$TMP/rates"
for rep in $(seq "$REPS"); do
  t0=$(now)
  taskset -c 0 cat "$TMP/train.log" | taskset -c 0 cat > /dev/null
  t1=$(now)
  # bash's time of the pipeline: its user + sys are follow's (cat's are
  # noise beside them).
  TIMEFORMAT='%U %S'
  { time (taskset -c 0 cat "$TMP/train.log" | taskset -c 0 "$TWCTL" follow - --run "bench-$fmt-$rep" \
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
# Megatron's figures keep their names (the first format this bench had).
if [ "$fmt" = megatron ]; then
  RATE_NAME="twctl follow, Megatron log to acknowledged"
  CPU_NAME="twctl follow, lines per CPU-second of twctl (user + sys)"
else
  RATE_NAME="twctl follow, $LABEL log to acknowledged"
  CPU_NAME="twctl follow, $LABEL log, lines per CPU-second of twctl (user + sys)"
fi
awk -v lines="$TOTAL" -v min_rate="$MIN_RATE" -v rate_name="$RATE_NAME" -v cpu_name="$CPU_NAME" -v label="$LABEL" '
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]; return m }
  function hi(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
  { n++; cat[n] = $1; fol[n] = $2; cpu[n] = $3 }
  END {
    c = median(cat, n); f = median(fol, n); p = median(cpu, n)
    printf "%s: lines %d, %d repetitions\ncat     %.0f lines/s (median)\nfollow  %.0f lines/s (median, acknowledged; min %.0f, max %.0f)\nratio   cat/follow %.1f\nfollow  %.0f lines per CPU-second of twctl (median)\n", label, lines, n, c, f, lo(fol, n), hi(fol, n), c / f, p
    printf "{\"figure\": \"%s, %dk lines (lines/s, one core)\", \"unit\": \"lines/s\", \"value\": %.0f, \"baseline\": %.0f, \"ratio\": %.6f, \"median\": %.0f, \"min\": %.0f, \"max\": %.0f}\n", rate_name, lines / 1000, f, c, f / c, f, lo(fol, n), hi(fol, n)
    printf "{\"figure\": \"%s\", \"unit\": \"lines/s\", \"value\": %.0f, \"baseline\": null, \"ratio\": null, \"median\": %.0f, \"min\": %.0f, \"max\": %.0f}\n", cpu_name, p, p, lo(cpu, n), hi(cpu, n)
    exit f < min_rate ? 1 : 0
  }' "$TMP/rates" || failed=1
done
exit "$failed"
