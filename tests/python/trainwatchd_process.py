"""trainwatchd ($TRAINWATCHD) as a child process on a free loopback port,
with its database (and its --rules file, when given) in a temporary folder;
for the Python tests. DaemonTestCase: one per test, with a scratch folder.
free_port(): a free loopback port, for the gloo ranks' rendezvous.
trainwatch_run(): the command prefix that runs a job under `trainwatch run`."""

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import unittest


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trainwatch_run(server, run_id, rules):
    """`trainwatch run --server S --run-id R --rules JSON --`: the console
    script the wheel installed beside this interpreter."""
    import sys
    return [os.path.join(os.path.dirname(sys.executable), "trainwatch"), "run", "--server", server,
            "--run-id", run_id, "--rules", json.dumps(rules), "--"]


class Trainwatchd:
    def __init__(self, *extra_args, rules=None):
        self.dir = tempfile.TemporaryDirectory()
        self.db = os.path.join(self.dir.name, "tw.db")
        if rules is not None:
            path = os.path.join(self.dir.name, "rules.json")
            with open(path, "w") as f:
                json.dump(rules, f)
            extra_args = (*extra_args, "--rules", path)
        self.log = open(os.path.join(self.dir.name, "trainwatchd.log"), "w+")
        self.process = subprocess.Popen(
            [os.environ["TRAINWATCHD"], "--listen", "127.0.0.1:0", "--metrics_listen=",
             "--db", self.db, *extra_args], stdout=self.log, stderr=subprocess.STDOUT)
        self.address = None
        for _ in range(200):
            self.log.seek(0)
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", self.log.read())
            if m:
                self.address = m.group(1)
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("trainwatchd did not start")

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=20)
        self.log.close()
        self.dir.cleanup()


class DaemonTestCase(unittest.TestCase):
    """A trainwatchd (self.daemon) and a scratch folder (self.work) per test."""

    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.daemon = Trainwatchd()

    def tearDown(self):
        self.daemon.stop()
        self.work.cleanup()
