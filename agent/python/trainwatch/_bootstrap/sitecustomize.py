"""Loaded at start-up by every Python process of a job run under
`trainwatch run`, which puts this folder first on PYTHONPATH: torchrun and
its workers, `python -m`, multiprocessing's children, DataLoader workers,
compile workers. It must cost nothing and break nothing in any of them, so it
imports the standard library alone, runs the sitecustomize it shadows
(Debian's, an image's, a user's), and decides what this process is:

- a rank of the job (RANK is set, or the one process of a plain script):
  trainwatch.attach is loaded when the program imports torch, never before;
- a launcher (torchrun, accelerate, deepspeed) or a helper (a
  multiprocessing child, a compile worker): inert; a multiprocessing child
  that sets up torch.distributed itself (torch.multiprocessing.spawn's ranks)
  is a rank from then on.

Any failure here prints one line and leaves the process as it would have
been without trainwatch (CPython turns an exception in sitecustomize into a
confusing start-up failure), unless TRAINWATCH_REQUIRE asks for a stop.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping  # loaded at start-up already, unlike typing

_HERE = os.path.dirname(os.path.abspath(__file__))
# Processes that start the job's ranks and train nothing themselves, by the
# program they run (a console script's name or a module's).
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate",
              "accelerate.commands.launch", "deepspeed", "deepspeed.launcher.runner",
              "deepspeed.launcher.launch", "composer", "composer.cli.launcher")
# Modules whose processes are helpers of a rank: compile workers.
_HELPER_MODULES = ("torch._inductor", "torch.utils._cpp_extension", "triton")


def _chain_shadowed() -> None:
    """Imports the sitecustomize this module hides from the import system:
    only one module of that name is ever imported at start-up."""
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        import importlib
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            _say(f"the sitecustomize beside trainwatch's failed: {e!r}")
    except Exception as e:  # theirs raised: report it as CPython would have
        _say(f"the sitecustomize beside trainwatch's failed: {e!r}")
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _say(text: str) -> None:
    sys.stderr.write(f"trainwatch: {text}\n")
    sys.stderr.flush()


def _program(argv: list[str]) -> str:
    """What the process runs: the module of `-m`, '-c' for code, else the
    script's base name without .py."""
    args = argv[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return str(args[i + 1])
        if a.startswith("-m") and len(a) > 2:
            return str(a[2:])
        if a == "-c" or (a.startswith("-c") and len(a) > 2):
            return "-c"
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if not a.startswith("-") or a == "-":
            name = os.path.basename(a)
            return str(name[:-3] if name.endswith(".py") else name)
        i += 1
    name = os.path.basename(argv[0]) if argv else ""
    return name[:-3] if name.endswith(".py") else name


def role(argv: list[str], environ: Mapping[str, str]) -> str:
    """'rank', 'launcher', 'helper' or 'child' (a multiprocessing child: a
    rank once it sets up torch.distributed) for a process started as argv."""
    program = _program(argv)
    if "--multiprocessing-fork" in argv or (program == "-c" and any(
            "multiprocessing" in a for a in argv)):
        return "child"
    if any(program == m or program.startswith(m + ".") for m in _HELPER_MODULES) or any(
            "/torch/_inductor/" in a for a in argv[1:2]):
        return "helper"
    if program in _LAUNCHERS and "RANK" not in environ:
        return "launcher"
    return "rank"


def _install() -> None:
    if os.environ.get("TRAINWATCH_ATTACH") != "1":
        return  # PYTHONPATH leaked outside `trainwatch run`
    argv = list(getattr(sys, "orig_argv", sys.argv))
    what = role(argv, os.environ)
    if what in ("launcher", "helper"):
        return
    state = os.environ.get("TRAINWATCH_STATE_DIR", "")
    halted = os.path.join(state, "halted") if state else ""
    if what == "rank" and halted and os.path.exists(halted):
        # A launcher restarting the job (torchrun --max-restarts) would train
        # it into the same failure: the restart waits for a person instead.
        with open(halted) as f:
            why = f.read().strip()
        _say(f"not restarting: this job was halted ({why}); approve a fix with twctl, then "
             "start it again")
        os._exit(3)
    from importlib import abc, util

    class _AfterImport(abc.MetaPathFinder):
        """Runs trainwatch.attach's hook for a module once it is imported
        (torch, the trainers), so that nothing is imported early."""

        def __init__(self) -> None:
            self.busy: set[str] = set()

        def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
            if name not in _WATCHED or name in self.busy:
                return None
            self.busy.add(name)
            try:
                spec = util.find_spec(name)
            finally:
                self.busy.discard(name)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader, name)
            return spec

    class _Loader(abc.Loader):
        def __init__(self, inner, name) -> None:  # type: ignore[no-untyped-def]
            self.inner, self.name = inner, name

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            return self.inner.create_module(spec)

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            self.inner.exec_module(module)
            _imported(self.name, module)

        def __getattr__(self, attr):  # type: ignore[no-untyped-def]
            return getattr(self.inner, attr)

    sys.meta_path.insert(0, _AfterImport())
    os.environ["TRAINWATCH_ROLE"] = what  # read by trainwatch.attach; children reset it
    for name in _WATCHED:
        if name in sys.modules:  # the shadowed sitecustomize imported it already
            _imported(name, sys.modules[name])


def _attach_at_process_group(torch: object) -> None:
    """A multiprocessing child (a DataLoader worker, a pool's worker, or a
    rank of torch.multiprocessing.spawn) loads nothing of trainwatch until
    it sets up torch.distributed, which only a rank does."""
    import torch.distributed.distributed_c10d as c10d
    original = c10d.init_process_group

    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(*args, **kwargs)
        c10d.init_process_group = original
        torch.distributed.init_process_group = original  # type: ignore[attr-defined]
        os.environ["TRAINWATCH_ROLE"] = "rank"
        _imported("torch", torch)
        return out
    c10d.init_process_group = init_process_group
    torch.distributed.init_process_group = init_process_group  # type: ignore[attr-defined]


# The modules whose import loads trainwatch.attach (it patches each one).
_WATCHED = ("torch", "transformers.trainer", "lightning.pytorch.trainer.trainer",
            "pytorch_lightning.trainer.trainer", "torchtitan.trainer")


def _imported(name: str, module: object) -> None:
    if name == "torch" and os.environ.get("TRAINWATCH_ROLE") == "child":
        _attach_at_process_group(module)
        return
    try:
        from trainwatch import attach
        attach.on_import(name, module)
    except SystemExit:
        raise
    except BaseException as e:  # never break the job: say why it is not watched
        _say(f"not attached: {e!r}")
        if os.environ.get("TRAINWATCH_REQUIRE") == "1":
            _say("stopping: trainwatch run --require")
            os._exit(2)


if __name__ == "sitecustomize":  # at start-up; not when a test imports it to read role()
    _chain_shadowed()
    try:
        _install()
    except Exception as e:
        _say(f"not attached: {e!r}")
        if os.environ.get("TRAINWATCH_REQUIRE") == "1":
            os._exit(2)
