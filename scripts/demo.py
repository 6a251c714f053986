#!/usr/bin/python3
"""make demo: a real PyTorch trainer with trainwatch attached, through a bad
batch, a logit drift and a NaN, with trainwatchd, Debian's Prometheus and
Alertmanager on loopback and a webhook receiver standing in for the pager.
The NaN halts the job; the on-call engineer approves a rollback that runs the
failing module in fp32, the job is restarted as a scheduler would, and the
rollback reaches it at hello, before its first step.

Everything runs in a temporary folder on free loopback ports and is stopped
on exit, also on Ctrl-C or failure.

  scripts/demo.py [--build DIR] [--keep]
"""

import argparse
import http.server
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = "demo-lm"
# The injected failures (steps of the example trainer) and the run's length.
# NAN_AT is an activation outlier (--outlier-at) that the final norm's naive
# variance turns into NaN in bf16 and not in fp32.
CORRUPT_AT, DRIFT_FROM, NAN_AT, STEPS = 400, 600, 1300, 1400
# The module the reconfiguring rollback runs in fp32 (train_lm.py's NaiveNorm).
FAILING_MODULE = "norm"
# trainwatchd's least stall bound here (its default is 120 s): the example's
# steps take milliseconds, so a pause taken for a hang would show in the demo.
STALL_FLOOR_S = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(text=""):
    print(text, flush=True)


def indent(text, prefix="    "):
    return "\n".join(prefix + line for line in text.rstrip("\n").splitlines())


class Webhook:
    """The pager's far end: Alertmanager's webhook notifications, kept."""

    def __init__(self):
        self.posts = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook.lock:
                    hook.posts.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, status="firing"):
        with self.lock:
            return [a for p in self.posts if p.get("status") == status for a in p["alerts"]]

    def close(self):
        self.server.shutdown()


class Stack:
    """The processes the demo starts, stopped in reverse order on close()."""

    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, argv, **kw):
        log = open(os.path.join(self.work, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=kw.pop("stdout", log), stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
        self.procs.append((name, p))
        return p

    def close(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def wait_http(url, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"demo: {what} did not become ready at {url}")


def prom_query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


class Twctl:
    def __init__(self, path, server):
        self.path, self.env = path, dict(os.environ, TRAINWATCH_SERVER=server)

    def __call__(self, *args, show=True):
        r = subprocess.run([self.path, *args], env=self.env, capture_output=True, text=True)
        if show:
            say(f"  $ twctl {' '.join(args)}")
            say(indent(r.stdout + r.stderr))
        if r.returncode != 0:
            raise RuntimeError(f"twctl {' '.join(args)} exited {r.returncode}: {r.stderr}")
        return r.stdout

    def json(self, *args):
        return json.loads(self(*args, "-o", "json", show=False))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    for tool in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(tool) is None:
            sys.exit(f"demo: {tool} is not installed (make demo installs it)")

    work = tempfile.mkdtemp(prefix="trainwatch-demo.")
    stack, hook = Stack(work), Webhook()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    code = 130
    try:
        code = run(build, work, stack, hook)
    except KeyboardInterrupt:
        say("\ndemo: interrupted; stopping everything it started")
    finally:
        stack.close()
        hook.close()
        if args.keep:
            say(f"demo: files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    say(f"\ndemo finished in {time.time() - started:.0f} s; everything it started has stopped.")
    return code


def run(build, work, stack, hook):
    report = os.path.join(build, "trainwatch-demo-report.html")
    rules = os.path.join(ROOT, "examples/torch/demo_rules.json")
    grpc_port, metrics_port = free_port(), free_port()
    prom_port, am_port = free_port(), free_port()
    server = f"127.0.0.1:{grpc_port}"

    say("== trainwatch demo: a byte-level transformer trained on this machine's CPU, watched")
    say("   by trainwatch; trainwatchd, Prometheus and Alertmanager run on loopback.")
    say(f"   Injected: a corrupted batch at step {CORRUPT_AT}, a logit drift from step "
        f"{DRIFT_FROM} (z-loss off), an activation outlier at step {NAN_AT}")
    say("   that the bf16 final norm turns into NaN.")
    say("   The rule windows are scaled down (examples/torch/demo_rules.json): this run is")
    say(f"   {STEPS:,} steps, not 100,000.\n")

    with open(os.path.join(work, "alertmanager.yml"), "w") as f:
        f.write("route:\n  receiver: hook\n  group_by: [incident]\n  group_wait: 1s\n"
                "  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n"
                f"    webhook_configs:\n      - url: http://127.0.0.1:{hook.port}/pages\n"
                "        send_resolved: true\n")
    stack.start("alertmanager", [
        "prometheus-alertmanager", f"--config.file={work}/alertmanager.yml",
        f"--storage.path={work}/alertmanager", f"--web.listen-address=127.0.0.1:{am_port}",
        "--cluster.listen-address="])
    with open(os.path.join(work, "pager.json"), "w") as f:
        json.dump({"grafana_url": "http://127.0.0.1:3000/d/trainwatch/trainwatch",
                   "receivers": [{"name": "alertmanager", "type": "alertmanager",
                                  "url": f"http://127.0.0.1:{am_port}"}]}, f)
    stack.start("trainwatchd", [
        f"{build}/bin/trainwatchd", "--listen", server,
        "--metrics_listen", f"127.0.0.1:{metrics_port}", "--db", f"{work}/trainwatch.db",
        "--rules", rules, "--pager_config", f"{work}/pager.json",
        "--stall_floor_seconds", str(STALL_FLOOR_S)])
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files: ['{ROOT}/deploy/prometheus/trainwatch-rules.yml']\n"
                "scrape_configs:\n  - job_name: trainwatchd\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    stack.start("prometheus", [
        "prometheus", f"--config.file={work}/prometheus.yml",
        f"--storage.tsdb.path={work}/prometheus", f"--web.listen-address=127.0.0.1:{prom_port}"])
    wait_http(f"http://127.0.0.1:{metrics_port}/metrics", "trainwatchd")
    wait_http(f"http://127.0.0.1:{am_port}/-/ready", "Alertmanager")
    wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "Prometheus")
    say(f"trainwatchd {server} (metrics :{metrics_port}), Prometheus :{prom_port}, "
        f"Alertmanager :{am_port}, webhook receiver :{hook.port}")
    say(f"database, logs and checkpoints in {work} (removed at the end; --keep keeps them)\n")

    env = dict(os.environ, PYTHONPATH=f"{build}/python", OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    with open(rules) as f:
        agent_rules = json.dumps(json.load(f))
    # The job, as the scheduler starts it (and restarts it, unchanged).
    job = ["/usr/bin/python3", "-u", os.path.join(ROOT, "examples/torch/train_lm.py"),
           "--steps", str(STEPS), "--corrupt-at", str(CORRUPT_AT), "--drift-from", str(DRIFT_FROM),
           "--outlier-at", str(NAN_AT), "--server", server, "--run-id", RUN, "--rules",
           agent_rules, "--checkpoint-dir", f"{work}/checkpoints"]
    trainer = stack.start("trainer", job, stdout=subprocess.PIPE, env=env, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(trainer.stdout), daemon=True).start()
    twctl = Twctl(f"{build}/bin/twctl", server)
    # What an operator's terminal shows meanwhile: incident changes as they happen.
    watch = stack.start("watch", [f"{build}/bin/twctl", "watch", "--run", RUN],
                        stdout=subprocess.PIPE, env=twctl.env, text=True)
    threading.Thread(target=lambda: lines.extend("[twctl watch] " + ln for ln in watch.stdout),
                     daemon=True).start()

    say("== training (every 100th step and every decision the agent took), with `twctl watch`")
    say("   showing incident changes as they happen:")
    approved = []

    def approve_tier2():
        if not approved:
            approved.extend(filter(None, [maybe_approve(twctl, hook)]))
    shown = follow(trainer, lines, 0, approve_tier2)
    approved = approved[0] if approved else None
    say(f"  (trainer exited with status {trainer.returncode}: "
        f"{'halted by trainwatch' if trainer.returncode == 3 else 'unexpected'})\n")

    say("== afterwards")
    halted = [i["incident_id"] for i in twctl.json("incidents", "--run", RUN)["incidents"]
              if i["tier"] == "TIER_NUMERICAL_FAILURE"]
    tensors = []
    if halted:
        say("  the halt, and the tensor that held the NaN:")
        twctl("incident", "show", halted[0])
        summary = twctl.json("incident", "show", halted[0])["incident"].get("summary", {})
        tensors = [f"{t['name']} (rank {','.join(str(r) for r in t.get('ranks', []))})"
                   for t in summary.get("tensor_breakdown", [])]
    reconfigured = None
    if halted and trainer.returncode == 3:
        reconfigured = reconfigure(twctl, halted[0], stack, job, env, lines, shown)
    twctl("incidents")
    twctl("shards", RUN)
    twctl("status", RUN)
    twctl("report", RUN, "--out", report)
    time.sleep(2)  # one more scrape
    say("  Prometheus, from its scrape of trainwatchd:")
    for expr in (f'trainwatch_skipped_steps_total{{run="{RUN}"}}',
                 f'sum by (tier) (trainwatch_incidents_total{{run="{RUN}"}})',
                 'trainwatch_pages_sent_total'):
        res = prom_query(prom_port, expr)
        vals = ", ".join((f"tier {r['metric']['tier']}: " if "tier" in r["metric"] else "")
                         + r["value"][1] for r in res)
        say(f"    {expr} -> {vals or 'no data'}")
    say("")
    code = narrate(work, approved, hook, trainer.returncode, tensors, reconfigured)
    say(f"\n  The whole run as one page (charts with every incident marked, the drift the "
        f"rollback undid in dashed grey):\n    {report}")
    return code


def follow(trainer, lines, shown, on_poll=None):
    """Prints the output lines as they come until the trainer exits, calling
    on_poll() between looks; returns how many lines were shown."""
    while True:
        while shown < len(lines):
            say("  " + lines[shown].rstrip())
            shown += 1
        if trainer.poll() is not None:
            break
        if on_poll is not None:
            on_poll()
        time.sleep(0.3)
    time.sleep(0.2)
    for line in lines[shown:]:
        say("  " + line.rstrip())
    return len(lines)


def reconfigure(twctl, incident, stack, job, env, lines, shown):
    """Halt, roll back and reconfigure: approve a rollback that runs the
    failing module in fp32, restart the job with the same command line, and
    follow it past the old failing step. Returns (incident, exit status,
    the incident's state afterwards)."""
    say("\n== halt, roll back and reconfigure: the NaN came from the final norm, whose variance")
    say("   (E[x^2] - E[x]^2) cancels to a negative number in bf16. The engineer approves a")
    say("   rollback that runs that module in fp32, while the job is down:")
    twctl("rollback", "approve", incident, "--precision", f"{FAILING_MODULE}=fp32", "--yes",
          "--comment", "bf16 cancellation in the final norm: run it in fp32")
    say("== the scheduler restarts the job (same command line, same run id); the pending")
    say("   rollback reaches it at hello, before its first step:")
    restarted = stack.start("trainer-restarted", job, stdout=subprocess.PIPE, env=env, text=True)
    threading.Thread(target=lambda: lines.extend(restarted.stdout), daemon=True).start()
    follow(restarted, lines, shown)
    say(f"  (restarted trainer exited with status {restarted.returncode})\n")
    # It resolves once the run has passed the old detection step (stored).
    deadline, state = time.time() + 15, ""
    while time.time() < deadline and state != "INCIDENT_STATE_RESOLVED":
        state = twctl.json("incident", "show", incident)["incident"].get("state", "")
        time.sleep(0.3)
    twctl("incident", "show", incident)
    return incident, restarted.returncode, state


def maybe_approve(twctl, hook):
    """The human in the loop: once a tier 2 incident awaits a decision and its
    page has arrived, read the incident and approve its rollback."""
    open_t2 = [i for i in twctl.json("incidents", "--run", RUN)["incidents"]
               if i["tier"] == "TIER_LOGIT_DRIFT" or i["tier"] == "TIER_NON_RECOVERING"]
    open_t2 = [i for i in open_t2 if i["state"] == "INCIDENT_STATE_AWAITING_DECISION"]
    if not open_t2:
        return None
    inc = open_t2[0]["incident_id"]
    deadline = time.time() + 30
    while not [a for a in hook.alerts() if a["labels"].get("incident") == inc]:
        if time.time() > deadline:
            raise RuntimeError(f"the page for {inc} did not arrive through Alertmanager")
        time.sleep(0.2)
    page = [a for a in hook.alerts() if a["labels"].get("incident") == inc][0]
    say("")
    say(f"== page received through Alertmanager ({page['labels'].get('severity', '')}):")
    say(indent(page["annotations"].get("summary", "")))
    say(indent(page["annotations"].get("description", "")))
    say("== the on-call engineer reads the incident and approves the rollback:")
    twctl("incident", "show", inc)
    twctl("rollback", "approve", inc, "--yes", "--comment", "logit drift: roll back, add z-loss")
    return inc


def narrate(work, incident, hook, trainer_code, nan_tensors, reconfigured):
    db = sqlite3.connect(os.path.join(work, "trainwatch.db"))
    q = lambda sql, *a: db.execute(sql, a).fetchall()
    say("== what happened")
    ok = True
    skips = q("SELECT step, shards FROM events WHERE run_id=? AND action=2 ORDER BY step", RUN)
    for s, shards in skips:
        what = ("the injected corrupted batch" if s == CORRUPT_AT else
                "a batch of real text unlike what the model had seen")
        say(f"  - step {s}: tier 1, {what}. The agent skipped the optimizer update on its "
            f"own, with no round trip; shards {shards.replace(';', ', ')} were recorded.")
    if CORRUPT_AT not in [s for s, _ in skips]:
        ok = False
        say("  - the corrupted batch was NOT skipped")
    if incident:
        iid = int(incident.split("-")[1])
        (onset, det, ckpt), = q("SELECT onset_step, detection_step, checkpoint_step FROM "
                                "incidents WHERE id=?", iid)
        acks = q("SELECT resumed_step, message FROM command_acks WHERE run_id=? AND status=2",
                 RUN)
        quar = q("SELECT first_shard, last_shard FROM quarantined_shards WHERE incident_id=?",
                 iid)
        say(f"  - step {det}: tier 2, logit drift since step {onset}, paged through Alertmanager "
            f"(the webhook got its summary and recommended actions) and approved with twctl.")
        if acks:
            say(f"  - rollback: the trainer resumed from checkpoint {acks[0][0]} "
                f"({acks[0][1]}); quarantined shards "
                + ", ".join(f"{a}..{b}" for a, b in quar) + ".")
        else:
            ok = False
            say("  - the rollback was NOT applied")
        (first, last), = q("SELECT min(attempt), max(attempt) FROM steps WHERE run_id=?", RUN)
        # The level before the drift: the mean over the 200 steps before its
        # onset, steps whose update was skipped left out.
        before = q("SELECT avg(loss) FROM steps WHERE run_id=? AND attempt=? AND decision=0 "
                   "AND step BETWEEN ? AND ?", RUN, first, onset - 200, onset - 1)[0][0]
        during = q("SELECT avg(loss), max(log_z) FROM steps WHERE run_id=? AND attempt=? AND "
                   "decision=0 AND step BETWEEN ? AND ?", RUN, first, onset, det)[0]
        after = q("SELECT max(m) FROM (SELECT avg(loss) m FROM steps WHERE run_id=? AND "
                  "attempt=? AND step BETWEEN ? AND ? GROUP BY step / 50)",
                  RUN, last, onset, det + 300)[0][0]
        logz = q("SELECT max(log_z) FROM steps WHERE run_id=? AND attempt=? AND step BETWEEN ? "
                 "AND ?", RUN, last, onset, det + 300)[0][0]
        say(f"    Between onset and page log_z reached {during[1]:.2f} while the loss averaged "
            f"{during[0]:.3f} ({before:.3f} before): the page came from log_z, ahead of any "
            f"loss spike.")
        if last > first and after is not None:
            say(f"  - after the rollback the run went past the old detection step {det} without "
                f"recurrence: up to step {det + 300} its worst 50-step mean loss was "
                f"{after:.3f}, below the {before:.3f} before the drift; log_z peaked at "
                f"{logz:.2f}.")
            ok = ok and after < before
        else:
            ok = False
    else:
        ok = False
        say("  - the logit drift was NOT paged")
    halt = q("SELECT step, reason FROM events WHERE run_id=? AND action=4", RUN)
    if halt and trainer_code == 3:
        # A NaN in the forward pass reaches every gradient: name a few.
        shown = ", ".join(nan_tensors[:3]) + (f" and {len(nan_tensors) - 3} more"
                                               if len(nan_tensors) > 3 else "")
        where = f"; the NaN was in {shown}" if nan_tensors else ""
        say(f"  - step {halt[0][0]}: tier 3, {halt[0][1]}: the run halted on every rank{where}.")
    else:
        ok = False
        say("  - the NaN did NOT halt the run")
    if reconfigured is None:
        ok = False
        say("  - the halted run was NOT rolled back and reconfigured")
    else:
        inc, code, state = reconfigured
        iid = int(inc.split("-")[1])
        ack = q("SELECT a.resumed_step, a.message FROM command_acks a JOIN commands c ON "
                "c.id = a.command_id WHERE c.incident_id=? AND a.status=2", iid)
        (last,) = q("SELECT max(attempt) FROM steps WHERE run_id=?", RUN)[0]
        passed = q("SELECT loss FROM steps WHERE run_id=? AND attempt=? AND step=?",
                   RUN, last, NAN_AT)
        if ack and code == 0 and passed and state == "INCIDENT_STATE_RESOLVED":
            say(f"  - halt, roll back, reconfigure: approved with --precision "
                f"{FAILING_MODULE}=fp32 while the job was down; the restarted job got the "
                f"rollback at hello and, before its first step, {ack[0][1]}. It passed step "
                f"{NAN_AT} (loss {passed[0][0]:.3f}) and {inc} resolved.")
        else:
            ok = False
            say(f"  - the reconfigured restart did NOT pass step {NAN_AT} "
                f"(exit {code}, {inc} {state}, acks {ack})")
    # Halts, restarts, checkpoints and a human's approval are pauses, not
    # hangs: none may raise a stall (with a floor of STALL_FLOOR_S), a lost
    # rank or a straggler.
    hangs = q("SELECT title FROM incidents WHERE title LIKE 'stalled:%' OR title LIKE "
              "'rank% lost:%' OR title LIKE 'straggler:%'")
    if hangs:
        ok = False
        say("  - a pause was taken for a hang: " + "; ".join(t for t, in hangs))
    else:
        say(f"  - no stall (bound at least {STALL_FLOOR_S} s), lost rank or straggler was "
            f"raised through the halt, the restarts and the approvals.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
