"""A clean halt: a trainer whose gradient turns NaN inside a real torch loop
ends, under trainwatch.torch.exit_on_halt(), with exit status 3 and one line
on stderr naming the step and the tensor, not a traceback from inside
optimizer.step()."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import trainwatch

TRAINER = textwrap.dedent("""
    import torch
    import trainwatch
    import trainwatch.torch as twt

    @twt.exit_on_halt()
    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with trainwatch.Agent(run_id="py-halt") as agent:
            guard = twt.watch(opt, agent, params=model.named_parameters())
            for step in range(20):
                x = torch.randn(16, 8)
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                if step == 12:
                    model[2].weight.grad[1, 3] = float("nan")
                guard.observe(step, loss)
                opt.step()
        print("finished")

    train()
""")


class HaltTest(unittest.TestCase):
    def test_subprocess_trainer_exits_3_with_one_line_naming_the_tensor(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "trainer.py")
            with open(script, "w") as f:
                f.write(TRAINER)
            p = subprocess.run([sys.executable, script], capture_output=True, text=True,
                               timeout=120, env=dict(os.environ))
        self.assertEqual(p.returncode, trainwatch.EXIT_HALTED, p.stderr)
        self.assertEqual(p.returncode, 3)
        self.assertNotIn("finished", p.stdout)
        self.assertNotIn("Traceback", p.stderr)
        lines = [line for line in p.stderr.splitlines() if line.startswith("trainwatch: ")]
        # The warm-up line of the first step, then the halt's one line.
        self.assertEqual(len(lines), 2, p.stderr)
        self.assertTrue(lines[0].startswith("trainwatch: rules: the defaults; warm-up until "),
                        lines[0])
        lines = lines[1:]
        self.assertIn("halted at step 12 (tier 3", lines[0])
        self.assertIn("2.weight (1 of 64 nonfinite)", lines[0])
        self.assertIn("on rank 0", lines[0])

    def test_other_exceptions_pass_unchanged(self):
        with self.assertRaises(KeyError):
            with trainwatch.exit_on_halt():
                raise KeyError("not a halt")


if __name__ == "__main__":
    unittest.main()
