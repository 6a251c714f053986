"""A new user's first hour, end to end, as the docs lead them through it:

1. install the wheel with docs/install.md's own pip command into a fresh venv
   (Debian's /usr/bin/python3, CPython 3.11, the wheel's ABI; torch, which
   the user already has, from this environment through a .pth file);
2. their small torch script (first_hour/train_small.py, no trainwatch
   import) under `trainwatch run` with the default rules and a bad batch at
   step 250: the warm-up is said at the first step, the bad batch printed as
   recorded and not skipped, and `twctl status` says the same;
3. the same script's own print format followed with `twctl follow
   --pattern`: every step recorded;
4. a followed run that goes NaN: the server's halt recommended, and 0
   divergences (a followed job decides nothing);
5. every command `twctl incident show` suggests for these runs is run, as
   suggested, and works.
Every command is the venv's: its `trainwatch` and `twctl` console scripts.

Interpreter: the torch-newest test environment's (tests/python/env), for
torch; the venv under test is a fresh one of /usr/bin/python3.
"""

import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import unittest

from trainwatchd_process import Trainwatchd

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DOCS_ROOT") or os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "first_hour", "train_small.py")
PATTERN = "step {step}/{} | loss {loss} | gnorm {grad_norm} | lr {lr}"


def docs_wheel_install():
    """The pip command docs/install.md gives for the wheel (its words)."""
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        for line in f:
            words = shlex.split(line.split(" #", 1)[0])
            if words[:2] == ["pip", "install"] and words[-1].endswith(".whl"):
                return words
    raise AssertionError("docs/install.md shows no `pip install dist/...whl` line")


class FirstHourTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        venv = os.path.join(cls.tmp.name, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
        cls.bin = os.path.join(venv, "bin")
        # The docs' command, its dist/ being where this build put the wheels.
        words = docs_wheel_install()
        wheel = os.path.join(os.environ["TRAINWATCH_WHEELS"], os.path.basename(words[-1]))
        assert os.path.isfile(wheel), (
            f"docs/install.md names {words[-1]}, which the build did not make: "
            f"{sorted(os.listdir(os.environ['TRAINWATCH_WHEELS']))}")
        p = subprocess.run([os.path.join(cls.bin, "python"), "-m", *words[:-1], "--no-index",
                            "--disable-pip-version-check", wheel],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        # The user's torch: this environment's, as their own site-packages.
        torch_site = os.path.dirname(os.path.dirname(__import__("torch").__file__))
        site = subprocess.run([os.path.join(cls.bin, "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, "users_torch.pth"), "w") as f:
            f.write(torch_site + "\n")
        cls.daemon = Trainwatchd()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.tmp.cleanup()

    def twctl(self, *args, check=True):
        p = subprocess.run([os.path.join(self.bin, "twctl"), "--server", self.daemon.address,
                            *args], capture_output=True, text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        return p

    def follow(self, run, *script_args):
        """The script's stdout piped into `twctl follow - --pattern`."""
        script = subprocess.Popen([os.path.join(self.bin, "python"), SCRIPT, *script_args],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  cwd=self.tmp.name)
        follow = subprocess.run([os.path.join(self.bin, "twctl"), "--server", self.daemon.address,
                                 "follow", "-", "--run", run, "--status-interval", "0",
                                 "--pattern", PATTERN],
                                stdin=script.stdout, capture_output=True, text=True, timeout=300)
        script.stdout.close()
        self.assertEqual(script.wait(timeout=60), 0)
        return follow

    def incidents(self, run):
        out = self.twctl("incidents", "--run", run).stdout
        return re.findall(r"^(I-\d+)\s", out, flags=re.M)

    def test_1_the_installed_package_is_the_wheels(self):
        p = subprocess.run([os.path.join(self.bin, "python"), "-c",
                            "import importlib.metadata as m, trainwatch; "
                            "print(m.version('trainwatch-agent'), trainwatch.__file__)"],
                           capture_output=True, text=True, cwd=self.tmp.name)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(os.path.join(self.tmp.name, "venv"), p.stdout)

    def test_2_a_bad_batch_in_warm_up_is_said_printed_and_in_status(self):
        p = subprocess.run([os.path.join(self.bin, "trainwatch"), "run", "--server",
                            self.daemon.address, "--run-id", "hour-run", "--",
                            os.path.join(self.bin, "python"), SCRIPT, "--bad-step", "250"],
                           capture_output=True, text=True, timeout=300, cwd=self.tmp.name)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        said = [ln for ln in p.stderr.splitlines() if ln.startswith("trainwatch: ")]
        # At the first step: the rules, the warm-up, what is off until then.
        # (trainwatchd's: the server's rules, its defaults here, reached the
        # agent before its first step.)
        self.assertTrue(any(ln.startswith("trainwatch: rules: trainwatchd's; ") and
                            "warm-up until step 1000" in ln and
                            "no update is skipped" in ln for ln in said), p.stderr[-3000:])
        # The bad batch: recorded in warm-up, the update kept, with numbers.
        bad = [ln for ln in said if ln.startswith("trainwatch: step 250, tier 0: data anomaly "
                                                  "in warm-up until step 1000: grad_norm ")]
        self.assertEqual(len(bad), 1, p.stderr[-3000:])
        self.assertIn("recorded, update kept", bad[0])
        self.assertIn("step   399/400", p.stdout)  # the script ran to its end
        status = self.twctl("status", "hour-run").stdout
        self.assertIn("run hour-run: step 399", status)
        self.assertIn("warm-up: until step 1000", status)
        self.assertIn("no update is skipped and the baseline rules do not page", status)
        shown = "\n".join(self.twctl("incident", "show", i).stdout
                          for i in self.incidents("hour-run"))
        self.assertIn("data anomaly in warm-up until step 1000", shown)
        self.assertIn("detected in the run's warm-up (until step 1000): no update was skipped",
                      shown)
        # Its agent closed when the script ended: finished, not stale.
        deadline = time.monotonic() + 30
        while not re.search(r"^hour-run\s+finished\s", self.twctl("runs").stdout, flags=re.M):
            self.assertLess(time.monotonic(), deadline, self.twctl("runs").stdout)
            time.sleep(0.2)

    def test_3_follow_with_a_pattern_records_every_step(self):
        p = self.follow("hour-follow")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("records sent 400, acknowledged 400", p.stderr)
        self.assertIn("format pattern", p.stderr)
        self.assertIn("run hour-follow: step 399", self.twctl("status", "hour-follow").stdout)

    def test_4_a_followed_nan_is_the_servers_halt_and_no_divergence(self):
        p = self.follow("hour-nan", "--nan-step", "300")
        self.assertEqual(p.returncode, 0, p.stderr)
        status = self.twctl("status", "hour-nan").stdout
        self.assertIn("0 agent decision(s), 0 divergence(s)", status)
        listed = self.twctl("incidents", "--run", "hour-nan").stdout
        self.assertRegex(listed, r"I-\d+\s+hour-nan\s+3\s+awaiting_decision\s+300\s+300\s+tier 3 "
                                 r"nonfinite_value at step 300")

    def test_5_every_suggested_command_works(self):
        # After the runs above (unittest runs the tests in name order).
        ran = 0
        for run in ("hour-run", "hour-follow", "hour-nan"):
            for incident in self.incidents(run):
                shown = self.twctl("incident", "show", incident).stdout
                for m in re.finditer(r"(?:^\s*|`)twctl ([^`\n]+)", shown, flags=re.M):
                    words = [w if w != "..." else "as suggested" for w in shlex.split(m.group(1))]
                    p = self.twctl(*words, check=False)
                    self.assertEqual(p.returncode, 0,
                                     f"{incident} suggests `twctl {m.group(1)}`: "
                                     f"{p.stdout}{p.stderr}")
                    ran += 1
        # The NaN run's halt has no checkpoint: its rejection is suggested
        # (and run above); the warm-up record suggests nothing.
        self.assertEqual(ran, 1)


if __name__ == "__main__":
    unittest.main()
