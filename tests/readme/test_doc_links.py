"""The documentation's pages (README.md and docs/*.md under $DOCS_ROOT) link
to pages and sections that exist, and the README stays an overview: under
200 lines, with the manual in docs/."""

import os
import re
import unittest

import doc_snippets

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """GitHub's anchors for the headings of a Markdown page."""
    out = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


class DocLinksTest(unittest.TestCase):
    def test_every_relative_link_reaches_a_page_and_section(self):
        broken = []
        for page in doc_snippets.pages():
            with open(page, encoding="utf-8") as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
            for target in LINK.findall(text):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
                if not os.path.exists(dest):
                    broken.append(f"{page}: {target} (no {dest})")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    broken.append(f"{page}: {target} (no section #{anchor})")
        self.assertEqual(broken, [])

    def test_the_readme_is_an_overview(self):
        with open(os.path.join(os.environ["DOCS_ROOT"], "README.md"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        self.assertLess(len(lines), 200)
        # It starts with the two commands.
        self.assertEqual(lines[2], "```")
        self.assertTrue(lines[3].startswith("make demo "), lines[3])
        self.assertTrue(any(line.startswith("make test ") for line in lines[4:12]))


if __name__ == "__main__":
    unittest.main()
