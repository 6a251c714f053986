"""Every pip command the documentation shows installs from the checkout or
a built wheel, never a bare name the package index would resolve.

The name `trainwatch` on the index belongs to an unrelated project, and no
name is ours until we publish it: a doc that says `pip install trainwatch`
(or any bare requirement) sends a reader to whoever owns that name. Paths
(`.`, `./x`, `dist/....whl`, with or without `[extras]`) are what the docs
may install. Also checks that the distribution is not named `trainwatch`.

Interpreter: whichever runs CTest's Python (pyenv's 3.11 here); standard
library only.
"""

import glob
import os
import re
import shlex
import unittest

ROOT = os.environ.get("DOCS_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# pip options that take a value: the value is not a requirement.
_VALUED = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url",
           "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix",
           "--root", "--python-version", "--platform", "--implementation", "--abi",
           "--only-binary", "--no-binary", "--progress-bar", "--cache-dir", "--log",
           "--config-settings", "-C", "--upgrade-strategy", "--python"}
# The start of a pip command: `pip install`, `pip3 install`, `python -m pip install`.
_PIP = re.compile(r"(?:\bpython[0-9.]*\s+-m\s+pip|\bpip3?)\s+install\b")


def pip_commands(text):
    """The argument strings of every pip install in a markdown text: in code
    blocks, one per line (a trailing backslash continues it), and in inline
    code spans, which may wrap across lines."""
    found = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            found += _after_pip(line.split(" #", 1)[0])
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        found += _after_pip(" ".join(span.split()))
    return found


def _after_pip(line):
    out = []
    for m in _PIP.finditer(line):
        rest = line[m.end():]
        nxt = _PIP.search(rest)
        out.append(rest[:nxt.start()] if nxt else rest)
    return out


def is_path(arg):
    base = arg.split("[", 1)[0]
    return (base in (".", "..") or "/" in base or base.endswith((".whl", ".tar.gz", ".zip"))
            or base.startswith(("$", "~")))


def bare_requirements(args):
    """The arguments of one pip install that the index would resolve."""
    try:
        words = shlex.split(args)
    except ValueError:
        words = args.split()
    bare, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("&&", "||", ";", "|") or w.startswith(("&", ";", "|", ">")):
            break
        if w.startswith("-"):
            skip = w in _VALUED
            continue
        if not is_path(w):
            bare.append(w)
    return bare


def doc_pages():
    pages = [os.path.join(ROOT, "README.md")]
    for pattern in ("docs/*.md", "deploy/**/*.md", "examples/**/*.md", "bench/**/*.md"):
        pages += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    return sorted(p for p in pages if os.path.isfile(p))


class DocPipTest(unittest.TestCase):
    def test_the_checker_catches_a_bare_name(self):
        # The checker itself: each of these would fetch from the index.
        for text in ("```\npip install trainwatch\n```\n",
                     "Run `pip install\n'trainwatch[transformers]'` first.\n",
                     "```\npython3 -m pip install -U trainwatch-agent==0.1.0  # ours?\n```\n",
                     "```\npip install --no-deps -r reqs.txt \\\n  trainwatch\n```\n"):
            commands = pip_commands(text)
            self.assertTrue(commands, text)
            self.assertTrue(any(bare_requirements(c) for c in commands), text)
        for text in ("```\npip install --no-build-isolation .\n```\n",
                     "`pip install 'dist/trainwatch_agent-0.1.0-cp311-cp311-x.whl[lightning]'`",
                     "```\npip install ./dist/*.whl -r requirements.txt\n```\n"):
            self.assertEqual([b for c in pip_commands(text) for b in bare_requirements(c)], [],
                             text)

    def test_every_pip_command_in_the_docs_installs_a_path(self):
        pages = doc_pages()
        self.assertIn(os.path.join(ROOT, "docs", "install.md"), pages)
        seen = 0
        for page in pages:
            with open(page, encoding="utf-8") as f:
                for args in pip_commands(f.read()):
                    seen += 1
                    bare = bare_requirements(args)
                    self.assertEqual(bare, [], f"{os.path.relpath(page, ROOT)}: `pip install{args}` "
                                     f"would fetch {bare} from the package index; install the "
                                     "checkout or a built wheel instead")
        # install.md shows the wheel, the extras and the source install.
        self.assertGreaterEqual(seen, 3)

    def test_the_distribution_name_is_not_the_one_someone_else_owns(self):
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            name = re.search(r'^name\s*=\s*"([^"]+)"', f.read(), flags=re.M).group(1)
        self.assertNotEqual(re.sub(r"[-_.]+", "-", name).lower(), "trainwatch")


if __name__ == "__main__":
    unittest.main()
