"""String shard ids end to end, against a real trainwatchd and twctl: a torch
trainer whose batches are named like a real loader's ("shard-00150:0") gets
the names stored, a NaN batch halts the run, an operator approves a rollback
quarantining the batch by name (twctl rollback approve --quarantine-shards),
and after the rollback the trainer's loader skips that shard and trains past
the step that failed."""

import copy
import json
import os
import subprocess
import time
import unittest

import torch

import trainwatch
import trainwatch.torch as twt
from trainwatchd_process import Trainwatchd

RULES = {"warmup_steps": 100, "warmup_min_records": 20, "warmup_min_grad_samples": 20}
RUN = "py-names"
NAN_AT, STEPS, CHECKPOINT_EVERY = 150, 200, 50
BAD = f"shard-{NAN_AT:05d}:0"


def wait_until(what, predicate, timeout_s=30.0):
    """Polls predicate until it returns a true value; fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Loader:
    """Batches named as a parquet-style loader names them: shard-SSSSS:R.
    Shard BAD holds a NaN. Asks the agent what is quarantined before serving,
    as a real loader would, and serves the step's next replica instead."""

    def __init__(self, agent):
        self.agent = agent
        self.skipped = []

    def batch(self, step):
        replica = 0
        while self.agent.is_quarantined(f"shard-{step:05d}:{replica}"):
            self.skipped.append(f"shard-{step:05d}:{replica}")
            replica += 1
        name = f"shard-{step:05d}:{replica}"
        gen = torch.Generator().manual_seed(step * 10 + replica)
        x = torch.randn(64, 32, generator=gen)
        y = (x[:, :16] * 0.5).argmax(dim=1)
        if name == BAD:
            x[3, 5] = float("nan")
        return name, x, y


class StringShardsTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Trainwatchd(rules=RULES)

    def tearDown(self):
        self.daemon.stop()

    def twctl(self, *args):
        out = subprocess.run([os.environ["TWCTL"], "--server", self.daemon.address, *args],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_names_are_stored_quarantined_by_approval_and_skipped_after_rollback(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 16))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        agent = trainwatch.Agent(server=self.daemon.address, run_id=RUN, rules=RULES)
        guard = twt.watch(opt, agent)
        loader = Loader(agent)
        checkpoints = {}

        def train(first, last):
            for step in range(first, last):
                name, x, y = loader.batch(step)
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits, y)
                opt.zero_grad()
                loss.backward()
                guard.observe(step, loss, logits=logits, shards=[name, step])
                try:
                    opt.step()
                except trainwatch.TrainingHalted:
                    return step
                if step % CHECKPOINT_EVERY == 0:
                    checkpoints[step] = (copy.deepcopy(model.state_dict()),
                                         copy.deepcopy(opt.state_dict()))
                    agent.report_checkpoint(step, f"mem://{step}")
            return None

        self.assertEqual(train(0, STEPS), NAN_AT)

        # The halt's incident, with the batch named in its diagnostic summary.
        incidents = wait_until("the tier 3 incident", lambda: json.loads(
            self.twctl("incidents", "--run", RUN, "-o", "json")).get("incidents"))
        incident = incidents[0]["incident_id"]
        shown = json.loads(self.twctl("incident", "show", incident, "-o", "json"))
        summary = shown["incident"]["summary"]
        by_step = {int(s["step"]): s for s in summary["shards_onset_to_detection"]}
        self.assertEqual(by_step[NAN_AT]["names"], [BAD])
        self.assertEqual(by_step[NAN_AT]["shard_ids"], [str(NAN_AT)])
        self.assertIn(BAD, summary["suspect_shards"]["names"])

        out = self.twctl("rollback", "approve", incident, "--to-step", "100",
                         "--quarantine-shards", BAD, "--comment", "bad shard", "--yes")
        self.assertIn(f"quarantine shard {BAD}", out)

        command = wait_until("the rollback command", agent.poll_command)
        self.assertEqual(command.kind, "rollback")
        self.assertEqual(command.quarantine_names, [BAD])
        target = command.target_step
        self.assertEqual(target, 100)
        model.load_state_dict(checkpoints[target][0])
        opt.load_state_dict(checkpoints[target][1])
        agent.resume_from(target)
        wait_until("the quarantine list", lambda: agent.is_quarantined(BAD))
        self.assertEqual(agent.quarantined_shard_names(), [BAD])
        self.assertFalse(agent.is_quarantined("shard-00150:1"))
        self.assertFalse(agent.is_quarantined(NAN_AT))  # a name is not an id
        agent.acknowledge(command.command_id, trainwatch.AckStatus.APPLIED, resumed_step=target)

        # Trained on past the failing step: the loader skipped the shard.
        self.assertIsNone(train(target + 1, STEPS))
        self.assertEqual(loader.skipped, [BAD])

        listed = self.twctl("shards", RUN)
        self.assertIn(BAD, listed)
        agent.close()


if __name__ == "__main__":
    unittest.main()
