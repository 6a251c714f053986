#!/usr/bin/env python3
"""server/'s folders form layers: no folder includes from a folder that
depends on it, directly or through others (daemon/ wires the others and
nothing includes it; ingest/ and pager/ meet only in incidents/). Reads the
quoted includes of every file under server/ and fails on any cycle between
folders, naming the include lines that close it. Run with any Python 3
(make test: Debian's /usr/bin/python3).

  check_server_layers.py SERVER_DIR [--self-test]
"""

import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def folder_graph(server):
    """{folder: {folder it includes from: [file:line, ...]}}."""
    folders = {d for d in os.listdir(server) if os.path.isdir(os.path.join(server, d))}
    graph = {f: {} for f in folders}
    for top in sorted(folders):
        for root, _, files in os.walk(os.path.join(server, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    dep = m.group(1)
                    if dep in folders and dep != top:
                        line = text.count("\n", 0, m.start()) + 1
                        where = f"{os.path.relpath(path, server)}:{line}"
                        graph[top].setdefault(dep, []).append(where)
    return graph


def cycle(graph):
    """A cycle of folders as a list [a, b, ..., a], or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep] if dep in path else [node, dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def check(graph):
    c = cycle(graph)
    if c is None:
        return []
    lines = [f"server/ folders include each other in a cycle: {' -> '.join(c)}"]
    for a, b in zip(c, c[1:]):
        lines.append(f"  {a} -> {b}: " + ", ".join(graph[a][b][:3]))
    return lines


def self_test():
    # The check fails on a cycle and passes without it.
    assert check({"a": {"b": ["a/x.cc:1"]}, "b": {"a": ["b/y.cc:2"]}})
    assert check({"a": {"b": ["a/x.cc:1"]}, "b": {"c": ["b/y.cc:2"]}, "c": {"a": ["c/z.h:3"]}})
    assert not check({"a": {"b": ["a/x.cc:1"]}, "b": {}, "c": {"a": [], "b": []}})


def main():
    self_test()
    server = sys.argv[1]
    graph = folder_graph(server)
    problems = check(graph)
    if problems:
        print("\n".join(problems))
        return 1
    order = []
    remaining = dict(graph)
    while remaining:
        ready = sorted(f for f, deps in remaining.items() if not set(deps) & set(remaining))
        order.append(", ".join(ready))
        for f in ready:
            del remaining[f]
    print("server/ layers, lowest first: " + " | ".join(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
