"""A job restarted from its checkpoint (issue 12): the first launch trains
0..99, the second resumes after step 49 (Agent(resume_step=49)) and trains
50..149 against a real trainwatchd. The server must keep both: attempt 1
holds the resumed job's 50..149, attempt 0 the first job's 50..99, each with
its own losses. And Agent(resume_step=-2) is an error naming it."""

import sqlite3
import unittest

import trainwatch
from trainwatchd_process import Trainwatchd


def train(address, first, last, loss_of, resume_step=None):
    agent = trainwatch.Agent(server=address, run_id="py-resume", resume_step=resume_step)
    for step in range(first, last + 1):
        agent.step(step, loss=loss_of(step), grad_stats=(1.0, 0, 100))
    agent.close(20000)
    return agent.stats()


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Trainwatchd()

    def tearDown(self):
        self.daemon.stop()

    def test_a_resumed_job_keeps_both_jobs_records(self):
        first = train(self.daemon.address, 0, 99, lambda s: 2.5 + 0.001 * s)
        self.assertEqual(first.durable_step, 99)
        second = train(self.daemon.address, 50, 149, lambda s: 2.0 + 0.001 * s, resume_step=49)
        self.assertEqual(second.durable_step, 149)
        self.assertEqual(second.records_dropped, 0)
        db = sqlite3.connect(self.daemon.db)
        q = lambda sql: db.execute(sql).fetchall()
        self.assertEqual(q("SELECT attempt FROM runs WHERE run_id='py-resume'"), [(1,)])
        rows = q("SELECT attempt, step, loss FROM steps WHERE run_id='py-resume' "
                 "ORDER BY attempt, step")
        attempt0 = {s: loss for a, s, loss in rows if a == 0}
        attempt1 = {s: loss for a, s, loss in rows if a == 1}
        self.assertEqual(sorted(attempt0), list(range(100)))
        self.assertEqual(sorted(attempt1), list(range(150)))
        for s in range(50, 100):
            self.assertAlmostEqual(attempt0[s], 2.5 + 0.001 * s)
        for s in range(50, 150):
            self.assertAlmostEqual(attempt1[s], 2.0 + 0.001 * s)
        self.assertEqual(q("SELECT start, from_step FROM attempts WHERE run_id='py-resume'"),
                         [(3, 49)])

    def test_a_resume_step_below_minus_one_is_refused(self):
        with self.assertRaisesRegex(ValueError, "resume_step -2"):
            trainwatch.Agent(resume_step=-2)


if __name__ == "__main__":
    unittest.main()
