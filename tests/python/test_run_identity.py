"""Which run the Python Agent streams under: run_id=, TRAINWATCH_RUN_ID, then
the launcher's name for the job (torchrun, SLURM); with none of them it does
not stream, says what to set, and still decides skip and halt locally."""

import contextlib
import os
import random
import tempfile
import unittest
from unittest import mock

import trainwatch

# Nothing listens there; the agent only has to be willing to stream.
SERVER = "127.0.0.1:1"
RUN_ID_VARIABLES = ("TRAINWATCH_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                    "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TRAINWATCH_SERVER")
RULES = {"warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


@contextlib.contextmanager
def launcher_env(**values):
    """Only the given run id variables set, the others unset, for the block."""
    clean = {k: v for k, v in os.environ.items() if k not in RUN_ID_VARIABLES}
    clean.update(values)
    with mock.patch.dict(os.environ, clean, clear=True):
        yield


@contextlib.contextmanager
def captured_stderr(into):
    """What the C++ agent writes to fd 2 during the block, appended to `into`."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            into.append(f.read().decode())


class RunIdentityTest(unittest.TestCase):
    # Each streaming agent is closed before the environment changes again:
    # gRPC's threads read it (getenv) while they connect, and glibc's setenv
    # may move the environment under a concurrent getenv (a crash, once in
    # hundreds of runs under load).
    def make(self, **kwargs):
        agent = trainwatch.Agent(server=SERVER, **kwargs)
        self.addCleanup(agent.close, 0)
        return agent

    def run_id(self, **kwargs):
        agent = trainwatch.Agent(server=SERVER, **kwargs)
        try:
            return agent.run_id
        finally:
            agent.close(0)

    def test_argument_then_environment_then_torchrun(self):
        with launcher_env(TRAINWATCH_RUN_ID="from-env", TORCHELASTIC_RUN_ID="from-torch"):
            self.assertEqual(self.run_id(run_id="from-arg"), "from-arg")
            self.assertEqual(self.run_id(), "from-env")
            del os.environ["TRAINWATCH_RUN_ID"]
            err = []
            with captured_stderr(err):
                agent = trainwatch.Agent(server=SERVER)
            try:
                self.assertEqual(agent.run_id, "from-torch")
                self.assertTrue(agent.streaming)
                self.assertTrue(agent.stats().streaming)
            finally:
                agent.close(0)
            self.assertIn('run id "from-torch" from TORCHELASTIC_RUN_ID', err[0])

    def test_torchrun_none_is_no_name_and_slurm_array_tasks_differ(self):
        with launcher_env(TORCHELASTIC_RUN_ID="none", SLURM_JOB_ID="1003",
                          SLURM_ARRAY_JOB_ID="1000", SLURM_ARRAY_TASK_ID="3"):
            self.assertEqual(self.run_id(), "slurm-1000_3")
            os.environ["SLURM_ARRAY_TASK_ID"] = "4"
            self.assertEqual(self.run_id(), "slurm-1000_4")
        with launcher_env(SLURM_JOB_ID="77"):
            self.assertEqual(self.run_id(), "slurm-77")

    def test_a_bad_run_id_is_a_value_error_naming_it(self):
        with launcher_env():
            with self.assertRaisesRegex(ValueError, "run_id has the byte 0x2f"):
                trainwatch.Agent(server=SERVER, run_id="team/run")
        with launcher_env(TORCHELASTIC_RUN_ID="r" * 200):
            with self.assertRaisesRegex(ValueError, "TORCHELASTIC_RUN_ID .* 200 bytes long"):
                trainwatch.Agent(server=SERVER)

    def test_no_id_means_no_streaming_but_local_verdicts(self):
        err = []
        with launcher_env(), captured_stderr(err):
            agent = self.make(rules=RULES)
        self.assertFalse(agent.streaming)
        self.assertEqual(agent.run_id, "")
        self.assertIn("not streaming to 127.0.0.1:1: no run id", err[0])
        self.assertIn("TRAINWATCH_RUN_ID", err[0])
        rng = random.Random(3)
        decisions = {}
        printed = []
        with captured_stderr(printed):
            for step in range(91):
                loss, ss, bad = 2.5 + 0.02 * rng.gauss(0, 1), rng.uniform(0.8, 1.2), 0
                if step == 80:  # a bad batch
                    loss, ss = 6.0, 160.0
                if step == 90:  # a numerical failure
                    bad = 3
                decisions[step] = agent.step(step, loss=loss, grad_stats=(ss, bad, 1000)).decision
        self.assertEqual(decisions[79], "continue")
        self.assertEqual(decisions[80], "skip_update")
        self.assertEqual(decisions[90], "halt")
        # The skip says so in the trainer's output, once, with its numbers.
        skips = [ln for ln in printed[0].splitlines() if ln.startswith("trainwatch: step ")]
        self.assertEqual(len(skips), 1, printed[0])
        self.assertTrue(skips[0].startswith("trainwatch: step 80, tier 1: data anomaly: grad_norm "),
                        skips[0])
        self.assertIn("nats over its EMA", skips[0])
        self.assertIn("optimizer update skipped", skips[0])
        # The warm-up at the first step (these rules: 50 steps), and its end.
        lines = printed[0].splitlines()
        self.assertTrue(lines[0].startswith("trainwatch: rules: the job's own; warm-up until step "
                                            "50 (and 20 loss and grad-norm records)"), lines[0])
        self.assertIn("trainwatch: warm-up over at step 50; every rule decides from here", lines)
        self.assertEqual(agent.stats().records_queued, 0)


if __name__ == "__main__":
    unittest.main()
