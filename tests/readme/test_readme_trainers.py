"""The documentation's trainer snippets (each after its
`<!-- readme-test: NAME -->` line, found by doc_snippets on whichever page holds
it), run as written in the trainers environment against a real trainwatchd,
with the snippet's server address made the test daemon's:

- transformers: a tiny GPT-2 in the Hugging Face Trainer, gradient
  accumulation 2; one record per optimizer step, each with the loss the
  Trainer logs.
- lightning: a small model in lightning.Trainer; one record per optimizer
  step with the mean of its micro-batches' losses, and log Z.
- torchtitan: torchtitan's Trainer with llama3 "debugmodel" on the CPU, as
  tests/python/torchtitan_trainer.py builds it, in this process; one record
  per step with the loss torchtitan logs.
"""

import math
import os
import sqlite3
import tempfile
import unittest

import torch

import doc_snippets
from trainwatchd_process import Trainwatchd


def run_snippet(name, daemon, namespace):
    # The address a reader would use, made the test daemon's.
    doc_snippets.run(name, namespace, {"127.0.0.1:7070": daemon.address})


def stored(daemon, run_id):
    db = sqlite3.connect(daemon.db)
    rows = db.execute("SELECT step, loss, grad_norm, log_z, decision FROM steps WHERE run_id=? "
                      "ORDER BY step", (run_id,)).fetchall()
    db.close()
    return rows


class ReadmeTrainersTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Trainwatchd()
        self.work = tempfile.TemporaryDirectory()
        self.cwd = os.getcwd()
        os.chdir(self.work.name)  # the trainers write their folders here

    def tearDown(self):
        os.chdir(self.cwd)
        self.daemon.stop()
        self.work.cleanup()

    def test_transformers(self):
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

        from hf_trainer import Collator, Counting
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                           n_head=2))
        args = TrainingArguments(output_dir="out", use_cpu=True, report_to="none",
                                 save_strategy="no", per_device_train_batch_size=4,
                                 gradient_accumulation_steps=2, max_steps=6, logging_steps=1,
                                 disable_tqdm=True)
        ns = {"Trainer": lambda **kw: transformers.Trainer(data_collator=Collator(()), **kw),
              "model": model, "args": args, "dataset": Counting(48)}
        run_snippet("transformers", self.daemon, ns)
        rows = stored(self.daemon, "gpt2-small-7")
        self.assertEqual([r[0] for r in rows], [1, 2, 3, 4, 5, 6])
        logged = {h["step"]: h for h in ns["trainer"].state.log_history if "loss" in h}
        for step, loss, grad_norm, log_z, decision in rows:
            self.assertAlmostEqual(loss, logged[step]["loss"], delta=1e-4 * loss)
            self.assertGreater(grad_norm, 0)
            self.assertTrue(math.isfinite(log_z))
            self.assertEqual(decision, 0)

    def test_lightning(self):
        from lightning_trainer import Counting, Model
        torch.manual_seed(0)
        model = Model({})
        loader = torch.utils.data.DataLoader(Counting(24), batch_size=4)  # 6 micro-batches
        ns = {"model": model, "loader": loader}
        run_snippet("lightning", self.daemon, ns)
        rows = stored(self.daemon, "lit-small-3")
        self.assertEqual([r[0] for r in rows], [0, 1, 2])
        for step, loss, grad_norm, log_z, decision in rows:
            losses = model.losses[step]
            self.assertEqual(len(losses), 2)
            self.assertAlmostEqual(loss, sum(losses) / 2, delta=1e-5 * loss)
            self.assertGreater(grad_norm, 0)
            self.assertAlmostEqual(log_z, math.log(64), delta=0.5)
            self.assertEqual(decision, 0)

    def test_torchtitan(self):
        import torchtitan_trainer
        from trainwatchd_process import free_port
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()), HF_HUB_OFFLINE="1",
                          HF_DATASETS_OFFLINE="1", HF_HOME=os.path.join(self.work.name, "hf"))
        logged = {}

        class Config:  # what torchtitan's train.py gets from its ConfigManager
            def build(self):
                trainer = torchtitan_trainer.build({"work": self.work, "steps": 4}, 0)
                log = trainer.metrics_processor.log

                def record(step, loss, *args, **kwargs):
                    logged[step] = float(loss)
                    return log(step, loss, *args, **kwargs)
                trainer.metrics_processor.log = record
                return trainer

        config = Config()
        config.work = os.path.join(self.work.name, "titan")
        try:
            run_snippet("torchtitan", self.daemon, {"config": config})
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        rows = stored(self.daemon, "llama3-debug-1")
        self.assertEqual([r[0] for r in rows], [1, 2, 3, 4])
        for step, loss, grad_norm, log_z, decision in rows:
            self.assertAlmostEqual(loss, logged[step], delta=1e-5 * loss)
            self.assertGreater(grad_norm, 0)
            self.assertTrue(math.isfinite(log_z))
            self.assertEqual(decision, 0)


if __name__ == "__main__":
    unittest.main()
