"""Agent(server=...) with several addresses, from Python: a list of strings
or one comma-separated string; a dead first address is skipped and the steps
reach the live trainwatchd; an empty or malformed entry is a ValueError
naming it, before anything streams."""

import os
import sqlite3
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ["PROJECT_SOURCE_DIR"], "tests", "python"))

import trainwatch  # noqa: E402
from trainwatchd_process import Trainwatchd, free_port  # noqa: E402


class ServerListTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Trainwatchd()
        self.addCleanup(self.daemon.stop)
        self.dead = f"127.0.0.1:{free_port()}"

    def stream(self, server, run_id):
        agent = trainwatch.Agent(server=server, run_id=run_id)
        for step in range(50):
            agent.step(step, loss=2.5, grad_stats=(1.0, 0, 100))
        agent.close(20000)
        stats = agent.stats()
        self.assertEqual(stats.durable_step, 49)
        self.assertEqual(stats.records_dropped, 0)
        db = sqlite3.connect(self.daemon.db)
        self.addCleanup(db.close)
        count = db.execute("SELECT COUNT(DISTINCT step) FROM steps WHERE run_id = ?",
                           (run_id,)).fetchone()[0]
        self.assertEqual(count, 50)

    def test_a_list_with_a_dead_first_address(self):
        self.stream([self.dead, self.daemon.address], "py-list")

    def test_a_comma_separated_string(self):
        self.stream(f"{self.dead}, {self.daemon.address}", "py-string")

    def test_empty_or_malformed_entries_are_refused(self):
        with self.assertRaisesRegex(ValueError, r"entry 2 is empty"):
            trainwatch.Agent(server=f"{self.daemon.address},,{self.dead}", run_id="bad")
        with self.assertRaisesRegex(ValueError, r"entry 2 \(\"127.0.0.1:0\"\) is malformed"):
            trainwatch.Agent(server=[self.daemon.address, "127.0.0.1:0"], run_id="bad")
        with self.assertRaisesRegex(ValueError, r"server\[1\]"):
            trainwatch.Agent(server=[self.daemon.address, "a:1,b:2"], run_id="bad")
        with self.assertRaisesRegex(ValueError, r"server\[0\]"):
            trainwatch.Agent(server=[" "], run_id="bad")
        with self.assertRaisesRegex(ValueError, r"the list of addresses is empty"):
            trainwatch.Agent(server=[], run_id="bad")
        with self.assertRaises(TypeError):
            trainwatch.Agent(server=[self.daemon.address, 7070], run_id="bad")


if __name__ == "__main__":
    unittest.main()
