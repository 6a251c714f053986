#!/usr/bin/env bash
# Runs the same ingest loads against trainwatchd and against the two no-op
# sinks, side by side, alternating over several rounds, and prints one table
# of medians and spreads plus the ratio trainwatchd / fair sink.
#
#   bench/ingest/run_side_by_side.sh [--json] BUILD_DIR
#
# BUILD_DIR/bin must hold tw-ingest-load and tw-ingest-sink; trainwatchd is
# used from BUILD_DIR/bin/trainwatchd when present (set SKIP_TRAINWATCHD=1 to
# run the sinks only). Every server is started by the generator itself
# (--spawn) on 127.0.0.1 with port 0, with a fresh database each time, and
# stopped when its load ends.
#
# Targets, run in turn within a round, the order reversed every other round
# so that drift in the machine's load hits every target alike:
#   sink-batch   tw-ingest-sink --ack batch: acks per writer batch exactly as
#                trainwatchd does, stores nothing. The fair upper bound.
#   sink-record  tw-ingest-sink --ack record: acks every record at once (the
#                old baseline; mostly measures ack traffic).
#   trainwatchd  the default, --db_synchronous full (fsync per commit).
#   twd-normal   trainwatchd --db_synchronous normal (no fsync per commit).
#
# Loads (ROUNDS rounds each, default 5: one unpaced round lasts under a
# second, and a burst on a shared machine moves a median of three):
#   throughput  8 runs x 1 rank x THROUGHPUT_STEPS (20,000) steps, unpaced
#   latency     8 runs x 8 ranks, per-rank records, 10,000 records/s for
#               LATENCY_STEPS (800) steps per rank (5.1 s)
#   memory      10 runs x 100 ranks, per-rank, 200 steps (1,000 streams),
#               once, sink-batch and trainwatchd only (peak RSS)
# With the defaults it takes about 5 minutes on 2 busy cores.
#
# Output: the machine's cores and load average at start and end; per load
# and target, the median [min-max] over the rounds of records/s and of the
# p50 / p99 latency; the per-round ratios to sink-batch (median [min-max]);
# the bytes each server handed to write calls per record at the latency
# load's rate (/proc/PID/io wchar: trainwatchd's database, WAL and log).
# With --json, or when $TW_BENCH_JSON names a file (bench/run_all.py sets
# it), the figures are also written as JSON objects, one a line, with keys
# {"figure","value","baseline","ratio","unit","median","min","max"}: to
# stdout (instead of the table) with --json, to the file otherwise.
#
# Exit status: 0 when every load passed, 1 otherwise, 2 on usage errors.

set -euo pipefail

json_only=0
if [[ ${1:-} == --json ]]; then
  json_only=1
  shift
fi
if [[ $# -ne 1 ]]; then
  echo "usage: $0 [--json] BUILD_DIR" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
load_bin=$build_dir/bin/tw-ingest-load
sink_bin=$build_dir/bin/tw-ingest-sink
daemon_bin=$build_dir/bin/trainwatchd
for bin in "$load_bin" "$sink_bin"; do
  if [[ ! -x $bin ]]; then
    echo "$0: $bin not found; build the tw-ingest-load and tw-ingest-sink targets" >&2
    exit 2
  fi
done
rounds=${ROUNDS:-5}
throughput_steps=${THROUGHPUT_STEPS:-20000}
latency_steps=${LATENCY_STEPS:-800}
for knob in rounds throughput_steps latency_steps; do
  if ! [[ ${!knob} =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: ${knob^^} must be a positive integer, not '${!knob}'" >&2
    exit 2
  fi
done
python=/usr/bin/python3
[[ -x $python ]] || python=python3

# Progress goes to stderr with --json, so that stdout is JSON only.
say() {
  if [[ $json_only == 1 ]]; then printf '%s' "$*" >&2; else printf '%s' "$*"; fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/tw-ingest-bench.XXXXXX")
log=$work/servers.log
results=$work/results.tsv
: >"$results"
# The logs stay for inspection; the databases go.
trap 'rm -rf "$work"/db.*' EXIT

targets=(sink-batch sink-record)
if [[ ${SKIP_TRAINWATCHD:-0} == 1 ]]; then
  say "trainwatchd: skipped (SKIP_TRAINWATCHD=1)"$'\n'
elif [[ -x $daemon_bin ]]; then
  targets+=(trainwatchd twd-normal)
else
  say "trainwatchd: $daemon_bin not built; measuring the sinks only"$'\n'
fi

machine() {
  echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
load_start=$(machine)
say "machine: $load_start"$'\n'

server_command() {
  local db
  case $1 in
    sink-batch) echo "$sink_bin --listen 127.0.0.1:0 --ack batch" ;;
    sink-record) echo "$sink_bin --listen 127.0.0.1:0 --ack record" ;;
    trainwatchd | twd-normal)
      db=$(mktemp -d "$work/db.XXXXXX")
      local sync=full
      [[ $1 == twd-normal ]] && sync=normal
      echo "$daemon_bin --listen 127.0.0.1:0 --db $db/tw.db --metrics_listen= --db_synchronous $sync"
      ;;
  esac
}

status=0
run_one() {  # round load limit target flags
  local round=$1 name=$2 limit=$3 target=$4 flags=$5 command json rc=0
  command=$(server_command "$target")
  echo "== round $round / $name / $target: $command" >>"$log"
  say "$(printf 'round %d  %-11s %-12s ... ' "$round" "$name" "$target")"
  # The outer timeout is a backstop only: the generator stops by itself at
  # its duration limit, and on SIGINT it still stops the server and reports.
  # shellcheck disable=SC2086  # $flags is a list of words
  json=$(timeout --signal=INT --kill-after=10 $((limit + 40)) \
           "$load_bin" --spawn "$command" $flags --duration-limit "$limit" \
           --json 2>>"$log") || rc=$?
  [[ -n $json ]] || json='{}'
  printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$target" "$rc" "$json" >>"$results"
  if [[ $rc -eq 0 ]]; then
    say "ok"$'\n'
  else
    say "FAIL (exit $rc; see $log)"$'\n'
    status=1
  fi
}

# name | duration limit (s) | generator flags
loads=(
  "throughput|45|--runs 8 --ranks-per-run 1 --steps $throughput_steps"
  "latency|25|--runs 8 --ranks-per-run 8 --per-rank --steps $latency_steps --rate 10000"
)
for ((round = 1; round <= rounds; ++round)); do
  order=("${targets[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((i = ${#targets[@]} - 1; i >= 0; --i)); do order+=("${targets[i]}"); done
  fi
  for entry in "${loads[@]}"; do
    IFS='|' read -r name limit flags <<<"$entry"
    for target in "${order[@]}"; do run_one "$round" "$name" "$limit" "$target" "$flags"; done
  done
done
for target in sink-batch trainwatchd; do
  [[ " ${targets[*]} " == *" $target "* ]] || continue
  run_one 1 memory 45 "$target" "--runs 10 --ranks-per-run 100 --per-rank --steps 200"
done
load_end=$(machine)

"$python" - "$results" "$json_only" "${TW_BENCH_JSON:-}" "$load_start" "$load_end" \
  "$latency_steps" <<'EOF'
import collections
import json
import statistics
import sys

path, json_only, json_file, load_start, load_end, latency_steps = sys.argv[1:]
json_only = json_only == "1"
# (load, target) -> round -> result
runs = collections.defaultdict(dict)
failed = []
with open(path) as f:
    for line in f:
        rnd, load, target, rc, text = line.rstrip("\n").split("\t", 4)
        try:
            r = json.loads(text)
        except ValueError:
            r = {}
        if int(rc) != 0 or not r.get("ok"):
            failed.append("%s/%s round %s (exit %s)" % (load, target, rnd, rc))
        if r:
            runs[(load, target)][int(rnd)] = r

def values(load, target, get):
    return [get(r) for _, r in sorted(runs.get((load, target), {}).items())]

def spread(xs, fmt):
    if not xs:
        return "-"
    return (fmt + " [" + fmt + "-" + fmt + "]") % (statistics.median(xs), min(xs), max(xs))

def ratios(load, target, base, get):
    """Per-round target/base: each pair ran in the same round, side by side."""
    a, b = runs.get((load, target), {}), runs.get((load, base), {})
    return [get(a[k]) / get(b[k]) for k in sorted(a)
            if k in b and get(b[k]) and get(a[k]) is not None]

rate = lambda r: r["records_per_second"]
p50 = lambda r: r["latency_ms"]["p50"]
p99 = lambda r: r["latency_ms"]["p99"]
rss = lambda r: (r.get("server_peak_rss_bytes") or 0) / 1048576.0
# What the server handed to write calls per record acknowledged (wchar:
# files; gRPC's socket sends are not counted there): trainwatchd's database,
# WAL and log, against the sink's log alone.
def written(r):
    w, n = r.get("server_written_bytes"), r.get("records_acked")
    return w / n if w is not None and w >= 0 and n else None

table = [("load", "target", "records/s", "p50 ms", "p99 ms", "server RSS MiB",
          "records/s vs sink-batch")]
for (load, target) in sorted(runs, key=lambda k: (["throughput", "latency", "memory"].index(k[0]), k[1])):
    vs = ratios(load, target, "sink-batch", rate) if target != "sink-batch" else []
    table.append((load, target, spread(values(load, target, rate), "%.0f"),
                  spread(values(load, target, p50), "%.2f"),
                  spread(values(load, target, p99), "%.2f"),
                  spread(values(load, target, rss), "%.1f"),
                  spread(vs, "%.2fx")))

figures = []
def figure(name, unit, value_xs, base_xs, ratio_xs, spread_of):
    if not value_xs:
        return
    med = lambda xs: statistics.median(xs) if xs else None
    judged = ratio_xs if spread_of == "ratio" else value_xs
    figures.append({"figure": name, "unit": unit, "value": med(value_xs),
                    "baseline": med(base_xs), "ratio": med(ratio_xs),
                    "median": med(judged), "min": min(judged) if judged else None,
                    "max": max(judged) if judged else None})

figure("ingest vs a fair sink (trainwatchd / tw-ingest-sink --ack batch), records/s, "
       "8 runs unpaced", "records/s", values("throughput", "trainwatchd", rate),
       values("throughput", "sink-batch", rate),
       ratios("throughput", "trainwatchd", "sink-batch", rate), "ratio")
figure("ingest p99 durable-ack latency at 10,000 records/s, 8 runs x 8 ranks (trainwatchd; "
       "baseline: the batch sink)", "ms", values("latency", "trainwatchd", p99),
       values("latency", "sink-batch", p99),
       ratios("latency", "trainwatchd", "sink-batch", p99), "value")
figure("trainwatchd --db_synchronous normal / batch sink, records/s, 8 runs unpaced",
       "records/s", values("throughput", "twd-normal", rate),
       values("throughput", "sink-batch", rate),
       ratios("throughput", "twd-normal", "sink-batch", rate), "ratio")
figure("trainwatchd --db_synchronous normal: latency p99 at 10,000 records/s, 8 x 8 (ms)",
       "ms", values("latency", "twd-normal", p99), values("latency", "sink-batch", p99),
       ratios("latency", "twd-normal", "sink-batch", p99), "value")
figure("ingest bytes written per record at 10,000 records/s, 8 runs x 8 ranks (trainwatchd: "
       "database, WAL and log; baseline: the batch sink, which writes no file)", "bytes/record",
       [x for x in values("latency", "trainwatchd", written) if x is not None],
       [x for x in values("latency", "sink-batch", written) if x is not None],
       ratios("latency", "trainwatchd", "sink-batch", written), "value")
figure("per-record sink / batch sink, records/s, 8 runs unpaced (what per-record acks cost)",
       "records/s", values("throughput", "sink-record", rate),
       values("throughput", "sink-batch", rate),
       ratios("throughput", "sink-record", "sink-batch", rate), "ratio")

lines = [json.dumps(f) for f in figures]
if json_file:
    with open(json_file, "a") as f:
        f.write("\n".join(lines) + "\n")
if json_only:
    print("\n".join(lines))
    sys.exit(0)

widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
print()
print("machine: %s at start, %s at end" % (load_start, load_end))
for i, row in enumerate(table):
    print("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
    if i == 0:
        print("  ".join("-" * w for w in widths))
print()
print("Each cell: median [min-max] over the rounds. records/s: records acknowledged "
      "durable / wall time (first send to last ack). p50/p99: send of a record to the "
      "DurabilityAck covering it; the throughput and memory loads are unpaced, so their "
      "latencies are queueing behind a full window: read the latency load for latency. "
      "vs sink-batch: per round, this target's records/s over the batch sink's in the same "
      "round.")
if failed:
    print("failed: " + "; ".join(failed))
if not json_file:  # else the file has them, and a reader of both would count twice
    print()
    print("\n".join(lines))
EOF
say $'\n'"server and generator logs: $log"$'\n'
exit "$status"
