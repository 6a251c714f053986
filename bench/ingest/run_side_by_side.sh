#!/usr/bin/env bash
# Runs the same ingest loads against the no-op sink and, when it is built,
# against trainwatchd, and prints one table to compare them.
#
#   bench/ingest/run_side_by_side.sh BUILD_DIR
#
# BUILD_DIR/bin must hold tw-ingest-load and tw-ingest-sink; trainwatchd is
# used from BUILD_DIR/bin/trainwatchd when present (set SKIP_TRAINWATCHD=1 to
# run the sink side only). Every server is started by the generator itself
# (--spawn) on 127.0.0.1 with port 0, with a fresh database each time, and
# stopped when its load ends.
#
# Loads:
#   throughput  8 runs x 1 rank x 50,000 steps, unpaced (400,000 records)
#   latency     10,000 records/s for 10 s (8 runs x 12,500 steps, paced)
#   memory      10 runs x 100 ranks, per-rank records, 200 steps (1,000
#               streams, 200,000 records)
#
# Each load has a duration limit, so the whole script stays within about
# three minutes even against a slow server; a load that does not finish is
# shown as FAIL with the throughput it reached. Exit status: 0 when every
# load passed, 1 otherwise, 2 on usage errors.

set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
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
python=/usr/bin/python3
[[ -x $python ]] || python=python3

work=$(mktemp -d "${TMPDIR:-/tmp}/tw-ingest-bench.XXXXXX")
log=$work/servers.log
results=$work/results.tsv
: >"$results"
# The logs stay for inspection; the databases go.
trap 'rm -rf "$work"/db.*' EXIT

targets=(sink)
if [[ ${SKIP_TRAINWATCHD:-0} == 1 ]]; then
  echo "trainwatchd: skipped (SKIP_TRAINWATCHD=1)"
elif [[ -x $daemon_bin ]]; then
  targets+=(trainwatchd)
else
  echo "trainwatchd: $daemon_bin not built; measuring the sink only"
fi

# name | duration limit (s) | generator flags
loads=(
  "throughput|45|--runs 8 --ranks-per-run 1 --steps 50000"
  "latency|25|--runs 8 --ranks-per-run 1 --steps 12500 --rate 10000"
  "memory|45|--runs 10 --ranks-per-run 100 --per-rank --steps 200"
)

server_command() {
  case $1 in
    sink) echo "$sink_bin --listen 127.0.0.1:0" ;;
    trainwatchd)
      local db
      db=$(mktemp -d "$work/db.XXXXXX")
      echo "$daemon_bin --listen 127.0.0.1:0 --db $db/tw.db --metrics_listen 127.0.0.1:0"
      ;;
  esac
}

status=0
for entry in "${loads[@]}"; do
  IFS='|' read -r name limit flags <<<"$entry"
  for target in "${targets[@]}"; do
    command=$(server_command "$target")
    echo "== $name / $target" >>"$log"
    printf '%-11s %-12s ... ' "$name" "$target"
    rc=0
    # The outer timeout is a backstop only: the generator stops by itself at
    # its duration limit, and on SIGINT it still stops the server and
    # reports.
    # shellcheck disable=SC2086  # $flags is a list of words
    json=$(timeout --signal=INT --kill-after=10 $((limit + 40)) \
             "$load_bin" --spawn "$command" $flags --duration-limit "$limit" \
             --json 2>>"$log") || rc=$?
    if [[ -z $json ]]; then
      json='{}'
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$target" "$rc" "$json" >>"$results"
    if [[ $rc -eq 0 ]]; then
      echo "ok"
    else
      echo "FAIL (exit $rc; see $log)"
      status=1
    fi
  done
done

echo
"$python" - "$results" <<'EOF'
import json
import sys

rows = []
with open(sys.argv[1]) as f:
    for line in f:
        load, target, rc, text = line.rstrip("\n").split("\t", 3)
        try:
            r = json.loads(text)
        except ValueError:
            r = {}
        rows.append((load, target, int(rc), r))

def mib(b):
    return "n/a" if b is None else "%.1f MiB" % (b / 1048576.0)

sink_rate = {load: r.get("records_per_second") for load, target, rc, r in rows
             if target == "sink" and r}
header = ("load", "target", "records/s", "p50 ms", "p99 ms",
          "server peak RSS", "vs sink", "result")
table = [header]
for load, target, rc, r in rows:
    if not r:
        table.append((load, target, "-", "-", "-", "-", "-",
                      "error (exit %d)" % rc))
        continue
    rate = r["records_per_second"]
    lat = r["latency_ms"]
    ratio = "-"
    if target != "sink" and sink_rate.get(load):
        ratio = "%.2fx" % (rate / sink_rate[load])
    if r["ok"]:
        result = "ok"
    else:
        why = []
        if r.get("timed_out"):
            why.append("time limit")
        if r.get("stream_errors"):
            why.append("%d stream errors" % r["stream_errors"])
        if r.get("server_stop_error"):
            why.append("server stop")
        result = "FAIL %d/%d acked%s" % (
            r["records_acked"], r["records_planned"],
            (" (" + ", ".join(why) + ")") if why else "")
    table.append((load, target, "%.0f" % rate, "%.3f" % lat["p50"],
                  "%.3f" % lat["p99"], mib(r.get("server_peak_rss_bytes")),
                  ratio, result))

widths = [max(len(row[i]) for row in table) for i in range(len(header))]
for i, row in enumerate(table):
    print("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
    if i == 0:
        print("  ".join("-" * w for w in widths))
print()
print("records/s: records acknowledged durable / wall time (first send to "
      "last ack).")
print("p50/p99: send of a record to the DurabilityAck covering it. The "
      "throughput and memory loads are unpaced, so their latencies are queueing "
      "behind a full window; the latency load is the one to read for latency.")
print("vs sink: the server's throughput as a fraction of the no-op sink's.")
EOF
echo
echo "server and generator logs: $log"
exit "$status"
