"""The documentation's tested snippets, found by name instead of copied.

A tested snippet is the fenced block right after a `<!-- readme-test: NAME -->`
line, on any page of the documentation: README.md or docs/*.md under
$DOCS_ROOT (the repository's root). Each name must be on exactly one page, so a
snippet can move from page to page without its test changing.
tests/readme/extract_snippet.cmake finds the C++ ones by the same rule.
"""

import glob
import os
import re
from typing import Dict, List, NamedTuple, Optional


class Snippet(NamedTuple):
    code: str
    page: str  # the page's path, for tracebacks and messages


def pages(root: str = "") -> List[str]:
    """README.md and docs/*.md under root (default $DOCS_ROOT), in that order."""
    root = root or os.environ["DOCS_ROOT"]
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def snippet(name: str, lang: str = "python", root: str = "") -> Snippet:
    """The ```LANG block after `<!-- readme-test: NAME -->`; AssertionError when
    no page or more than one has it."""
    pattern = re.compile(r"<!-- readme-test: " + re.escape(name) + r" -->\n```" + re.escape(lang)
                         + r"\n(.*?)\n```", re.S)
    found = []
    for page in pages(root):
        with open(page, encoding="utf-8") as f:
            found += [Snippet(m.group(1), page) for m in pattern.finditer(f.read())]
    if len(found) != 1:
        where = ", ".join(s.page for s in found) or "none of " + ", ".join(pages(root))
        raise AssertionError(f"want one ```{lang} block after readme-test: {name}, found "
                             f"{len(found)} ({where})")
    return found[0]


def run(name: str, namespace: dict, replace: Optional[Dict[str, str]] = None) -> None:
    """Executes snippet NAME in namespace, each key of replace made its value
    (the address a reader would use made a test daemon's)."""
    code, page = snippet(name)
    for old, new in (replace or {}).items():
        if old not in code:
            raise AssertionError(f"{page}, readme-test {name}: no {old!r} to replace")
        code = code.replace(old, new)
    exec(compile(code, f"{page} ({name})", "exec"), namespace)
