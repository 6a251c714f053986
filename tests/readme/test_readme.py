"""The README's Python quick start (readme-test: quickstart, read from the
page, not copied) inside a real torch loop on the CPU, streaming to a real
trainwatchd: a corrupted batch is skipped, a NaN halts the run, and the server
stored both with the batch's shard ids."""

import sqlite3
import time
import unittest

import torch

import doc_snippets
import trainwatch
from trainwatchd_process import Trainwatchd

CORRUPT_AT, NAN_AT = 1100, 1200


def loader(seen):
    """(x, y, shard_ids) per step: a learnable task, one bad batch, one NaN."""
    g = torch.Generator().manual_seed(3)
    for step in range(NAN_AT + 100):
        x = torch.randn(64, 32, generator=g)
        y = (x[:, :16] * 0.5).argmax(dim=1)
        if step == CORRUPT_AT:
            x, y = x * 40.0 + 7.0, (y + 7) % 16
        if step == NAN_AT:
            x[3, 5] = float("nan")
        seen.append(step)
        yield x, y, [50_000 + step]


class ReadmeSnippetTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Trainwatchd()
        self.address, self.db = self.daemon.address, self.daemon.db

    def tearDown(self):
        self.daemon.stop()

    def test_snippet_skips_the_bad_batch_and_halts_on_the_nan(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 16))
        seen = []
        ns = {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
              "loss_fn": torch.nn.functional.cross_entropy, "loader": loader(seen)}
        with self.assertRaises(trainwatch.TrainingHalted) as halted:
            doc_snippets.run("quickstart", ns, {'"127.0.0.1:7070"': f'"{self.address}"'})
        self.assertIn("numerical failure", str(halted.exception))
        self.assertEqual(seen[-1], NAN_AT)
        self.assertEqual(ns["guard"].skipped, 1)
        ns["agent"].close()

        db = sqlite3.connect(self.db)
        q = lambda sql: db.execute(sql).fetchall()
        self.assertEqual(q("SELECT count(*) FROM steps WHERE run_id='my-run'"), [(NAN_AT + 1,)])
        self.assertEqual(q("SELECT step, shards FROM events WHERE action=2"),
                         [(CORRUPT_AT, str(50_000 + CORRUPT_AT))])
        self.assertIn((50_000 + CORRUPT_AT,), q("SELECT shard FROM flagged_shards"))
        self.assertEqual(q("SELECT step FROM events WHERE action=4"), [(NAN_AT,)])
        # params=model.named_parameters() in the snippet names the tensors: the
        # rank's report of the halted step carries them. It travels after the
        # step's record, whose acknowledgement does not cover it: wait for it.
        deadline = time.monotonic() + 30
        while True:
            reports = [bytes(r) for (r,) in q(f"SELECT report FROM rank_steps WHERE step={NAN_AT}")]
            if any(b"0.weight" in r for r in reports) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertTrue(any(b"0.weight" in r for r in reports), reports)


if __name__ == "__main__":
    unittest.main()
