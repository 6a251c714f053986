"""Every trainwatchd command line the docs show uses flags trainwatchd
accepts, spelled as it accepts them (`--metrics_listen`, not
`--metrics-listen`, which it refuses). Reads README.md, docs/, and the
benchmarks' and deployments' READMEs: code blocks, and inline code spans,
that run trainwatchd; the flags are those `trainwatchd --helpfull` lists.

Run by CTest (readme_doc_flags) with Debian's /usr/bin/python3; TRAINWATCHD
is the built binary, DOCS_ROOT the checkout.
"""

import glob
import os
import re
import subprocess
import unittest

ROOT = os.environ.get("DOCS_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# absl's own flags, which every absl binary takes.
ABSL_FLAGS = {"help", "helpfull", "helpshort", "helppackage", "version", "flagfile", "fromenv",
              "tryfromenv", "undefok"}
# A command: trainwatchd, bare or by a path, then what follows it up to the
# end of its command (a quote closing it, a pipe, ;, &&, a comment).
COMMAND = re.compile(r"(?:^|[\s'\"(=/])trainwatchd(?=\s)([^'\"|;&#]*)")
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][A-Za-z0-9_-]*)")


def accepted_flags(binary):
    p = subprocess.run([binary, "--helpfull"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    return set(re.findall(r"^\s+--([a-z0-9_]+)", p.stdout, re.M)) | ABSL_FLAGS


def doc_files(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    for folder in ("bench", "deploy", "examples"):
        files += sorted(glob.glob(os.path.join(root, folder, "**", "*.md"), recursive=True))
    return [f for f in files if os.path.isfile(f)]


def commands(text):
    """(line number, command text) of each trainwatchd command line: the
    lines of fenced code blocks, and inline code spans."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        pieces = [line] if fenced else re.findall(r"`([^`]+)`", line)
        for piece in pieces:
            for m in COMMAND.finditer(piece):
                yield n, m.group(1)


def unknown_flags(text, flags):
    for n, command in commands(text):
        for name in FLAG.findall(command):
            if name.split("=")[0] not in flags:
                yield n, name


class DocFlagsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = accepted_flags(os.environ["TRAINWATCHD"])

    def test_the_flags_are_read(self):
        for name in ("metrics_listen", "stall_floor_seconds", "rules", "db"):
            self.assertIn(name, self.flags)

    def test_every_trainwatchd_command_in_the_docs_uses_flags_it_accepts(self):
        bad = []
        for path in doc_files(ROOT):
            with open(path, encoding="utf-8") as f:
                for n, name in unknown_flags(f.read(), self.flags):
                    bad.append(f"{os.path.relpath(path, ROOT)}:{n}: --{name}")
        self.assertEqual(bad, [], "flags trainwatchd does not accept (trainwatchd --helpfull)")

    def test_the_check_finds_a_misspelled_flag(self):
        text = ("```\ntw-ingest-load --spawn 'build/bin/trainwatchd --db x --metrics-listen :0' "
                "--runs 8\n```\nRun `trainwatchd --stall_floor_secs 6`; `twctl follow --run r`.\n")
        self.assertEqual(list(unknown_flags(text, self.flags)),
                         [(2, "metrics-listen"), (4, "stall_floor_secs")])


if __name__ == "__main__":
    unittest.main()
