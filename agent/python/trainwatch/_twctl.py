"""`twctl`, the operator CLI, as the `twctl` console script of an installed
package: the native module runs the same commands as the twctl binary."""

from __future__ import annotations

import signal
import sys

from . import _trainwatch


def main() -> None:
    run = getattr(_trainwatch, "twctl_main", None)
    if run is None:
        sys.exit("twctl: this trainwatch was built without it (a source install): install a "
                 "wheel (docs/install.md), or build it with CMake (make build: build/bin/twctl)")
    # As a native program: Ctrl-C ends it (commands that drain first set
    # their own handler), and a closed pipe ends it quietly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(run(sys.argv[1:]))
