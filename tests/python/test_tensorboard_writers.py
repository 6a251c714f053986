"""TensorBoard event files as the real writers make them, read by twctl.

tests/testing/write_tfevents.py imitates torch's SummaryWriter byte for byte from
the format's description; here the files come from the writers themselves, as
installed from the package index: torch.utils.tensorboard.SummaryWriter
(add_scalar's simple_value, new_style float tensors, double_precision) and the
tensorboard package's own framework-free writer, tensorboard.summary.Writer
(a float32 tensor per scalar, through its EventFileWriter). Under the tag
names users write (train/loss, loss, Loss/train, grad_norm, ...):

  - twctl replay of the folder gives the events, and the record count, that it
    gives for a CSV of the same values: the reader lost nothing and changed
    nothing, and a bad batch is skipped and a NaN halts at their steps;
  - twctl follow of the folder, against a real trainwatchd, stores every value
    as written (float32, as the writers keep it) and picks up the scalars a
    writer appends while it runs, and the server halts at the NaN's step.
"""

import csv
import json
import math
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
import unittest

import numpy as np
from tensorboard.summary import Writer as TensorBoardWriter
from torch.utils.tensorboard import SummaryWriter

from trainwatchd_process import DaemonTestCase

# Rule windows scaled down to a 300-step run, as the other daemon tests do.
RULES = {"warmup_steps": 100, "warmup_min_records": 20, "warmup_min_grad_samples": 20}
STEPS, BAD_BATCH, NAN_AT = 300, 200, 250


def series(steps=STEPS, bad_batch=BAD_BATCH, nan_at=NAN_AT):
    """(step, loss, grad_norm) of a healthy run with step noise, one garbage
    batch (loss +3, grad norm x8) and a NaN loss and grad norm from nan_at on;
    rounded to float32, the precision the writers keep."""
    rng = np.random.default_rng(7)
    out = []
    for s in range(steps):
        loss = 2.2 + 1.5 * math.exp(-s / 120) + 0.02 * rng.standard_normal()
        grad = 1.1 * math.exp(0.1 * rng.standard_normal())
        if s == bad_batch:
            loss, grad = loss + 3.0, grad * 8.0
        if nan_at is not None and s >= nan_at:
            loss = grad = float("nan")
        out.append((s, float(np.float32(loss)), float(np.float32(grad))))
    return out


def torch_simple(folder, tags, rows):
    """torch's SummaryWriter as trainers call it: add_scalar's simple_value."""
    w = SummaryWriter(folder)
    for s, loss, grad in rows:
        w.add_scalar(tags[0], loss, s)
        w.add_scalar(tags[1], grad, s)
        w.add_scalar("perf/tokens_per_second", 5e4, s)  # no signal's name: read past
        if s % 100 == 0:
            w.add_text("note", f"step {s}", s)  # read past
    w.close()


def torch_new_style(folder, tags, rows):
    """add_scalar(new_style=True): a float tensor; the grad norm in double."""
    w = SummaryWriter(folder)
    for s, loss, grad in rows:
        w.add_scalar(tags[0], loss, s, new_style=True)
        w.add_scalar(tags[1], grad, s, new_style=True, double_precision=True)
        if s % 100 == 0:
            w.add_histogram("weights", np.arange(10, dtype=np.float32) + s, s)  # read past
    w.close()


def tensorboard_writer(folder, tags, rows):
    """The tensorboard package's own writer (no TensorFlow, no torch)."""
    w = TensorBoardWriter(folder)
    for s, loss, grad in rows:
        w.add_scalar(tags[0], loss, s)
        w.add_scalar(tags[1], grad, s)
    w.close()


WRITERS = {"torch SummaryWriter": torch_simple,
           "torch SummaryWriter new_style": torch_new_style,
           "tensorboard.summary.Writer": tensorboard_writer}
TAGS = [("train/loss", "train/grad_norm"), ("loss", "grad_norm"), ("Loss/train", "grad_norm")]


def twctl(*args, check=True):
    p = subprocess.run([os.environ["TWCTL"], *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"twctl {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "loss", "grad_norm"])
        for s, loss, grad in rows:
            out.writerow([s, repr(loss), repr(grad)])


def events(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def records_in_summary(out):
    for line in out.splitlines():
        if line.startswith("records "):
            return int(line.split()[1].rstrip(","))
    raise AssertionError(f"no records line in:\n{out}")


class ReplayTest(unittest.TestCase):
    """Replay of each real writer's folder against the same values as CSV."""

    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.addCleanup(self.work.cleanup)

    def config(self):
        path = os.path.join(self.work.name, "rules.json")
        with open(path, "w") as f:
            json.dump(RULES, f)
        return path

    def test_each_writer_and_tag_naming_replays_as_the_values_written(self):
        rows = series()
        config = self.config()
        csv_path = os.path.join(self.work.name, "same.csv")
        write_csv(csv_path, rows)
        want = events(twctl("replay", csv_path, "--config", config, "-o", "json").stdout)
        kinds = [(e["step"], e["action"]) for e in want]
        # The CSV's own verdict, which every folder must reproduce.
        self.assertIn((BAD_BATCH, "skip_update"), kinds)
        self.assertIn((NAN_AT, "halt"), kinds)
        for name, write in WRITERS.items():
            for tags in TAGS:
                with self.subTest(writer=name, tags=tags):
                    folder = os.path.join(self.work.name, f"{write.__name__}-{tags[0]}".replace(
                        "/", "_"))
                    write(folder, tags, rows)
                    self.assertTrue(any(f.startswith("events.out.tfevents.")
                                        for f in os.listdir(folder)))
                    got = events(twctl("replay", folder, "--config", config, "-o", "json").stdout)
                    self.assertEqual(got, want)
                    summary = twctl("replay", folder, "--config", config, "--summary").stdout
                    self.assertEqual(records_in_summary(summary), STEPS)
                    self.assertIn(f"halted at step {NAN_AT}", summary)

    def test_a_tag_of_its_own_is_read_with_map(self):
        rows = series(steps=150, bad_batch=-1, nan_at=120)
        folder = os.path.join(self.work.name, "mapped")
        tensorboard_writer(folder, ("objective/total", "optimizer/gnorm"), rows)
        p = twctl("replay", folder, "-o", "json", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--map", p.stderr)
        got = events(twctl("replay", folder, "--config", self.config(), "-o", "json", "--map",
                           "loss=objective/total,grad_norm=optimizer/gnorm").stdout)
        halts = [e for e in got if e["action"] == "halt"]
        self.assertEqual([e["step"] for e in halts], [120])
        self.assertEqual(halts[0]["tier"], 3)

    def test_a_restarted_writer_in_the_same_folder_replaces_the_steps_it_logs_again(self):
        # A trainer resumed from step 90's checkpoint opens a second writer on
        # the folder: a second file, whose steps 90.. win by wall time.
        first = series(steps=120, bad_batch=-1, nan_at=None)
        again = [(s, loss + 0.5, grad) for s, loss, grad in series(steps=160, bad_batch=-1,
                                                                   nan_at=None)[90:]]
        folder = os.path.join(self.work.name, "restarted")
        torch_simple(folder, ("train/loss", "train/grad_norm"), first)
        time.sleep(1.1)  # the file name carries the second it was made
        torch_simple(folder, ("train/loss", "train/grad_norm"), again)
        self.assertEqual(len(os.listdir(folder)), 2)
        merged = first[:90] + again
        csv_path = os.path.join(self.work.name, "merged.csv")
        write_csv(csv_path, merged)
        summary = twctl("replay", folder, "--summary").stdout
        self.assertEqual(records_in_summary(summary), 160)
        self.assertEqual(twctl("replay", folder, "-o", "json").stdout,
                         twctl("replay", csv_path, "-o", "json").stdout)


class FollowTest(DaemonTestCase):
    """twctl follow of a folder a real writer is still writing."""

    def stored(self, run):
        conn = sqlite3.connect(f"file:{self.daemon.db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT step, loss, grad_norm, present FROM steps WHERE run_id = ? "
                                "ORDER BY attempt, step", (run,)).fetchall()
        finally:
            conn.close()

    def halts(self, run):
        conn = sqlite3.connect(f"file:{self.daemon.db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT step, tier FROM events WHERE run_id = ? AND tier = 3",
                                (run,)).fetchall()
        finally:
            conn.close()

    def wait_rows(self, run, n, timeout_s=60.0):  # generous: a shared, loaded machine
        deadline = time.monotonic() + timeout_s
        rows = []
        while time.monotonic() < deadline:
            try:
                rows = self.stored(run)
            except sqlite3.OperationalError:  # the table is made at the first record
                rows = []
            if len(rows) >= n:
                return rows
            time.sleep(0.05)
        raise AssertionError(f"{run}: {len(rows)} rows stored after {timeout_s} s, want {n}:\n"
                             + self.log(run))

    def log(self, run):
        with open(os.path.join(self.work.name, run + ".log")) as f:
            return f.read()

    def follow(self, folder, run):
        log = open(os.path.join(self.work.name, run + ".log"), "w")
        p = subprocess.Popen([os.environ["TWCTL"], "follow", folder, "--run", run, "--server",
                              self.daemon.address, "--poll-interval", "10", "--status-interval",
                              "1"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return p

    def stop(self, p, run):
        p.send_signal(signal.SIGTERM)  # sends the last step, held for more tags
        rc = p.wait(timeout=60)
        self.assertEqual(rc, 0, self.log(run))

    def check_values(self, stored, rows):
        self.assertEqual([r[0] for r in stored], [r[0] for r in rows])
        for (step, loss, grad, present), (_, want_loss, want_grad) in zip(stored, rows):
            with self.subTest(step=step):
                # Both written (present bits 0 and 1); a NaN is stored as NULL.
                self.assertEqual(present & 3, 3)
                for got, want in ((loss, want_loss), (grad, want_grad)):
                    if math.isnan(want):
                        self.assertIsNone(got)
                    else:
                        self.assertEqual(got, want)  # exactly the float32 written

    def test_scalars_appended_while_it_runs_are_stored_as_written(self):
        rows = series(steps=120, bad_batch=-1, nan_at=100)
        for name, tags in (("torch", ("train/loss", "train/grad_norm")),
                           ("tensorboard", ("loss", "grad_norm"))):
            with self.subTest(writer=name):
                folder = os.path.join(self.work.name, name)
                os.makedirs(folder)
                w = (SummaryWriter(folder) if name == "torch" else TensorBoardWriter(folder))
                follow = self.follow(folder, name)
                try:
                    for chunk in (rows[:40], rows[40:90], rows[90:]):
                        for s, loss, grad in chunk:
                            w.add_scalar(tags[0], loss, s)
                            w.add_scalar(tags[1], grad, s)
                        w.flush()
                        # Every step but the last, which waits for more tags.
                        self.wait_rows(name, chunk[-1][0])
                    w.close()
                finally:
                    self.stop(follow, name)
                self.check_values(self.stored(name), rows)
                self.assertEqual(self.halts(name), [(100, 3)])


if __name__ == "__main__":
    unittest.main()
