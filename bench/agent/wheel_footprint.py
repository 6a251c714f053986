"""What the self-contained wheel costs a trainer's environment: its size, the
time `import trainwatch` adds to an interpreter's start, and the resident
memory it adds, measured against the same interpreter doing nothing:

  wheel_footprint.py WHEEL [--rounds N]

The wheel is installed with --no-index into a fresh venv of pyenv's CPython
of its tag (no torch there: the goal is the agent's own cost). Each round
starts both processes, bare first or second in turn; reported are the
medians over rounds of the differences (import time, from the wall clock of
each process; RSS, from its peak resident set). Goals (bench/run_all.py):
wheel <= 40 MB, import <= 200 ms.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BARE = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
IMPORT = "import trainwatch, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def interpreter(tag):
    """pyenv's newest CPython of a wheel tag's version (cp311: 3.11)."""
    version = f"{tag[2]}.{tag[3:]}"
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")),
                   key=lambda p: [int(x) for x in p.split(os.sep)[-3].split(".") if x.isdigit()])
    if not found:
        sys.exit(f"wheel_footprint: no CPython {version} under ~/.pyenv/versions")
    return found[-1]


def run(python, code, cwd):
    """(wall seconds, peak RSS in KiB) of one interpreter running `code`."""
    t0 = time.perf_counter()
    out = subprocess.run([python, "-c", code], check=True, stdout=subprocess.PIPE, text=True,
                         cwd=cwd, env={"PATH": "/usr/bin:/bin"}).stdout
    return time.perf_counter() - t0, int(out.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    tag = os.path.basename(args.wheel).split("-")[2]
    with tempfile.TemporaryDirectory(prefix="wheel_footprint.") as tmp:
        subprocess.run([interpreter(tag), "-m", "venv", f"{tmp}/venv"], check=True)
        python = f"{tmp}/venv/bin/python"
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-index",
                        "--disable-pip-version-check", args.wheel], check=True)
        run(python, IMPORT, tmp)  # the first import compiles and caches the bytecode
        ms, kib = [], []
        for r in range(args.rounds):
            order = [BARE, IMPORT] if r % 2 == 0 else [IMPORT, BARE]
            got = {code: run(python, code, tmp) for code in order}
            ms.append(1000 * (got[IMPORT][0] - got[BARE][0]))
            kib.append(got[IMPORT][1] - got[BARE][1])
    size = os.path.getsize(args.wheel) / 1e6
    figures = [
        (f"wheel size ({tag})", size, "MB"),
        (f"import trainwatch over a bare interpreter's start ({tag})", statistics.median(ms), "ms"),
        (f"RSS added by import trainwatch ({tag})", statistics.median(kib) / 1024, "MB"),
    ]
    for name, value, unit in figures:
        print(f"{name}: {value:.1f} {unit}")
    spread = {"ms": (min(ms), max(ms)), "MB": (min(kib) / 1024, max(kib) / 1024)}
    if os.environ.get("TW_BENCH_JSON"):
        with open(os.environ["TW_BENCH_JSON"], "a") as f:
            for i, (name, value, unit) in enumerate(figures):
                lo, hi = spread[unit] if i > 0 else (None, None)
                f.write(json.dumps({"figure": name, "value": round(value, 3), "baseline": None,
                                    "ratio": None, "unit": unit,
                                    "median": round(value, 3) if i > 0 else None,
                                    "min": lo and round(lo, 3), "max": hi and round(hi, 3)})
                        + "\n")


if __name__ == "__main__":
    main()
