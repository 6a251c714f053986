"""`trainwatch run [options] -- COMMAND...`: runs a torch job with every rank
watched and enforced, without a line of trainwatch in it.

COMMAND is started with trainwatch's bootstrap first on PYTHONPATH
(trainwatch/_bootstrap/sitecustomize.py), which every Python process of the
job inherits: torchrun, accelerate launch, `python -m`, plain scripts. In
each rank it attaches when the program imports torch (trainwatch.attach); in
the launchers and helpers it does nothing.

The exit status is COMMAND's, except after a halt: 3, whatever the launcher
made of its failed worker (torchrun exits 1), since a halted rank records the
halt in a folder this command owns for the job's lifetime. That record also
stops a launcher's restart (torchrun --max-restarts) from training into the
same failure: a restarted rank says so and exits 3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

EXIT_HALTED = 3
_HERE = os.path.dirname(os.path.abspath(__file__))

USAGE = """trainwatch run [options] -- COMMAND [ARGS...]

Runs COMMAND (torchrun ..., python train.py, accelerate launch ...,
python -m ...) with trainwatch attached to every rank: each optimizer step is
judged before the update; a bad batch's update is skipped on every rank, a
numerical failure halts the job (exit status 3) naming the tensor and the rank,
and every step streams to trainwatchd."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainwatch run", usage=USAGE,
                                description="Options not given come from the TRAINWATCH_* "
                                            "variables they set.")
    p.add_argument("--server", help="trainwatchd's address, or its replicas' separated by "
                                    "commas (TRAINWATCH_SERVER)")
    p.add_argument("--run-id", help="the run's name (TRAINWATCH_RUN_ID); default: the "
                                    "launcher's (torchrun --rdzv-id, SLURM's job id), else "
                                    "the program's name and the start time")
    p.add_argument("--token", help="the bearer token for trainwatchd (TRAINWATCH_TOKEN)")
    p.add_argument("--rules", help="rules: a JSON file or inline JSON (TRAINWATCH_RULES)")
    p.add_argument("--spill-dir", help="where records wait while trainwatchd is unreachable "
                                       "(TRAINWATCH_SPILL_DIR)")
    p.add_argument("--observe-only", action="store_true",
                   help="judge and record every step, never skip nor halt")
    p.add_argument("--require", action="store_true",
                   help="a rank that cannot be attached stops (exit 2) instead of training "
                        "unwatched")
    p.add_argument("--explain", action="store_true",
                   help="print what was found at the first step, then stop")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the job's command")
    return p


def _default_run_id(command: Sequence[str]) -> str:
    """A run id every rank of this launch shares: the program's name (a
    script's, or the one after a launcher's options) and the start time."""
    name = "job"
    for arg in command:
        base = os.path.basename(arg)
        if base.endswith(".py"):
            name = base[:-3]
            break
    else:
        if command:
            name = os.path.basename(command[0])
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:80] or "job"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"


def job_environment(args: argparse.Namespace, state_dir: str,
                    base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment COMMAND runs in."""
    env = dict(os.environ if base is None else base)
    for flag, var in (("server", "TRAINWATCH_SERVER"), ("run_id", "TRAINWATCH_RUN_ID"),
                      ("token", "TRAINWATCH_TOKEN"), ("rules", "TRAINWATCH_RULES"),
                      ("spill_dir", "TRAINWATCH_SPILL_DIR")):
        value = getattr(args, flag)
        if value is not None:
            env[var] = value
    for flag, var in (("observe_only", "TRAINWATCH_OBSERVE_ONLY"),
                      ("require", "TRAINWATCH_REQUIRE"), ("explain", "TRAINWATCH_EXPLAIN")):
        if getattr(args, flag):
            env[var] = "1"
    if not (env.get("TRAINWATCH_RUN_ID") or env.get("SLURM_JOB_ID")):
        # torchrun's own id, when it has one, is preferred by each rank.
        env["TRAINWATCH_DEFAULT_RUN_ID"] = _default_run_id(args.command)
    env["TRAINWATCH_ATTACH"] = "1"
    env["TRAINWATCH_STATE_DIR"] = state_dir
    # The bootstrap first; then this very package, so that the job's
    # interpreter finds the trainwatch this command is.
    paths = [os.path.join(_HERE, "_bootstrap"), os.path.dirname(_HERE)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    args.command = command
    if not command:
        _parser().print_usage(sys.stderr)
        sys.stderr.write("trainwatch run: no COMMAND given (after --)\n")
        return 2
    if shutil.which(command[0]) is None:
        sys.stderr.write(f"trainwatch run: {command[0]}: command not found\n")
        return 127
    state_dir = tempfile.mkdtemp(prefix="trainwatch-run-")
    try:
        env = job_environment(args, state_dir)
        if "TRAINWATCH_DEFAULT_RUN_ID" in env and env.get("TRAINWATCH_SERVER"):
            sys.stderr.write(f"trainwatch: run id {env['TRAINWATCH_DEFAULT_RUN_ID']} unless "
                             "the launcher names the job (--run-id names it; a restart that "
                             "should resume the run needs the same name)\n")
        proc = subprocess.Popen(command, env=env)
        # Ctrl-C reaches the job's process group directly: wait for it. A
        # SIGTERM sent to this process alone (a scheduler's) is passed on.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda sig, _: proc.send_signal(sig))
        rc = proc.wait()
        halted = os.path.join(state_dir, "halted")
        if os.path.exists(halted):
            return EXIT_HALTED
        return 128 - rc if rc < 0 else rc
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: trainwatch run [options] -- COMMAND [ARGS...]\n"
                         "       trainwatch run --help\n")
        return 0 if argv else 2
    if argv[0] != "run":
        sys.stderr.write(f"trainwatch: unknown command {argv[0]!r} (the one command: run)\n")
        return 2
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
