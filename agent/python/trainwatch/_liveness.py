"""The training thread's stack for the heartbeats, when its step is late
(docs/hangs.md): a stall page names the file and line each rank is at.

A daemon thread of the agent's wakes twice per heartbeat interval and asks
the native agent how long the training thread has been in its step. Past
LATE_FLOOR_MS and LATE_MEDIANS times the rank's median step, it reads the
training thread's frames (sys._current_frames: the training thread blocked
in a collective, a sleep or a lock has released the GIL) and hands the
native agent the stack, its innermost frame in the trainer's own code, and
the phase the frames show. Nothing runs on the step path.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from types import FrameType
from typing import Any, Optional

# trainwatch.v1.Phase's numbers.
PHASES = {"unspecified": 0, "forward": 1, "backward": 2, "collective": 3, "optimizer": 4,
          "checkpoint": 5, "eval": 6, "data": 7}

LATE_FLOOR_MS = 1000
LATE_MEDIANS = 3
MAX_FRAMES = 40

# Where library code lives: the standard library, trainwatch itself, and
# any installed package (a site-packages or dist-packages folder, the
# environment's own or one a .pth file adds). A frame elsewhere is the
# trainer's own.
_LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
    os.path.dirname(os.path.abspath(__file__)))})
_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

# A frame's file, by what it shows of the phase, innermost match first.
_PHASE_OF_FILE = (
    (("torch/serialization.py", "torch/distributed/checkpoint/"), "checkpoint"),
    (("torch/distributed/",), "collective"),
    (("torch/autograd/",), "backward"),
    (("torch/optim/",), "optimizer"),
    (("torch/utils/data/",), "data"),
)


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    return path.startswith(_LIBRARY_DIRS) or any(d in path for d in _PACKAGE_DIRS)


def describe(frame: FrameType) -> tuple[str, str, int]:
    """(stack, blocked_at, phase) of a thread whose innermost frame is
    `frame`: "file:line in function" per frame, innermost last."""
    frames = traceback.extract_stack(frame, limit=MAX_FRAMES)
    stack = "\n".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
    # The trainer's own innermost frame; all library code (an installed
    # trainer's entry point): the innermost frame.
    own = [f for f in frames if not _is_library(f.filename)] or frames[-1:]
    blocked_at = f"{os.path.basename(own[-1].filename)}:{own[-1].lineno} in {own[-1].name}" \
        if own else ""
    phase = 0
    for f in reversed(frames):
        name = f.filename.replace(os.sep, "/")
        for parts, which in _PHASE_OF_FILE:
            if any(p in name for p in parts):
                phase = PHASES[which]
                break
        if phase:
            break
    return stack, blocked_at, phase


class Watchdog:
    """Reads the stack of `thread_id` (the thread that built the agent: the
    training thread) for the native agent while its step is late."""

    def __init__(self, native: Any, thread_id: int, interval_ms: int) -> None:
        self._native = native
        self._thread_id = thread_id
        self._interval = max(interval_ms, 100) / 2000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainwatch-liveness",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            finished, in_step_ms, median_ms = self._native.liveness()
            if in_step_ms < max(LATE_FLOOR_MS, LATE_MEDIANS * median_ms):
                continue
            frame: Optional[FrameType] = sys._current_frames().get(self._thread_id)
            if frame is None:
                return  # the training thread is gone
            stack, blocked_at, phase = describe(frame)
            del frame
            self._native.set_stack(finished, stack, blocked_at, phase)

    def stop(self) -> None:
        self._stop.set()
