"""A DataLoader worker_init_fn (inject.py sets it): writes
$INJECT_PROBE_WORKERS/<pid>.json saying what trainwatch holds in this worker:
whether trainwatch.attach is loaded, attached, holds an agent, and the
worker's TCP connections to trainwatchd's port."""

import json
import os
import sys


def probe(worker_id):
    attach = sys.modules.get("trainwatch.attach")
    held = attach.state() if attach is not None else {"attached": False, "agent": False}
    port = os.environ.get("TRAINWATCH_SERVER", ":0").rsplit(":", 1)[1]
    with open(os.path.join(os.environ["INJECT_PROBE_WORKERS"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"loaded": attach is not None, "attached": held["attached"],
                   "agent": held["agent"], "server_sockets": _sockets_to(int(port))}, f)


def _sockets_to(port):
    """This process's TCP connections to the port (its fds against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    count += 1
    return count
