"""Stalls, from the agents' heartbeats (docs/hangs.md), end to end: a DDP
job with no trainwatch import (zero_code/ddp_train.py) under `trainwatch run
-- torchrun` on 4 gloo ranks, streaming to a real trainwatchd that pages a
real Alertmanager (/usr/bin/prometheus-alertmanager), whose webhook this
test receives. Runs in the torch-newest environment.

- One rank blocks before the backward of step S: within 2 minutes one page,
  naming that rank, its host and the line it is blocked at, and where the
  other ranks wait; the job is then killed.
- The same, then the rank is released: the incident resolves by itself,
  with its cost in GPU-hours, and Alertmanager sends the resolution.
- Rank 0 writes a checkpoint that takes longer than the stall bound while
  the others wait: no page.
- One rank works 50% longer each step than the others: a warning page
  naming it and its host within a set number of steps, and no stall.
"""

import http.server
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from trainwatchd_process import Trainwatchd, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "zero_code", "ddp_train.py")
TRAINWATCH = os.environ.get("TRAINWATCH_CLI",
                            os.path.join(os.path.dirname(sys.executable), "trainwatch"))
FLOOR_S = 6  # trainwatchd --stall_floor_seconds: steps take well under a second
RANKS, BLOCK_RANK, BLOCK_STEP = 4, 1, 60
STRAGGLER_STEPS = 40  # trainwatchd --straggler_steps


def kill_tagged(tag):
    """SIGKILLs every process whose command line or environment holds the
    job's tag: its launcher and its ranks, which torchrun starts in sessions
    of their own (a kill of the launcher's group would leave them running)."""
    needle = tag.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            for part in ("cmdline", "environ"):
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if needle in f.read():
                        os.kill(int(pid), signal.SIGKILL)
                        break
        except OSError:
            pass


def source_line(path, text):
    """The line number of the first line of `path` holding `text`."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if text in line:
                return n
    raise AssertionError(f"{text!r} not in {path}")


class Webhook:
    """Alertmanager's webhook receiver: every notification, as received."""

    def __init__(self):
        self.notifications = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with hook.lock:
                    hook.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, status=None):
        """(notification status, alert) for every alert of every notification."""
        with self.lock:
            return [(n["status"], a) for n in self.notifications for a in n["alerts"]
                    if status is None or n["status"] == status]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    def __init__(self, folder, webhook_port):
        config = os.path.join(folder, "alertmanager.yml")
        with open(config, "w") as f:
            f.write("route:\n  receiver: hook\n  group_by: ['incident']\n  group_wait: 1s\n"
                    "  group_interval: 1s\n  repeat_interval: 1h\n"
                    "receivers:\n  - name: hook\n    webhook_configs:\n"
                    f"      - url: http://127.0.0.1:{webhook_port}/hook\n"
                    "        send_resolved: true\n")
        self.port = free_port()
        self.log = open(os.path.join(folder, "alertmanager.log"), "w+")
        self.process = subprocess.Popen(
            ["/usr/bin/prometheus-alertmanager", f"--config.file={config}",
             f"--storage.path={os.path.join(folder, 'am-data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("Alertmanager did not start")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=20)
        self.log.close()


class HangTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.webhook = Webhook()
        self.alertmanager = Alertmanager(self.work.name, self.webhook.port)
        pager = os.path.join(self.work.name, "pager.json")
        with open(pager, "w") as f:
            json.dump({"receivers": [{"name": "am", "type": "alertmanager",
                                      "url": f"http://127.0.0.1:{self.alertmanager.port}"}]}, f)
        self.daemon = Trainwatchd("--pager_config", pager, f"--stall_floor_seconds={FLOOR_S}",
                                  f"--straggler_steps={STRAGGLER_STEPS}")
        self.job = None

    def tearDown(self):
        self.kill_job()
        if self.job is not None:
            self.out.close()
        self.daemon.stop()
        self.alertmanager.stop()
        self.webhook.stop()
        self.work.cleanup()

    def kill_job(self):
        if self.job is not None:
            kill_tagged(self.tag)
            self.job.wait()

    def start_job(self, run_id, *args):
        self.tag = f"tw-test-{os.getpid()}-{run_id}"
        self.out = open(os.path.join(self.work.name, run_id + ".log"), "w+")
        self.job = subprocess.Popen(
            [TRAINWATCH, "run", "--server", self.daemon.address, "--run-id", run_id, "--",
             sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={RANKS}", TRAIN, "--tag", self.tag, *args],
            stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", TRAINWATCH_HEARTBEAT_MS="500",
                     TW_TEST_TAG=self.tag))

    def output(self):
        self.out.seek(0)
        return self.out.read()[-6000:]

    def wait_for(self, what, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            self.assertIsNone(self.job.poll(), self.output())
            time.sleep(0.2)
        self.fail(f"timed out after {timeout} s; job output:\n{self.output()}")

    def incidents(self, run_id):
        db = sqlite3.connect(self.daemon.db)
        try:
            return db.execute("SELECT state, title FROM incidents WHERE run_id=? ORDER BY id",
                              (run_id,)).fetchall()
        finally:
            db.close()

    def block(self, run_id, release=""):
        marker = os.path.join(self.work.name, "blocked")
        self.start_job(run_id, "--steps", "100000", "--block-rank", str(BLOCK_RANK),
                       "--block-step", str(BLOCK_STEP), "--marker", marker,
                       *(["--release", release] if release else []))
        def blocked():
            if os.path.exists(marker):
                with open(marker) as f:
                    return f.read()
        blocked_at = float(self.wait_for(blocked, 180))
        firing = self.wait_for(lambda: self.webhook.alerts("firing"), 120)
        paged_after = time.time() - blocked_at
        print(f"\n  paged {paged_after:.1f} s after rank {BLOCK_RANK} blocked "
              f"(stall floor {FLOOR_S} s)")
        self.assertLess(paged_after, 120)
        self.assertEqual(len(firing), 1, firing)
        alert = firing[0][1]
        self.assertEqual(alert["labels"]["run"], run_id)
        title, description = alert["annotations"]["summary"], alert["annotations"]["description"]
        print(f"  {title}\n  {description[:600]}")
        # The rank behind, its host, and the line its training thread is at.
        wait_line = source_line(TRAIN, "time.sleep(0.05)")
        where = (f"rank {BLOCK_RANK} on host {socket.gethostname()} (local rank {BLOCK_RANK})"
                 f" is in step {BLOCK_STEP}")
        self.assertIn(where, description)
        self.assertIn(f"at ddp_train.py:{wait_line} in wait_for_release", description)
        # Where the others are: in backward (DDP's all-reduce), at the line.
        backward_line = source_line(TRAIN, "loss.backward()")
        self.assertIn(f"{RANKS - 1} ranks wait in backward at ddp_train.py:{backward_line} in "
                      f"main (step {BLOCK_STEP})", description)
        # The stuck rank's stack, and the cost so far.
        self.assertIn(f"ddp_train.py:{wait_line} in wait_for_release", description)
        self.assertIn("GPU-hours (4 ranks idle)", description)
        return title

    def test_a_blocked_rank_is_paged_once_naming_it(self):
        self.block("hang")
        # Paged once: nothing more arrives while the job stays stuck.
        time.sleep(4)
        self.assertEqual(len(self.webhook.alerts("firing")), 1, self.webhook.notifications)
        self.assertEqual([s for s, _ in self.incidents("hang")], [1])  # one, open
        self.kill_job()

    def test_the_incident_resolves_when_steps_resume(self):
        release = os.path.join(self.work.name, "release")
        self.block("resumes", release=release)
        open(release, "w").close()
        resolved = self.wait_for(lambda: self.webhook.alerts("resolved"), 60)
        self.assertEqual(resolved[0][1]["labels"]["run"], "resumes")
        (state, title), = self.incidents("resumes")
        self.assertEqual(state, 5, title)  # resolved
        print(f"  resolved: {title}")
        self.assertRegex(title, rf"^stalled in step {BLOCK_STEP} for \d+ s, then it stepped on; "
                                r"cost \d\.\d{3} GPU-hours \(4 ranks\)$")
        self.kill_job()

    def test_a_long_checkpoint_is_not_a_stall(self):
        # Rank 0's torch.save takes 2.5 stall floors; the others wait in the
        # next backward. The agent reads torch.save on its stack: a
        # checkpoint, which has a longer bound.
        self.start_job("checkpoints", "--steps", "80", "--checkpoint-step", "40",
                       "--checkpoint-seconds", str(2.5 * FLOOR_S),
                       "--checkpoint", os.path.join(self.work.name, "ckpt.pt"))
        self.assertEqual(self.job.wait(timeout=300), 0, self.output())
        time.sleep(2)
        self.assertEqual(self.webhook.notifications, [])
        self.assertEqual(self.incidents("checkpoints"), [])
        self.assertIn("rank 0: 80 steps", self.output())

    def test_a_straggler_is_named(self):
        # Rank 2 works 60 ms per step, the others 40: everyone steps at rank
        # 2's pace, the others waiting in backward (DDP's all-reduce).
        self.start_job("straggles", "--steps", "400", "--work-ms", "40", "--slow-rank", "2",
                       "--slow-factor", "1.5")
        firing = self.wait_for(lambda: self.webhook.alerts("firing"), 240)
        self.assertEqual(len(firing), 1, firing)
        alert = firing[0][1]
        self.assertEqual(alert["labels"]["severity"], "warning")
        description = alert["annotations"]["description"]
        print(f"\n  {description}")
        self.assertRegex(description, rf"^straggler: rank 2 on host {socket.gethostname()} "
                                      r"\(local rank 2\) takes 1\.\d\dx the median rank's time")
        ratio = float(description.split(" takes ")[1].split("x")[0])
        self.assertGreater(ratio, 1.2)
        # Named within the set number of steps, after a window of 16 for
        # the medians and the 32 of the agents' window to fill past the
        # ratio: well before step 150.
        step = int(self.query_one("SELECT detection_step FROM incidents WHERE run_id='straggles'"))
        self.assertLess(step, 150)
        self.assertEqual(self.job.wait(timeout=300), 0, self.output())
        kinds = [t for _, t in self.incidents("straggles")]
        self.assertFalse(any(t.startswith("stalled") for t in kinds), kinds)

    def query_one(self, sql):
        db = sqlite3.connect(self.daemon.db)
        try:
            return db.execute(sql).fetchone()[0]
        finally:
            db.close()


if __name__ == "__main__":
    unittest.main()
