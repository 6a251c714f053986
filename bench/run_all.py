#!/usr/bin/python3
"""`make bench`: runs every benchmark and writes one table of its figures.

  /usr/bin/python3 bench/run_all.py [--build build] [--out BUILD/bench]
      [--docs docs/benchmarks.md] [--smoke] [--timeout 300]

Builds nothing: `make bench` depends on `make build`. Each bench is run in
turn; a bench whose binary or script is absent is listed as "not run", one
that fails or times out as "failed" with its exit status, so the table always
has every row. Output, in --out (default BUILD/bench):

  summary.md    the markdown table of every figure
  summary.json  the same rows, the machine (cores, CPU, kernel, load average
                at start and end, date, commit) and each bench's exit status
  <bench>.log   each bench's stdout and stderr
  detection.md  the detection backtest's tables (bench/detection/backtest.py:
                trainwatch, OLMo-core's SkipStepOptimizer and Lightning's
                SpikeDetection on the same traces)

and --docs (default docs/benchmarks.md; none for --smoke unless given), the
documentation's page of these figures (bench/benchmarks_page.py), which the
other pages link to instead of quoting figures.

The figures' schema, which every bench writes (a JSON list, or one JSON
object per line, into the file named by $TW_BENCH_JSON, or as lines of its
stdout): {"figure", "value", "baseline", "ratio", "unit", "median", "min",
"max"}. median / min / max are the spread, over the repetitions, of what the
figure's goal judges: the ratio for a ratio to a baseline measured in
alternation (cpu_stats), the value for an absolute goal (rule engine, replay). Google Benchmark's JSON (rule_engine_bench) is
converted here. The goals are kept here, beside the figures they judge: a
figure matching no goal is still listed; a goal that no figure matched is
listed as "not run".

--smoke runs every bench at tiny sizes (seconds) and skips the ones that
cannot be made short (the ingest side-by-side); its pass/fail column is
"smoke": the sizes are too small to judge a goal. A ctest runs it so that
the table cannot rot. --timeout is the limit per bench, in seconds.
"""

import argparse
import datetime
import glob
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks_page import render, table, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# (bench, the row's name when nothing matched, figure regex, what is judged,
# op, target). cpu_stats ratios are baseline time / trainwatch time (above 1:
# trainwatch faster).
GOALS = [
    ("ingest", "ingest vs a fair (batch-acking) sink", r"ingest.*fair sink", "ratio", ">=", 0.8),
    ("ingest", "p99 durable-ack latency at 10,000 records/s (ms)", r"p99.*ack", "value", "<=", 20.0),
    ("ingest_pg", "PostgreSQL: p99 durable-ack latency at 10,000 records/s, synchronous standby (ms)",
     r"^PostgreSQL: p99 durable-ack", "value", "<=", 50.0),
    ("ingest_pg", "PostgreSQL failover: kill -9 of the owner to the standby's first durable ack (s)",
     r"^PostgreSQL failover: .*first durable ack", "value", "<=", 15.0),
    ("restart", "restart to serving, 8 runs x 500k steps (s)", r"^restart to serving", "value",
     "<=", 1.0),
    ("rule_engine", "rule engine (M records/s, idle)", r"^rule engine", "value", ">=", 3.0),
    ("replay", "twctl replay --summary, 500k steps (s)", r"^twctl replay", "value", "<=", 0.5),
    ("agent_overhead", "agent Step() p99.9 with the server up, trainer on a core of its own (us)",
     r"p99\.9 with the server up \(own-core\)", "value", "<=", 20.0),
    # Unchanged within noise (issue 48): p99.9 of a few microseconds moves by
    # a tenth between rounds of the same build here.
    ("agent_overhead", "agent Step() p99.9, liveness on vs off (own-core)",
     r"^agent Step\(\) p99\.9, liveness on vs off \(own-core\)", "ratio", "<=", 1.2),
    ("clip", "observe + guard.clip_grad_norm_ vs torch 1.13's clip alone",
     r"^clip, torch 1\..*: observe \+ guard", "ratio", "<=", 1.1),
    ("clip_torch2", "observe + guard.clip_grad_norm_ vs torch 2.x's clip alone",
     r"^clip, torch 2\..*: observe \+ guard", "ratio", "<=", 1.0),
    ("trainwatch_run", "trainwatch run vs the same loop without trainwatch (step time)",
     r"^trainwatch run vs the loop without trainwatch", "ratio", "<=", 1.02),
    ("trainwatch_run", "trainwatch run vs the same loop with watch() (step time)",
     r"^trainwatch run vs the loop with watch\(\)", "ratio", "<=", 1.0),
    ("wheel", "the self-contained wheel's size (MB)", r"^wheel size", "value", "<=", 40.0),
    ("wheel", "import trainwatch from the wheel, over a bare interpreter's start (ms)",
     r"^import trainwatch over", "value", "<=", 200.0),
    ("follow", "twctl follow end to end (lines/s, one core)", r"^twctl follow, Megatron", "value", ">=",
     50000.0),
    ("detection", "detection backtest: expected incidents trainwatch missed",
     r"^detection, trainwatch: incidents missed", "value", "<=", 0),
    ("detection", "detection backtest: trainwatch's false alarms",
     r"^detection, trainwatch: false alarms", "value", "<=", 0),
] + [("follow", f"twctl follow end to end, {label} log (lines/s, one core)",
      rf"^twctl follow, {label} log to acknowledged", "value", ">=", 50000.0)
     for label in ("nanoGPT", "Hugging Face", "torchtitan", "Composer", "NeMo", "Lightning CSV")
     ] + [("cpu_stats", f"grad stats {d} vs plain 1-thread read", rf"^grad stats {d} vs plain 1-thread",
      "ratio", ">=", 0.9) for d in ("fp32", "bf16", "fp16")] + [
    ("cpu_stats", f"grad stats {d} vs torch", rf"^grad stats {d} vs torch", "ratio", ">", 1.0)
     for d in ("fp32", "bf16", "fp16")] + [
    ("cpu_stats", f"logit stats {d} vs torch", rf"^logit stats {d} vs torch", "ratio", ">", 1.0)
     for d in ("fp32", "bf16", "fp16")]


def load_avg():
    return [round(x, 2) for x in os.getloadavg()]


def describe_machine(smoke):
    """What the figures were measured on and of: cores, CPU, kernel, date,
    and the commit (dirty: the tree had uncommitted changes to tracked files)."""
    def git(*args):
        try:
            return subprocess.run(["git", "-C", ROOT, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), None)
    except OSError:
        pass
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": os.uname().release,
            "load_start": load_avg(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "--short=12", "HEAD"), "dirty": bool(status),
            "smoke": smoke}


def parse_figures(text):
    """Figures from a JSON list, a JSON object, or JSON objects one a line."""
    out = []
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except ValueError:
        docs = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    docs.append(json.loads(line))
                except ValueError:
                    pass
    for d in docs:
        if isinstance(d, dict) and "figure" in d and "benchmarks" not in d:
            out.append(d)
        elif isinstance(d, dict) and "benchmarks" in d:
            out.extend(from_google_benchmark(d))
    return out


def from_google_benchmark(doc):
    """rule_engine_bench's repetitions, as one figure in M records/s."""
    rates = [b["items_per_second"] / 1e6 for b in doc["benchmarks"]
             if b.get("run_type", "iteration") == "iteration" and "items_per_second" in b
             and b["name"].startswith("BM_JudgeBenign")]
    if not rates:
        return []
    med = statistics.median(rates)
    # Google Benchmark's rate is per CPU-second of the benchmark's thread.
    return [{"figure": "rule engine, 500k-step benign run (one core, per CPU-second)",
             "unit": "M records/s",
             "value": med, "baseline": None, "ratio": None, "median": med,
             "min": min(rates), "max": max(rates)}]


def replay_bench(build, out_dir, smoke):
    """The whole `twctl replay --summary` process on a 500k-step CSV, next to
    `cat` of the same file (a plain read, process start included), in
    alternation. Returns (rc, log, figures)."""
    synth, twctl = os.path.join(build, "bin", "trainwatch-synth"), os.path.join(build, "bin", "twctl")
    for b in (synth, twctl):
        if not os.access(b, os.X_OK):
            return None, f"{b} not built", []
    steps, reps = (20000, 3) if smoke else (500000, 7)
    csv = os.path.join(out_dir, f"replay-{steps}.csv")
    subprocess.run([synth, "--steps", str(steps), "--out", csv], check=True,
                   stdout=subprocess.DEVNULL)
    cmds = {"twctl": [twctl, "replay", csv, "--summary"], "cat": ["cat", csv]}
    times = {k: [] for k in cmds}
    cpu = []  # twctl's user + sys seconds: what a busy machine does not inflate
    log = []
    for r in range(reps + 1):  # the first round warms the page cache
        for k in (("twctl", "cat") if r % 2 else ("cat", "twctl")):
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            p = subprocess.run(cmds[k], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            dt = time.perf_counter() - t0
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode != 0:
                return p.returncode, p.stdout.decode(errors="replace"), []
            if k == "twctl" and r == 0:
                log.append(p.stdout.decode(errors="replace"))
            if r > 0:
                times[k].append(dt)
                if k == "twctl":
                    cpu.append(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
    ratios = [t / c for t, c in zip(times["twctl"], times["cat"])]
    med = statistics.median(times["twctl"])
    log.append(f"twctl {times['twctl']}\ncat {times['cat']}")
    return 0, "\n".join(log), [{
        # ratio: twctl's time over cat's (how far from a plain read).
        "figure": f"twctl replay --summary, {steps // 1000}k steps (whole process, parsing included)",
        "unit": "s", "value": med, "baseline": statistics.median(times["cat"]),
        "ratio": statistics.median(ratios), "median": med,
        "min": min(times["twctl"]), "max": max(times["twctl"])}, {
        "figure": f"twctl replay --summary, {steps // 1000}k steps, CPU time (user + sys)",
        "unit": "s", "value": statistics.median(cpu), "baseline": None, "ratio": None,
        "median": statistics.median(cpu), "min": min(cpu), "max": max(cpu)}]


def pyenv_python(build, name, bench):
    """The interpreter of build/pyenv/NAME, the test environment of
    tests/python/env/NAME.txt with this tree's wheel installed, made here if
    make test has not; None when it cannot be made."""
    env = os.path.join(ROOT, "tests", "python", "env")
    out = os.path.join(build, "pyenv")
    try:
        for cmd in ([os.path.join(env, "wheel.sh"), ROOT, out],
                    [os.path.join(env, "install.sh"), ROOT, out,
                     os.path.join(env, name + ".txt")]):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"== {bench}: no {name} environment ({e})", flush=True)
        return None
    return os.path.join(out, name, "bin", "python")


def benches(build, out_dir, smoke):
    """(name, command or None when absent, skipped-in-smoke reason)."""
    b = lambda *p: os.path.join(build, *p)
    exe = lambda p: p if os.access(p, os.X_OK) else None
    script = lambda p: p if os.path.exists(p) else None
    lib = b("lib", "libtrainwatch_kernels_c.so")
    reps = "2" if smoke else "5"
    out = []
    rule = exe(b("bin", "rule_engine_bench"))
    out.append(("rule_engine", rule and [rule, "--benchmark_filter=^BM_JudgeBenign$",
                                         f"--benchmark_repetitions={reps}",
                                         "--benchmark_format=json"]
                + (["--benchmark_min_time=0.01"] if smoke else []), None))
    out.append(("replay", "builtin", None))
    # The benches that time microseconds and memory bandwidth run before
    # the ones that write to disk, so that what a disk-heavy bench leaves
    # behind cannot land in them: once, right after the ingest bench, a
    # 1.5 us spin's p99.9 was 36.7 us for half a minute on a virtual machine
    # whose guest was idle with nothing left to write back (1.56 us before
    # it). Such bursts also come from the host alone: the floor rows of
    # agent_overhead show them.
    agent = exe(b("bin", "agent_overhead"))
    out.append(("agent_overhead", agent and [agent] + (["2000", "20000"] if smoke else []), None))
    cpu = script(os.path.join(ROOT, "bench", "kernels", "cpu_stats_bench.py"))
    out.append(("cpu_stats", cpu and os.path.exists(lib) and
                [PY, cpu, "--lib", lib] + (["--smoke"] if smoke else []), None))
    clip = script(os.path.join(ROOT, "bench", "agent", "clip_overhead.py"))
    out.append(("clip", clip and [PY, clip] + (["--rounds", "3"] if smoke else []), None))
    # The same on torch 2.x, in the newest test environment (made here if
    # make test has not), trainwatch as installed there: PYTHONPATH unset.
    if smoke:
        out.append(("clip_torch2", [clip], "its torch 2.x environment takes minutes to make"))
    else:
        torch2 = clip and pyenv_python(build, "torch-newest", "clip_torch2")
        out.append(("clip_torch2", torch2 and ["env", "-u", "PYTHONPATH", torch2, clip], None))
    # A plain loop under `trainwatch run` beside the same loop with watch()
    # and without trainwatch (issue 42), in the same torch 2.x environment.
    run = script(os.path.join(ROOT, "bench", "agent", "run_overhead.py"))
    if smoke:
        out.append(("trainwatch_run", [run], "its torch 2.x environment takes minutes to make"))
    else:
        torch2 = run and pyenv_python(build, "torch-newest", "trainwatch_run")
        out.append(("trainwatch_run", torch2 and ["env", "-u", "PYTHONPATH", torch2, run], None))
    # The wheel the torch environments install (make test builds it), else
    # make wheels' of the same Python.
    footprint = script(os.path.join(ROOT, "bench", "agent", "wheel_footprint.py"))
    wheels = sorted(glob.glob(b("pyenv", "dist", "trainwatch_agent-*-cp311-*.whl")) +
                    glob.glob(os.path.join(ROOT, "dist", "trainwatch_agent-*-cp311-*.whl")))
    out.append(("wheel", footprint and wheels and [PY, footprint, wheels[0]]
                + (["--rounds", "3"] if smoke else []), None))
    follow = script(os.path.join(ROOT, "bench", "follow", "follow_throughput.sh"))
    follow_bins = [exe(b("bin", "trainwatchd")), exe(b("bin", "twctl"))]
    # Every text format follow reads, each its own figure and goal.
    out.append(("follow", follow and all(follow_bins) and
                [follow] + follow_bins + (["20000", "1", "0"] if smoke else ["200000", "3", "50000"])
                + ["all"], None))
    ingest = script(os.path.join(ROOT, "bench", "ingest", "run_side_by_side.sh"))
    out.append(("ingest", ingest and exe(b("bin", "tw-ingest-load")) and [ingest, build],
                "minutes long; not shortened" if smoke else None))
    # trainwatchd on PostgreSQL with a synchronous standby against SQLite,
    # and a replica's failover (issue 36): about 70 s, 7 s at smoke sizes.
    pg = script(os.path.join(ROOT, "bench", "ha", "pg_bench.py"))
    pg_ok = pg and os.path.exists("/usr/lib/postgresql/15/bin/initdb") and all(
        exe(b("bin", x)) for x in ("trainwatchd", "tw-ingest-load"))
    out.append(("ingest_pg", pg_ok and [PY, pg, "--build", build]
                + (["--smoke", "--budget", "60"] if smoke else []), None))
    restart = exe(b("bin", "restart_bench"))
    out.append(("restart", restart and [restart] + (["--smoke"] if smoke else []), None))
    # The same traces through trainwatch's engine and the peers' own code
    # (OLMo-core's SkipStepOptimizer, Lightning's SpikeDetection), in the
    # peers' environment; its Markdown goes into docs/benchmarks.md.
    detection = script(os.path.join(ROOT, "bench", "detection", "backtest.py"))
    if smoke:
        out.append(("detection", [detection], "its peers environment takes minutes to make"))
    else:
        bins = [exe(b("bin", x)) for x in ("twctl", "trainwatchd", "trainwatch-synth")]
        peers = detection and all(bins) and pyenv_python(build, "peers", "detection")
        out.append(("detection", peers and ["env", "-u", "PYTHONPATH", peers, detection, "--bin",
                                            b("bin"), "--md",
                                            os.path.join(out_dir, "detection.md")], None))
    return out


def judge(fig, goal, smoke):
    key, op, target = goal[3:]
    v = fig.get(key)
    if v is None:
        return "no " + key
    if smoke:
        return "smoke"
    ok = {">=": v >= target, "<=": v <= target, ">": v > target}[op]
    return "pass" if ok else "FAIL"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="")
    ap.add_argument("--docs", default=None,
                    help="the page of the figures (default docs/benchmarks.md; none for --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: for the ctest")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per bench")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    if not os.path.isdir(build):
        sys.exit(f"--build {build}: no such folder (run `make build` first)")
    if args.timeout < 1:
        sys.exit("--timeout must be >= 1")
    out_dir = os.path.abspath(args.out or os.path.join(build, "bench"))
    os.makedirs(out_dir, exist_ok=True)
    docs = args.docs if args.docs is not None else (
        "" if args.smoke else os.path.join(ROOT, "docs", "benchmarks.md"))
    # The detection bench writes its tables here; one left by an earlier run
    # must not pass for this run's.
    detection_md = os.path.join(out_dir, "detection.md")
    if os.path.exists(detection_md):
        os.remove(detection_md)
    machine = describe_machine(args.smoke)
    status, figures = {}, []
    for name, cmd, smoke_skip in benches(build, out_dir, args.smoke):
        t0 = time.time()
        if not cmd:
            status[name] = "not run (not built or not present)"
        elif smoke_skip:
            status[name] = f"not run ({smoke_skip})"
        elif cmd == "builtin":
            try:
                rc, log, figs = replay_bench(build, out_dir, args.smoke)
            except (OSError, subprocess.SubprocessError) as e:
                rc, log, figs = 1, str(e), []
            if rc is None:
                status[name] = f"not run ({log})"
            else:
                status[name] = "ok" if rc == 0 else f"failed (exit {rc})"
                figures += [dict(f, bench=name) for f in figs]
                with open(os.path.join(out_dir, name + ".log"), "w") as f:
                    f.write(log)
        else:
            print(f"== {name}: {' '.join(cmd)}", flush=True)
            with tempfile.NamedTemporaryFile("r", suffix=".json", dir=out_dir) as j:
                # The Python benches import the package from the build.
                env = dict(os.environ, TW_BENCH_JSON=j.name,
                           PYTHONPATH=os.pathsep.join(filter(None, [
                               os.path.join(build, "python"), os.environ.get("PYTHONPATH")])))
                try:
                    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=env, timeout=args.timeout, cwd=ROOT)
                    rc, stdout, stderr = p.returncode, p.stdout, p.stderr
                except subprocess.TimeoutExpired as e:
                    rc, stdout, stderr = "timeout", e.stdout or b"", e.stderr or b""
                stdout = stdout.decode(errors="replace")
                figs = parse_figures(open(j.name).read()) + parse_figures(stdout)
            with open(os.path.join(out_dir, name + ".log"), "w") as f:
                f.write(stdout + "\n--- stderr\n" + stderr.decode(errors="replace"))
            status[name] = ("ok" if rc == 0 else f"failed (exit {rc})") + (
                "" if figs else ", no JSON figures")
            figures += [dict(f, bench=name) for f in figs]
        print(f"== {name}: {status[name]} ({time.time() - t0:.0f} s)", flush=True)
    machine["load_end"] = load_avg()

    rows, used = [], set()
    for goal in GOALS:
        bench, label, pattern, key, op, target = goal
        matched = [i for i, f in enumerate(figures)
                   if f["bench"] == bench and re.search(pattern, f["figure"])]
        if not matched:
            rows.append({"figure": label, "bench": bench, "goal": f"{key} {op} {target}",
                         "result": status.get(bench, "not run")})
        for i in matched:
            used.add(i)
            rows.append(dict(figures[i], goal=f"{key} {op} {target}",
                             result=judge(figures[i], goal, args.smoke)))
    rows += [dict(f, goal="", result="") for i, f in enumerate(figures) if i not in used]

    lines = [f"Measured {machine['date']} on {machine['cores']} cores, load average "
             f"{machine['load_start']} at start and {machine['load_end']} at end"
             + (" (smoke sizes: not figures)" if args.smoke else "") + ".", ""] + table(rows)
    lines += ["", "Benches: " + "; ".join(f"{k}: {v}" for k, v in status.items()) + "."]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(md)
    summary = {"machine": machine, "benches": status, "rows": rows}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n" + md + f"\nwritten: {out_dir}/summary.md, summary.json")
    if docs:
        detection = None
        if os.path.exists(detection_md):
            with open(detection_md, encoding="utf-8") as f:
                detection = f.read()
        write(docs, render(summary, detection))
        print(f"written: {docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
