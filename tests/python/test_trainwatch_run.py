"""`trainwatch run -- COMMAND` against a real trainwatchd, with training
scripts that hold no trainwatch import (zero_code/): run in a torch 2.x test
environment (Debian's /usr/bin/python3 in a venv, tests/python/env), where
the wheel installed the `trainwatch` console script beside the interpreter.

Failures are injected from outside the script (zero_code/inject.py runs it
with runpy): a corrupted batch at BAD, a NaN in one gradient element at NAN.
Every case checks what trainwatchd stored against what the script printed."""

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import unittest

from trainwatchd_process import DaemonTestCase

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "readme"))
import doc_snippets  # noqa: E402  (tests/readme: the documentation's tested snippets)

ZERO = os.path.join(HERE, "zero_code")
TRAIN = os.path.join(ZERO, "nanogpt_train.py")
INJECT = os.path.join(ZERO, "inject.py")
FSDP = os.path.join(ZERO, "fsdp_train.py")
# The console script the wheel installs; `python -m trainwatch` is the same.
TRAINWATCH = os.environ.get("TRAINWATCH_CLI",
                            os.path.join(os.path.dirname(sys.executable), "trainwatch"))
RULES = json.dumps({"warmup_steps": 20, "warmup_min_records": 10,
                    "warmup_min_grad_samples": 10, "ema_span_steps": 10})
BAD, NAN, STEPS, ACCUM = 40, 50, 60, 4
TENSOR = "transformer.h.1.mlp.0.weight"
SKIP, HALT = 2, 4  # events.action


def printed(stdout):
    """{step: (loss, norm)} as the script printed them."""
    return {int(m[1]): (float(m[2]), float(m[3]))
            for m in re.finditer(r"^step (\d+) loss (\S+) norm (\S+)$", stdout, re.M)}


class TrainwatchRunTest(DaemonTestCase):
    def run_job(self, command, *options, env=None, timeout=300):
        full = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
        full.pop("TRAINWATCH_RUN_ID", None)
        p = subprocess.run([TRAINWATCH, "run", "--server", self.daemon.address, "--rules",
                            RULES, *options, "--", *command], capture_output=True, text=True,
                           timeout=timeout, env=full, cwd=self.work.name)
        return p

    def injected(self, *script_args, bad=BAD, nan=NAN, nan_rank=0, snapshot=None):
        cmd = [sys.executable, INJECT, "--bad", str(bad), "--nan", str(nan), "--tensor", TENSOR,
               "--accum", str(ACCUM), "--nan-rank", str(nan_rank)]
        if snapshot:
            cmd += ["--snapshot", snapshot]
        return cmd + [TRAIN, "--steps", str(STEPS), "--accum", str(ACCUM), *script_args]

    def query(self, sql, *args):
        db = sqlite3.connect(self.daemon.db)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def check_skip_and_halt(self, p, run, ranks=1, nan_rank=0):
        out = f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-5000:]}"
        self.assertEqual(p.returncode, 3, out)
        self.assertNotIn("finished", p.stdout, out)
        halts = [l for l in p.stderr.splitlines() if l.startswith("trainwatch: halted at step")]
        self.assertTrue(halts, out)
        self.assertIn(f"halted at step {NAN} (tier 3", halts[0])
        self.assertTrue(any(f"on rank {nan_rank}: {TENSOR} (1 of" in l for l in halts), out)
        skips = [l for l in p.stderr.splitlines() if "skipped the update of step" in l]
        self.assertEqual(len(skips), 1, out)
        self.assertIn(f"step {BAD} (tier 1", skips[0])
        self.assertEqual(self.query("SELECT step, action FROM events WHERE run_id=? AND "
                                    "action IN (?, ?) ORDER BY step", run, SKIP, HALT),
                         [(BAD, SKIP), (NAN, HALT)])
        self.assertEqual(self.query("SELECT world_size, observed FROM runs WHERE run_id=?", run),
                         [(ranks, 0)])
        # Every step the script printed is stored with its loss and its norm.
        stored = {s: (l, g) for s, l, g in self.query(
            "SELECT step, loss, grad_norm FROM steps WHERE run_id=?", run)}
        shown = printed(p.stdout)
        self.assertEqual(sorted(shown), list(range(NAN)), out)
        for step, (loss, norm) in shown.items():
            self.assertLessEqual(abs(stored[step][0] - loss), 1e-6 * abs(loss), step)
            self.assertLessEqual(abs(stored[step][1] - norm), 1e-6 * abs(norm), step)
        self.assertIn(NAN, stored)

    def status(self, run):
        p = subprocess.run([os.environ["TWCTL"], "--server", self.daemon.address, "status", run],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def check_snapshot(self, path):
        with open(path) as f:
            snap = json.load(f)
        self.assertTrue(snap["params"] > 0 and snap["state"] > 0, snap)
        self.assertEqual(snap["changed"], [], "a skipped update changed these")

    def test_plain_loop_one_process(self):
        snap = os.path.join(self.work.name, "snap0.json")
        p = self.run_job(self.injected(snapshot=snap), "--run-id", "plain")
        self.check_skip_and_halt(p, "plain")
        self.check_snapshot(snap)
        summary = [l for l in p.stderr.splitlines() if l.startswith("trainwatch: attached:")]
        self.assertEqual(len(summary), 1, p.stderr)
        for found in ("optimizers: AdamW", "the trainer's clip call", "logits: lm_head "
                      "(vocabulary 32", "layout: one process", "shards: none",
                      "mode: enforcing"):
            self.assertIn(found, summary[0])
        # Until the bad batch the job trains as without trainwatch: its clip
        # scaled by the verdict's norm is torch's clip.
        alone = subprocess.run(self.injected(), capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=self.work.name)
        self.assertEqual(alone.returncode, 0, alone.stderr[-3000:])
        ref, got = printed(alone.stdout), printed(p.stdout)
        for step in range(BAD):
            for i in (0, 1):  # loss and norm
                self.assertLessEqual(abs(got[step][i] - ref[step][i]), 1e-5 * abs(ref[step][i]),
                                     step)
        # trainwatchd keeps what was found with the run, for twctl status.
        self.assertIn("  trainwatch run: " + summary[0][len("trainwatch: attached: "):] + "\n",
                      self.status("plain"))

    def test_plain_loop_under_torchrun_ddp(self):
        snap = os.path.join(self.work.name, "snap.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--standalone", "--max-restarts", "1",
               *self.injected(nan_rank=1, snapshot=snap)[1:]]  # torchrun runs the script
        p = self.run_job(cmd, "--run-id", "ddp")
        self.check_skip_and_halt(p, "ddp", ranks=2, nan_rank=1)
        # Both ranks skipped, bit for bit.
        self.check_snapshot(snap + ".rank0")
        self.check_snapshot(snap + ".rank1")
        self.assertIn("layout: DDP (replicated on 2 ranks)", p.stderr)
        # torchrun restarted the halted group once: the restart refused to
        # train into the same failure.
        self.assertIn("not restarting: this job was halted", p.stderr)

    def check_stored_as_printed(self, p, run, steps):
        self.assertEqual(p.returncode, 0, p.stderr[-4000:])
        stored = {s: (l, g) for s, l, g in self.query(
            "SELECT step, loss, grad_norm FROM steps WHERE run_id=?", run)}
        shown = printed(p.stdout)
        self.assertEqual(sorted(shown), list(range(steps)), p.stdout)
        self.assertEqual(sorted(stored), list(range(steps)))
        for step, (loss, norm) in shown.items():
            self.assertLessEqual(abs(stored[step][0] - loss), 1e-6 * abs(loss), step)
            self.assertLessEqual(abs(stored[step][1] - norm), 1e-6 * abs(norm), step)

    def test_fsdp2_under_torchrun(self):
        # The script prints get_total_norm's pre-clip norm (.full_tensor()),
        # as torch's clip_grad_norm_ returns it.
        p = self.run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", FSDP, "--clip"], "--run-id", "fsdp2")
        self.check_stored_as_printed(p, "fsdp2", 8)
        self.assertIn("layout: DTensor placements", p.stderr)
        self.assertIn("the trainer's clip call", p.stderr)

    def test_fsdp2_x_tp_with_a_norm_on_the_dp_sub_mesh(self):
        # 2 x 2 (dp, tp): the embedding and the LayerNorm are outside the TP
        # plan, FSDP2 shards them on the dp sub-mesh; the script prints the
        # norm of the gathered full gradients.
        p = self.run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "4", FSDP, "--tp"], "--run-id", "fsdp2tp")
        self.check_stored_as_printed(p, "fsdp2tp", 8)
        self.assertIn("ranks: 4", p.stderr)

    def test_no_clip_fused_adamw(self):
        snap = os.path.join(self.work.name, "snap0.json")
        p = self.run_job(self.injected("--no-clip", "--fused", snapshot=snap),
                         "--run-id", "fused")
        self.check_skip_and_halt(p, "fused")
        self.check_snapshot(snap)
        self.assertIn("optimizers: AdamW (fused)", p.stderr)
        self.assertIn("grad norm: computed at optimizer.step()", p.stderr)

    def test_grad_scaler_overflows_are_tier_0(self):
        # fp16 autocast on the CPU with a GradScaler: the bad batch is
        # skipped as without one; the NaN gradient is to the scaler an
        # overflow, whose update it skips itself: recorded, tier 0, no halt.
        p = self.run_job(self.injected("--scaler", "--init-scale", str(2.0 ** 14)),
                         "--run-id", "scaler")
        out = p.stderr[-4000:]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("finished", p.stdout)
        self.assertIn(f"skipped the update of step {BAD} (tier 1", p.stderr)
        self.assertIn("GradScaler's scale taken out", p.stderr)
        self.assertEqual(self.query("SELECT step, decision, loss_scale FROM steps WHERE "
                                    "run_id='scaler' AND loss_scale_overflow=1"),
                         [(NAN, 0, 2.0 ** 14)])  # continue
        self.assertEqual(self.query("SELECT step, action FROM events WHERE run_id='scaler' "
                                    "AND action IN (?, ?)", SKIP, HALT), [(BAD, SKIP)])
        # The scale is taken out of the loss the trainer backpropagated.
        stored = dict(self.query("SELECT step, loss FROM steps WHERE run_id='scaler'"))
        shown = printed(p.stdout)
        self.assertEqual(sorted(shown), list(range(STEPS)))
        for step, (loss, _) in shown.items():
            self.assertLessEqual(abs(stored[step] - loss), 1e-6 * abs(loss), step)

    def test_dataloader_workers_hold_no_agent(self):
        for context in ("fork", "spawn"):
            with self.subTest(context=context):
                probe = os.path.join(self.work.name, f"workers-{context}")
                p = self.run_job(self.injected("--loader-workers", "2", "--steps", "3",
                                               bad=-1, nan=-1) + [],
                                 "--run-id", f"loader-{context}",
                                 env={"INJECT_PROBE_WORKERS": probe,
                                      "INJECT_WORKER_CONTEXT": context})
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                seen = [json.load(open(os.path.join(probe, f))) for f in os.listdir(probe)]
                self.assertEqual(len(seen), 2, seen)
                for worker in seen:
                    self.assertFalse(worker["agent"], worker)
                    self.assertFalse(worker["attached"], worker)
                    self.assertEqual(worker["server_sockets"], 0, worker)
                if context == "spawn":  # never even loaded
                    self.assertTrue(all(not w["loaded"] for w in seen), seen)
                self.assertEqual(self.query("SELECT count(*) FROM steps WHERE run_id=?",
                                            f"loader-{context}"), [(3,)])

    def test_a_restarted_job_counts_on_from_the_stored_steps(self):
        # The script counts from 0 each launch; trainwatch counts on from the
        # last step trainwatchd holds for the run, so a restart adds records.
        for _ in range(2):
            p = self.run_job([sys.executable, TRAIN, "--steps", "4"], "--run-id", "again")
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual([s for (s,) in self.query("SELECT step FROM steps WHERE run_id='again' "
                                                   "ORDER BY step")], list(range(8)))

    def test_existing_sitecustomize_still_runs(self):
        theirs = os.path.join(self.work.name, "theirs")
        os.makedirs(theirs)
        marker = os.path.join(self.work.name, "marker")
        with open(os.path.join(theirs, "sitecustomize.py"), "w") as f:
            f.write(f"import sys; open({marker!r}, 'a').write(' '.join(sys.orig_argv) + '\\n')\n")
        path = os.pathsep.join(p for p in (theirs, os.environ.get("PYTHONPATH")) if p)
        p = self.run_job([sys.executable, TRAIN, "--steps", "3"], "--run-id", "site",
                         env={"PYTHONPATH": path})
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(marker) as f:  # in the job's process (and the launcher's)
            self.assertEqual(len([l for l in f if l.split()[1:2] == [TRAIN]]), 1)
        self.assertEqual(self.query("SELECT count(*) FROM steps WHERE run_id='site'"), [(3,)])

    def test_explain_stops_after_the_summary(self):
        p = subprocess.run([sys.executable, "-m", "trainwatch", "run", "--explain", "--",
                            sys.executable, TRAIN], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("trainwatch: attached: ranks: 1; optimizers: AdamW", p.stderr)
        self.assertNotIn("step 0", p.stdout)

    def test_observe_only_claims_no_skip(self):
        p = self.run_job(self.injected(), "--run-id", "observed", "--observe-only")
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])  # never halted
        self.assertIn("finished", p.stdout)
        self.assertIn(f"would skip (observe-only) step {BAD}", p.stderr)
        self.assertIn(f"would halt (observe-only): halted at step {NAN}", p.stderr)
        self.assertEqual(self.query("SELECT observed FROM runs WHERE run_id='observed'"),
                         [(1,)])
        self.assertEqual(self.query("SELECT kind FROM decisions WHERE run_id='observed' "
                                    "ORDER BY id"), [("skip_recommended",),
                                                     ("halt_recommended",)])

    def test_optimizer_that_updates_without_gradients(self):
        # An optimizer of the user's own that decays every parameter, a
        # gradient or not: a skip that only dropped the gradients would
        # still change the weights. A plain step() is gated (not called at
        # all on a skip): exact. step(closure) can only drop gradients:
        # observe-only, said, and no skip claimed.
        script = os.path.join(self.work.name, "decay.py")
        with open(script, "w") as f:
            f.write(DECAY_TRAINER)
        for mode, run in (("plain", "decay-plain"), ("closure", "decay-closure")):
            with self.subTest(mode=mode):
                p = self.run_job([sys.executable, script, mode,
                                  os.path.join(self.work.name, run + ".json")], "--run-id", run)
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                with open(os.path.join(self.work.name, run + ".json")) as f:
                    result = json.load(f)
                if mode == "plain":
                    self.assertIn("skipped the update of step 30", p.stderr)
                    self.assertTrue(result["unchanged_at_30"], result)
                    self.assertEqual(self.query("SELECT observed FROM runs WHERE run_id=?",
                                                run), [(0,)])
                else:
                    self.assertIn("observe-only on rank 0: DecayEverything.step(closure)",
                                  p.stderr)
                    self.assertNotIn("skipped the update", p.stderr)
                    self.assertIn("would skip (observe-only) step 30", p.stderr)
                    self.assertFalse(result["unchanged_at_30"], result)
                    self.assertEqual(self.query("SELECT observed FROM runs WHERE run_id=?",
                                                run), [(1,)])

    def test_not_attached_never_breaks_the_job_unless_required(self):
        env = {"WORLD_SIZE": "2"}  # ranks, but no process group
        p = self.run_job([sys.executable, TRAIN, "--steps", "3"], "--run-id", "lost", env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("finished", p.stdout)
        self.assertIn("trainwatch: not attached: WORLD_SIZE is 2 but torch.distributed is not "
                      "initialized", p.stderr)
        # The run is on record as unwatched, and why.
        self.assertIn("  trainwatch run: not attached: WORLD_SIZE is 2", self.status("lost"))
        p = self.run_job([sys.executable, TRAIN, "--steps", "3"], "--run-id", "lost", "--require",
                         env=env)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertNotIn("step 0", p.stdout)

    def test_readme_quick_start(self):
        # The README's command, with its address made the test daemon's and
        # its job this folder's nanoGPT-style script on 2 ranks.
        code, page = doc_snippets.snippet("trainwatch-run", "sh",
                                          root=os.path.join(HERE, "..", ".."))
        for old, new in (("127.0.0.1:7070", self.daemon.address),
                         ("torchrun --nproc-per-node 8 train.py",
                          f"{sys.executable} -m torch.distributed.run --standalone "
                          f"--nproc-per-node 2 {TRAIN} --steps 5"),
                         ("trainwatch run", f"{TRAINWATCH} run")):
            self.assertIn(old, code, page)
            code = code.replace(old, new)
        p = subprocess.run(["sh", "-c", code], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=self.work.name)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("layout: DDP (replicated on 2 ranks)", p.stderr)
        self.assertEqual(self.query("SELECT count(*), max(step) FROM steps WHERE run_id='my-run'"),
                         [(5, 4)])

    def test_exit_status_and_usage(self):
        p = subprocess.run([TRAINWATCH, "run", "--", sys.executable, "-c", "raise SystemExit(5)"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 5, p.stderr)
        p = subprocess.run([TRAINWATCH, "run", "--", "no-such-command-here"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 127)
        self.assertIn("no-such-command-here: command not found", p.stderr)
        p = subprocess.run([TRAINWATCH, "run"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no COMMAND given", p.stderr)


DECAY_TRAINER = textwrap.dedent("""
    import json, sys
    import torch
    import torch.nn.functional as F

    class DecayEverything(torch.optim.Optimizer):
        def __init__(self, params, lr=0.05, decay=0.01):
            super().__init__(params, dict(lr=lr, decay=decay))

        @torch.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for g in self.param_groups:
                for p in g["params"]:
                    p.mul_(1 - g["decay"])  # with a gradient or without
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-g["lr"])
            return loss

    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = DecayEverything(model.parameters())
    gen = torch.Generator().manual_seed(1)
    unchanged = None
    for step in range(40):
        x = torch.randn(32, 8, generator=gen)
        y = (x[:, :4]).argmax(1)
        if step == 30:
            x, y = x * 50, torch.zeros_like(y)  # a corrupted batch
        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        before = [p.detach().clone() for p in model.parameters()]
        if mode == "plain":
            closure()
            opt.step()
        else:
            opt.step(closure)
        if step == 30:
            unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    json.dump({"unchanged_at_30": unchanged}, open(out, "w"))
""")


if __name__ == "__main__":
    unittest.main()
