#!/usr/bin/python3
"""trainwatchd on PostgreSQL with a synchronous standby (issue 36's figures).

  /usr/bin/python3 bench/ha/pg_bench.py [--build build] [--smoke] [--budget 230]

Starts a PostgreSQL 15 primary and one synchronous standby (Debian's
/usr/lib/postgresql/15/bin, or $TRAINWATCH_PG_BIN; as the postgres user when
run as root; Unix sockets in a temporary folder, free ports;
synchronous_standby_names 'ANY 1 (standby1)'), then measures:

  throughput  trainwatchd on PostgreSQL against trainwatchd on SQLite
              (--db_synchronous full), the same tw-ingest-load each: 8 runs
              x 20,000 steps, unpaced; the two alternate within each of 5
              rounds (the order reversed every other round), each on a fresh
              database
  latency     p99 send-to-durable-ack at 10,000 records/s, 8 runs x 8 ranks
              per-rank, 800 steps (5.1 s), on PostgreSQL, alternating with
              SQLite as the baseline, 5 rounds: a burst of the shared
              machine's other work moves one round's p99 several-fold
  failover    two replicas (--replica a / b, --lease_ms 3000) on one
              database through the multi-host conninfo; a paced load on the
              owner, then kill -9 of the owner; timed from the kill to the
              standby's first durable ack (a one-step tw-ingest-load against
              it, started as soon as it prints "serving agents on"); 3 times

Figures (run_all.py's schema) go as JSON lines to $TW_BENCH_JSON, or to
stdout when unset; progress goes to stderr. --smoke: tiny sizes, one round,
one failover. Everything started is stopped on exit, failure or SIGTERM /
SIGINT, and every wait has a timeout. --budget (seconds): no new phase
starts after it, so that run_all.py's own timeout, whose SIGKILL would leave
the database servers running, is never reached.
"""

import argparse
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PG_BIN = os.environ.get("TRAINWATCH_PG_BIN") or "/usr/lib/postgresql/15/bin"
STANDBY = "standby1"
LEASE_MS = 3000


def say(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    # The servers listen on Unix sockets only, but the port names the socket
    # file; a free TCP port keeps that name unique.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what, interval=0.05):
    end = time.monotonic() + timeout
    while True:
        r = predicate()
        if r:
            return r
        if time.monotonic() >= end:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def stop_group(p, grace=10):
    """SIGINT, then SIGKILL, to a child started in a session of its own (and
    whatever it spawned: tw-ingest-load's server)."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


class Cluster:
    """A primary and a synchronous standby in a temporary folder."""

    def __init__(self):
        self.root = os.geteuid() == 0
        self.dir = tempfile.mkdtemp(prefix="tw-pg-bench.", dir=self.reachable_tmp())
        if self.root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.nodes = {}  # name -> (data dir, port)
        self.started = []

    def reachable_tmp(self):
        """$TMPDIR, unless root runs us and the postgres user cannot enter
        it (run_all_test.py's is a private 0700 folder): then /tmp."""
        tmp = tempfile.gettempdir()
        if not self.root:
            return tmp
        path = os.path.realpath(tmp)
        while True:
            if not os.stat(path).st_mode & 0o001:
                return "/tmp"
            if path == "/":
                return tmp
            path = os.path.dirname(path)

    def tool(self, *args, timeout=90):
        # initdb refuses root; the other tools run as the data's owner too.
        argv = (["runuser", "-u", "postgres", "--"] if self.root else []) + [
            os.path.join(PG_BIN, args[0]), *args[1:]]
        p = subprocess.run(argv, cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{args[0]} exited {p.returncode}: {p.stdout.decode()[-2000:]}")

    def psql(self, sql, port=None, db="postgres"):
        p = subprocess.run([os.path.join(PG_BIN, "psql"), "-h", self.dir, "-p",
                            str(port or self.nodes["primary"][1]), "-U", "postgres", "-d", db,
                            "-AtXq", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
                           env=dict(os.environ, PGCONNECT_TIMEOUT="10"))
        if p.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {p.stderr.decode()}")
        return p.stdout.decode().strip()

    def start_node(self, name):
        data, _ = self.nodes[name]
        self.tool("pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l",
                  os.path.join(self.dir, name + ".log"), timeout=90)
        self.started.append(name)

    def start(self):
        for name in ("primary", STANDBY):
            self.nodes[name] = (os.path.join(self.dir, name), free_port())
        data, port = self.nodes["primary"]
        # --no-sync: initdb's thousand files need not survive a power loss;
        # the server itself keeps fsync on.
        self.tool("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync",
                  "--locale=C", "--encoding=UTF8")
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"\n# bench/ha/pg_bench.py\nlisten_addresses = ''\n"
                    f"unix_socket_directories = '{self.dir}'\nport = {port}\n"
                    f"lc_messages = 'C'\nsynchronous_commit = on\n"
                    f"synchronous_standby_names = 'ANY 1 ({STANDBY})'\n")
        self.start_node("primary")
        sdata, sport = self.nodes[STANDBY]
        self.tool("pg_basebackup", "-D", sdata, "-R", "-X", "stream", "-c", "fast", "--no-sync",
                  "-h", self.dir, "-p", str(port), "-U", "postgres")
        # The copy's postgresql.conf is the primary's: its own port, and an
        # application_name that synchronous_standby_names names.
        with open(os.path.join(sdata, "postgresql.conf"), "a") as f:
            f.write(f"port = {sport}\n")
        with open(os.path.join(sdata, "postgresql.auto.conf"), "a") as f:
            f.write(f"primary_conninfo = 'host={self.dir} port={port} user=postgres "
                    f"application_name={STANDBY}'\n")
        self.start_node(STANDBY)
        wait_for(lambda: self.psql(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = "
            f"'{STANDBY}'") in ("sync", "quorum"), 60, "the standby becoming synchronous", 0.2)

    def conninfo(self, db):
        return f"host={self.dir} port={self.nodes['primary'][1]} dbname={db} user=postgres"

    def multi_host(self, db):
        (_, p1), (_, p2) = self.nodes["primary"], self.nodes[STANDBY]
        return (f"host={self.dir},{self.dir} port={p1},{p2} dbname={db} user=postgres "
                "connect_timeout=10 target_session_attrs=read-write")

    def create_db(self, db):
        self.psql(f"CREATE DATABASE {db}")

    def stop(self):
        for name in reversed(self.started):
            data, _ = self.nodes[name]
            try:
                self.tool("pg_ctl", "stop", "-m", "immediate", "-w", "-t", "30", "-D", data,
                          timeout=45)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                say(f"pg_ctl stop {name}: {e}; killing its postmaster")
                try:
                    with open(os.path.join(data, "postmaster.pid")) as f:
                        os.kill(int(f.readline()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        self.started = []
        shutil.rmtree(self.dir, ignore_errors=True)


class Bench:
    def __init__(self, build, smoke, budget):
        self.twd = os.path.join(build, "bin", "trainwatchd")
        self.load = os.path.join(build, "bin", "tw-ingest-load")
        self.smoke = smoke
        self.deadline = time.monotonic() + budget
        self.work = tempfile.mkdtemp(prefix="tw-pg-bench-work.")
        self.children = []
        self.cluster = Cluster()
        self.dbs = 0

    def fresh_db(self):
        self.dbs += 1
        name = f"tw_{self.dbs}"
        self.cluster.create_db(name)
        return name

    def over_budget(self, phase):
        if time.monotonic() > self.deadline:
            say(f"{phase}: skipped, the bench's --budget is spent")
            return True
        return False

    def run_load(self, server_cmd, flags, limit):
        """tw-ingest-load --spawn SERVER_CMD FLAGS; its JSON result or None."""
        argv = [self.load, "--spawn", server_cmd, *flags, "--duration-limit", str(limit),
                "--json"]
        with open(os.path.join(self.work, "loads.log"), "a") as log:
            log.write("== " + " ".join(shlex.quote(a) for a in argv) + "\n")
            log.flush()
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log,
                                 start_new_session=True)
            self.children.append(p)
            try:
                out, _ = p.communicate(timeout=limit + 40)
            except subprocess.TimeoutExpired:
                stop_group(p)
                out = b""
        try:
            r = json.loads(out.decode() or "{}")
        except ValueError:
            r = {}
        if p.returncode != 0 or not r.get("ok"):
            say(f"  load failed (exit {p.returncode}); see {self.work}/loads.log")
            return None
        return r

    def server(self, target, db):
        if target == "pg":
            return (f"{self.twd} --listen 127.0.0.1:0 --metrics_listen= --db "
                    f"{shlex.quote(self.cluster.conninfo(db))}")
        return (f"{self.twd} --listen 127.0.0.1:0 --metrics_listen= --db {db}/tw.db "
                "--db_synchronous full")

    def alternate(self, name, flags, limit, rounds):
        """{target: [result per round]} for pg and sqlite, side by side."""
        results = {"pg": [], "sqlite": []}
        for rnd in range(rounds):
            if self.over_budget(f"{name} round {rnd + 1}"):
                break
            for target in (("pg", "sqlite") if rnd % 2 == 0 else ("sqlite", "pg")):
                db = self.fresh_db() if target == "pg" else tempfile.mkdtemp(dir=self.work)
                r = self.run_load(self.server(target, db), flags, limit)
                if target == "sqlite":
                    shutil.rmtree(db, ignore_errors=True)
                say(f"  {name} round {rnd + 1} {target}: " + (
                    f"{r['records_per_second']:.0f} records/s, p99 {r['latency_ms']['p99']:.2f} ms"
                    if r else "failed"))
                results[target].append(r)
        return results

    def replica(self, name, db):
        out = os.path.join(self.work, f"replica-{name}-{self.dbs}.out")
        err = os.path.join(self.work, f"replica-{name}-{self.dbs}.err")
        with open(out, "w") as o, open(err, "w") as e:
            p = subprocess.Popen([self.twd, "--listen", "127.0.0.1:0", "--metrics_listen=",
                                  "--db", self.cluster.multi_host(db), "--replica", name,
                                  "--lease_ms", str(LEASE_MS)],
                                 stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.children.append(p)
        return p, out, err

    @staticmethod
    def await_line(p, path, pattern, timeout, what):
        """The first match of PATTERN in a replica's log; an error as soon
        as the replica exits without it."""
        def seen():
            with open(path) as f:
                m = re.search(pattern, f.read())
            if not m and p.poll() is not None:
                raise RuntimeError(f"{what}: the replica exited {p.returncode}")
            return m
        return wait_for(seen, timeout, what, 0.01)

    def failover_once(self):
        """Seconds from kill -9 of the owner to the standby printing that it
        serves agents, and to its first durable ack."""
        db = self.fresh_db()
        serving = r"serving agents on 127\.0\.0\.1:(\d+)"
        a, a_out, _ = self.replica("a", db)
        port_a = self.await_line(a, a_out, serving, 60, "replica a serving").group(1)
        b, b_out, b_err = self.replica("b", db)
        # Standing by: it has read the lease table and found every shard owned.
        self.await_line(b, b_err, r"standby: ", 60, "replica b standing by")
        # The owner under a paced load when it dies, as in production.
        load = subprocess.Popen([self.load, "--target", f"127.0.0.1:{port_a}", "--runs", "8",
                                 "--steps", "1000000", "--rate", "2000", "--duration-limit",
                                 "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self.children.append(load)
        time.sleep(0.5 if self.smoke else 2)
        if load.poll() is not None:
            raise RuntimeError(f"the load on the owner exited {load.returncode} before the kill")
        a.kill()
        t0 = time.monotonic()
        a.wait(timeout=10)
        port_b = self.await_line(b, b_out, serving, 30, "replica b serving").group(1)
        t_listen = time.monotonic() - t0
        # Its first durable ack: a one-record load, retried should the
        # first dial land before the server takes streams.
        def first_ack():
            p = subprocess.run([self.load, "--target", f"127.0.0.1:{port_b}", "--runs", "1",
                                "--steps", "1", "--duration-limit", "10"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
            return p.returncode == 0
        wait_for(first_ack, 30, "the standby's first ack", 0.01)
        t_ack = time.monotonic() - t0
        stop_group(load)
        b.terminate()
        b.wait(timeout=30)
        return t_listen, t_ack

    def run(self):
        say(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
        t = time.monotonic()
        self.cluster.start()
        say(f"PostgreSQL primary + synchronous standby in {self.cluster.dir} "
            f"({time.monotonic() - t:.1f} s)")
        figures = []
        rounds, steps, lat_steps, lat_rounds, failovers = (
            (1, 1000, 100, 1, 1) if self.smoke else (5, 20000, 800, 5, 3))
        tput = self.alternate("throughput", ["--runs", "8", "--ranks-per-run", "1", "--steps",
                                             str(steps)], 45, rounds)
        lat = self.alternate("latency", ["--runs", "8", "--ranks-per-run", "8", "--per-rank",
                                         "--steps", str(lat_steps), "--rate", "10000"], 25,
                             lat_rounds)
        fo, fo_failed = [], False
        for i in range(failovers):
            if self.over_budget(f"failover {i + 1}"):
                break
            try:
                fo.append(self.failover_once())
            except (RuntimeError, TimeoutError, subprocess.SubprocessError) as e:
                say(f"  failover {i + 1}: failed: {e}")
                fo_failed = True
                continue
            say(f"  failover {i + 1}: standby serving agents after {fo[-1][0]:.2f} s, "
                f"first durable ack after {fo[-1][1]:.2f} s")

        def pairs(res, get):
            return [(get(p), get(s)) for p, s in zip(res["pg"], res["sqlite"]) if p and s]

        rate = lambda r: r["records_per_second"]
        p99 = lambda r: r["latency_ms"]["p99"]
        med = statistics.median
        size = f"8 runs x {steps:,} steps"
        tp = pairs(tput, rate)
        if tp:
            ratios = [p / s for p, s in tp]
            figures.append({
                "figure": f"PostgreSQL ingest (synchronous standby) vs SQLite --db_synchronous "
                          f"full, records/s, {size} unpaced",
                "unit": "records/s", "value": med([p for p, _ in tp]),
                "baseline": med([s for _, s in tp]), "ratio": med(ratios),
                "median": med(ratios), "min": min(ratios), "max": max(ratios)})
        lp = pairs(lat, p99)
        pg_p99 = [p99(r) for r in lat["pg"] if r]
        if pg_p99:
            figures.append({
                "figure": "PostgreSQL: p99 durable-ack latency at 10,000 records/s, 8 runs x 8 "
                          "ranks, synchronous standby (ms; baseline: SQLite full)",
                "unit": "ms", "value": med(pg_p99),
                "baseline": med([s for _, s in lp]) if lp else None,
                "ratio": med([p / s for p, s in lp]) if lp else None,
                "median": med(pg_p99), "min": min(pg_p99), "max": max(pg_p99)})
        if fo:
            for k, what in ((1, "first durable ack"), (0, "serving line")):
                xs = [f[k] for f in fo]
                figures.append({
                    "figure": f"PostgreSQL failover: kill -9 of the owner replica to the "
                              f"standby replica's {what} (s), --lease_ms {LEASE_MS}, "
                              f"{len(xs)} times",
                    "unit": "s", "value": med(xs), "baseline": None, "ratio": None,
                    "median": med(xs), "min": min(xs), "max": max(xs)})
        say(f"machine at end: load average {os.getloadavg()}")
        failed = fo_failed or any(r is None for res in (tput, lat) for rs in res.values()
                                  for r in rs)
        return figures, failed

    def close(self):
        for p in self.children:
            stop_group(p)
        self.cluster.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    ap.add_argument("--budget", type=float, default=230,
                    help="seconds after which no new phase starts")
    ap.add_argument("--keep-logs", action="store_true",
                    help="print the servers' and loads' logs to stderr at the end")
    args = ap.parse_args()
    for b in ("trainwatchd", "tw-ingest-load"):
        if not os.access(os.path.join(args.build, "bin", b), os.X_OK):
            sys.exit(f"{args.build}/bin/{b} not built")
    if not os.path.exists(os.path.join(PG_BIN, "initdb")):
        sys.exit(f"no {PG_BIN}/initdb: install postgresql-15")
    # SIGTERM / SIGINT unwind through the finally below, which stops the
    # database servers: left running, they would outlive the bench.
    def interrupted(signum, _frame):
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    bench = Bench(os.path.abspath(args.build), args.smoke, args.budget)
    figures, failed = [], True
    try:
        figures, failed = bench.run()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if failed or args.keep_logs:
            for name in sorted(os.listdir(bench.work)) if os.path.isdir(bench.work) else []:
                path = os.path.join(bench.work, name)
                if os.path.isfile(path):
                    with open(path, errors="replace") as f:
                        say(f"--- {name} (last lines)\n" + "".join(f.readlines()[-20:]))
        bench.close()
    lines = "".join(json.dumps(f) + "\n" for f in figures)
    if os.environ.get("TW_BENCH_JSON"):
        with open(os.environ["TW_BENCH_JSON"], "a") as f:
            f.write(lines)
    else:
        sys.stdout.write(lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
