"""trainwatch.rollback.apply_rollback and trainwatch.Command, with a real
torch model and optimizer and an agent stand-in that records what the helper
acknowledges (the real agent's path is in tests/integration's reconfigure
test)."""

import os
import tempfile
import unittest

import torch

import trainwatch
import trainwatch.rollback as twr


class RecordingAgent:
    def __init__(self):
        self.acks, self.resumed = [], []

    def acknowledge(self, command_id, status, message="", resumed_step=-1):
        self.acks.append((command_id, status, message, resumed_step))

    def resume_from(self, step):
        self.resumed.append(step)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def command(**fields):
    base = {"kind": "rollback", "command_id": "C-7", "incident_id": "I-4", "target_step": 40,
            "checkpoint_uri": "", "quarantine": [[5, 6]], "skip_steps": None,
            "z_loss_alpha": None, "precision": [], "lr_scale": None, "reason": ""}
    base.update(fields)
    return trainwatch.Command.from_dict(base)


class RollbackHelperTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.model = make_model()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.path = os.path.join(self.dir.name, "step-40.pt")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": 40},
                   self.path)
        self.loads = 0
        # Training on after the checkpoint: the rollback must undo this.
        with torch.no_grad():
            self.model[0].weight.add_(1.0)

    def tearDown(self):
        self.dir.cleanup()

    def load(self, uri, model, opt):
        self.loads += 1
        state = torch.load(uri)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        return state["step"]

    def test_command_reads_as_attributes_and_as_the_old_dict(self):
        cmd = command(checkpoint_uri=self.path, precision=[["2", "fp32"]], skip_steps=[41, 45])
        self.assertIs(cmd.kind, trainwatch.CommandKind.ROLLBACK)
        self.assertEqual(cmd.kind, "rollback")
        self.assertEqual(cmd.precision, [("2", "fp32")])
        self.assertEqual(cmd.skip_steps, (41, 45))
        self.assertEqual(cmd.quarantine, [(5, 6)])
        self.assertEqual(cmd.quarantine_names, [])  # left out of the dict
        # The dict reads of earlier releases, deprecated.
        with self.assertWarnsRegex(DeprecationWarning, r"read \.checkpoint_uri"):
            self.assertEqual(cmd["checkpoint_uri"], self.path)
        with self.assertWarns(DeprecationWarning):
            self.assertEqual(cmd["quarantine"], [(5, 6)])
            self.assertIsNone(cmd.get("lr_scale"))
            self.assertIn("z_loss_alpha", cmd)
            self.assertEqual(cmd.keys(), list(trainwatch.Command.FIELDS))
            with self.assertRaises(KeyError):
                cmd["no_such_key"]
        with self.assertWarnsRegex(DeprecationWarning, "Command.from_dict"):
            old = trainwatch.Command({"kind": "halt", "reason": "r", "target_step": None})
        self.assertEqual((old.kind, old.reason, old.target_step), ("halt", "r", -1))
        self.assertEqual(trainwatch.Command(trainwatch.CommandKind.RESUME, reason="ok").kind,
                         "resume")

    def test_loads_applies_resumes_and_acknowledges(self):
        agent = RecordingAgent()
        cmd = command(checkpoint_uri=self.path, precision=[["0", "fp32"]], lr_scale=0.5,
                      z_loss_alpha=1e-4)
        done = twr.apply_rollback(cmd, agent, self.model, self.opt, self.load)
        self.assertEqual(done.step, 40)
        self.assertEqual(done.precision, {"0": "fp32"})
        self.assertEqual(done.quarantine, [(5, 6)])
        self.assertEqual(done.z_loss_alpha, 1e-4)
        # The checkpoint's weights, the learning rate halved on every group.
        saved = torch.load(self.path)["model"]
        self.assertTrue(torch.equal(self.model[0].weight, saved["0.weight"]))
        self.assertEqual([g["lr"] for g in self.opt.param_groups], [5e-4])
        # Module 0 runs in fp32 under autocast; module 2 still in bf16.
        x = torch.randn(3, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.model[0](x)
            out = self.model[2](self.model[1](h))
        self.assertEqual(h.dtype, torch.float32)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(agent.resumed, [40])
        self.assertEqual(len(agent.acks), 1)
        cid, status, message, resumed = agent.acks[0]
        self.assertEqual((cid, status, resumed), ("C-7", "applied", 40))
        self.assertIn("0 in fp32", message)
        self.assertIn("learning rate x0.5", message)

    def test_a_setting_that_cannot_apply_fails_the_command_and_changes_nothing(self):
        before = self.model[0].weight.detach().clone()
        for cmd, reason in [
                (command(checkpoint_uri=self.path, precision=[["blocks.9", "fp32"]]),
                 "no module 'blocks.9' in the model"),
                (command(checkpoint_uri=self.path, precision=[["0", "fp16"]]),
                 "module '0': cpu autocast cannot run fp16"),
                (command(checkpoint_uri=self.path, lr_scale=-1.0),
                 "lr_scale must be a finite number > 0")]:
            agent = RecordingAgent()
            with self.assertRaises(twr.RollbackFailed) as e:
                twr.apply_rollback(cmd, agent, self.model, self.opt, self.load)
            self.assertIn(reason, str(e.exception))
            self.assertEqual(len(agent.acks), 1)
            self.assertEqual(agent.acks[0][1], "failed")
            self.assertIn(reason, agent.acks[0][2])
            self.assertEqual(agent.resumed, [])
        self.assertEqual(self.loads, 0)  # refused before loading anything
        self.assertTrue(torch.equal(self.model[0].weight, before))
        self.assertEqual(self.opt.param_groups[0]["lr"], 1e-3)

    def test_a_checkpoint_that_does_not_load_or_holds_another_step_fails(self):
        agent = RecordingAgent()
        with self.assertRaises(twr.RollbackFailed) as e:
            twr.apply_rollback(command(checkpoint_uri=self.path + ".missing"), agent, self.model,
                               self.opt, self.load)
        self.assertIn("loading " + self.path + ".missing", str(e.exception))
        agent = RecordingAgent()
        with self.assertRaises(twr.RollbackFailed) as e:
            twr.apply_rollback(command(checkpoint_uri=self.path, target_step=60), agent,
                               self.model, self.opt, self.load)
        self.assertIn("holds step 40, not the command's 60", str(e.exception))
        self.assertEqual(agent.acks[0][1], "failed")

    def test_precision_can_be_changed_again(self):
        lin = torch.nn.Linear(4, 4)
        twr.set_module_precision(lin, "fp32")
        twr.set_module_precision(lin, "bf16")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            self.assertEqual(lin(torch.randn(2, 4)).dtype, torch.bfloat16)
        with self.assertRaises(ValueError):
            twr.set_module_precision(lin, "fp8")


if __name__ == "__main__":
    unittest.main()
