"""Rules from TRAINWATCH_RULES (inline JSON or a file), below the
constructor's rules and above the defaults; a bad value is a ValueError
naming the variable."""

import json
import os
import random
import tempfile
import unittest
from unittest import mock

import trainwatch

SHORT_WARMUP = {"warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


def decision_on_bad_batch(agent):
    """The decision on a bad batch at step 80 of a steady run."""
    rng = random.Random(3)
    for step in range(81):
        loss, ss = 2.5 + 0.02 * rng.gauss(0, 1), rng.uniform(0.8, 1.2)
        if step == 80:
            loss, ss = 6.0, 160.0
        v = agent.step(step, loss=loss, grad_stats=(ss, 0, 1000))
    agent.close()
    return v.decision


def env(value):
    clean = {k: v for k, v in os.environ.items() if k not in ("TRAINWATCH_RULES", "TRAINWATCH_SERVER")}
    if value is not None:
        clean["TRAINWATCH_RULES"] = value
    return mock.patch.dict(os.environ, clean, clear=True)


class RulesFromEnvironmentTest(unittest.TestCase):
    def test_inline_json_and_file(self):
        with env(None):  # the defaults: still warming up at step 80
            self.assertEqual(decision_on_bad_batch(trainwatch.Agent()), trainwatch.Decision.CONTINUE)
        with env(json.dumps(SHORT_WARMUP)):
            self.assertEqual(decision_on_bad_batch(trainwatch.Agent()), trainwatch.Decision.SKIP)
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(SHORT_WARMUP, f)
            f.flush()
            with env(f.name):
                self.assertEqual(decision_on_bad_batch(trainwatch.Agent()), "skip_update")

    def test_constructor_rules_come_first(self):
        with env(json.dumps(SHORT_WARMUP)):
            agent = trainwatch.Agent(rules={"warmup_steps": 1000})
            self.assertEqual(decision_on_bad_batch(agent), "continue")

    def test_bad_values_name_the_variable(self):
        for value, detail in (('{"warmup_stepz": 1}', "warmup_stepz"),
                              ('{"warmup_steps": ', "TRAINWATCH_RULES"),
                              ("/nonexistent/rules.json", "/nonexistent/rules.json")):
            with env(value), self.assertRaises(ValueError) as e:
                trainwatch.Agent()
            self.assertIn("TRAINWATCH_RULES", str(e.exception))
            self.assertIn(detail, str(e.exception))


if __name__ == "__main__":
    unittest.main()
