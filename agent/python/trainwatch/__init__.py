"""trainwatch: training-health monitoring for large-model pre-training.

Attach it to a PyTorch loop by wrapping the optimizer: after backward(),
observe() judges the step, and the next optimizer.step() runs, is skipped
(tier 1: a data anomaly's update never reaches the weights) or raises
TrainingHalted (tier 3)::

    import trainwatch
    import trainwatch.torch

    agent = trainwatch.Agent(server="127.0.0.1:7070", run_id="my-run")
    guard = trainwatch.torch.watch(optimizer, agent, params=model.named_parameters())
    with trainwatch.exit_on_halt(), agent:
        for step, (x, y, shards) in enumerate(loader):
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            verdict = guard.observe(step, loss, logits=logits, shards=shards)
            optimizer.step()      # skipped or halted as the verdict says

Trainers that own their loop take one line each:
trainwatch.integrations.transformers.watch(trainer) for the Hugging Face
Trainer, trainwatch.integrations.lightning.TrainwatchCallback() for
Lightning, trainwatch.integrations.torchtitan.watch(trainer) for torchtitan
(see trainwatch.integrations).

The verdict (a trainwatch.Verdict) says verdict.decision, a
trainwatch.Decision. Its numbers (loss, grad_norm, nan_frac, log_z,
loss_ema_ratio) are the record the engine judged, reduced across ranks: the
same on every rank, NaN for a signal the step did not have.
verdict.tensors and verdict.rank are this rank's own: the named gradients
(watch(..., params=model.named_parameters())) holding nonfinite elements.

A halt ends the trainer the usual way under trainwatch.exit_on_halt(): one
line on stderr naming the step, the rule, the reason and the tensors, and
exit status 3 (trainwatch.EXIT_HALTED) instead of a traceback.

The verdict is decided locally (tier 1 skip, tier 3 halt) by the same rule
engine the server runs, on statistics reduced across ranks, so every rank
reaches the same verdict. Configuration not given to Agent comes from
TRAINWATCH_SERVER, TRAINWATCH_RUN_ID, TRAINWATCH_TOKEN and
TRAINWATCH_SPILL_DIR. Without a run id the launcher's name for the job is
taken (torchrun --rdzv-id, SLURM's job id), and with no name at all the
agent does not stream: agent.streaming says which.

Shards: ``shards=`` is a list of the batch's shards, each an int (a shard id)
or a str (a shard name, as loaders that name their data use: a webdataset
url, "train-00012-of-01024.parquet:7"); a list may mix them. A name is 1 to
256 bytes, at most 1,024 names a step; past that, or for anything else in
the list, the step raises ValueError. The data loader asks what to skip:
``agent.is_quarantined(shard)`` (an id or a name; names match exactly),
``agent.quarantined_shards()`` (id ranges, [(first, last), ...]) and
``agent.quarantined_shard_names()``; a rollback Command carries
``quarantine`` (ranges) and ``quarantine_names``. With world_size > 1 the
run's record names rank 0's batch only (ids are gathered from every rank on
a skipped step, names are not).

Without torch (another framework, statistics of one's own), Agent.step()
takes the step's numbers directly; trainwatch.torch.Guard is what calls it
for a PyTorch loop.
"""

from __future__ import annotations

import contextlib as _contextlib
import atexit as _atexit
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import weakref as _weakref
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional,
                    Sequence, Tuple, Union)

from . import _liveness
from ._legacy import KeyAccess as _KeyAccess
from ._verdict import Decision, Event, NonfiniteTensor, Verdict
from .command import AckStatus, Command, CommandKind
from ._trainwatch import __version__  # (the C++ build's, one source)
from ._trainwatch import Agent as _NativeAgent

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Agent", "AgentStats", "AckStatus", "Command", "CommandKind", "Decision", "Event",
           "NonfiniteTensor", "Verdict", "TrainingHalted", "EXIT_HALTED", "exit_on_halt",
           "Shard", "Reduce", "__version__"]

# The exit status of a trainer that trainwatch halted, under exit_on_halt():
# distinct from 1 (a crash) and 2 (bad usage), so a launcher or a retry
# policy can tell "the monitor stopped a diverging run" from a bug.
EXIT_HALTED = 3

# A shard of the batch: an int id or a str name.
Shard = Union[int, str]
# The job's all-reduce, for world_size > 1: (sums, maxes) -> (sums, maxes),
# summed and maxed over every rank (trainwatch.torch.distributed_reduce()).
Reduce = Callable[[list[float], list[float]], Tuple[Sequence[float], Sequence[float]]]


class TrainingHalted(RuntimeError):
    """Raised by trainwatch.torch when the agent halts the run (tier 3).

    step, tier, rule, reason: the halt's, as the engine decided it.
    tensors: [(name, nonfinite elements, elements)], the gradients this rank
        saw holding nonfinite values (named gradients only), [] otherwise.
    ranks: the ranks those tensors were seen on: [this rank] or [] (a rank
        knows only its own gradients; the server's incident has every rank's).
    verdict: the Verdict itself.
    str(e) is one line saying all of it.
    """

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.step: int = verdict.step
        self.tier: int = verdict.tier
        self.rule: str = verdict.rule
        self.reason: str = verdict.reason or "trainwatch halted the run"
        self.tensors: list[NonfiniteTensor] = list(verdict.tensors)
        self.ranks: list[int] = [verdict.rank] if self.tensors else []
        super().__init__(self._one_line())

    def _one_line(self) -> str:
        rule = f", {self.rule}" if self.rule else ""
        line = f"halted at step {self.step} (tier {self.tier}{rule}): {self.reason}"
        if self.tensors:
            shown = ", ".join(f"{n} ({bad} of {total} nonfinite)"
                              for n, bad, total in self.tensors[:5])
            more = f" and {len(self.tensors) - 5} more" if len(self.tensors) > 5 else ""
            line += f"; on rank {self.ranks[0]}: {shown}{more}"
        # One line whatever the reason holds, for log scrapers and launchers.
        return " ".join(line.split())


@_contextlib.contextmanager
def exit_on_halt() -> Iterator[None]:
    """Turns a TrainingHalted raised inside (from optimizer.step(),
    scaler.step(), anywhere) into one line on stderr ("trainwatch: halted at
    step ...") and SystemExit(EXIT_HALTED), instead of a traceback. Also a
    decorator. Put it outside ``with agent:`` so the agent flushes its
    records on the way out. Other exceptions pass unchanged."""
    try:
        yield
    except TrainingHalted as e:
        # One write of the whole line: print() writes the text and the newline
        # apart, and ranks sharing a stderr ran their lines together.
        _sys.stderr.write(f"trainwatch: {e}\n")
        _sys.stderr.flush()
        raise SystemExit(EXIT_HALTED) from None


@dataclass(frozen=True)
class AgentStats(_KeyAccess):
    """The agent's transport, as Agent.stats() reads it.

    steps: steps judged; records_queued, records_acked, records_spilled,
    records_dropped: records handed to the sender, acknowledged durable by
    trainwatchd, written to the spill folder, and dropped (the oldest, when
    the spill folder was full too); unacked: sent and not yet acknowledged;
    durable_step: the last step trainwatchd acknowledged (-1: none);
    reconnects: streams opened after the first; connected: a stream is up
    now; streaming: records go to a server at all (a server and a run id);
    replaced: another agent took over this run and rank; run_last_step: the
    run's last step stored at the server when this launch said hello (-1:
    none, or no answer yet).

    stats["steps"] reads as the dict of earlier releases did (deprecated).
    """

    steps: int
    records_queued: int
    records_acked: int
    records_spilled: int
    records_dropped: int
    reconnects: int
    durable_step: int
    connected: bool
    streaming: bool
    unacked: int
    replaced: bool
    run_last_step: int = -1


def _server_list(server: Union[str, Sequence[str]]) -> str:
    """The comma-separated form the native agent reads (and checks: an
    empty or malformed entry is its ValueError); a list's entries may not
    hold a comma themselves, which would split one address in two."""
    if isinstance(server, str):
        return server
    entries = list(server)
    if not entries:
        raise ValueError("server: the list of addresses is empty")
    for i, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise TypeError(f"server[{i}]: an address is a str, not {type(entry).__name__}")
        if "," in entry or not entry.strip():
            raise ValueError(f"server[{i}] ({entry!r}): each entry is one non-empty address")
    return ",".join(entries)


def _close_at_exit(ref: "_weakref.ReferenceType[Agent]") -> None:
    agent = ref()
    if agent is not None:
        agent.close(1000)


class Agent:
    """The in-process agent.

    server: trainwatchd's address ("" for local decisions only), or its
        replicas' addresses: a list of strings, or one string separated by
        commas ("10.0.0.1:7070,10.0.0.2:7070"). The records stream to the
        first; when that stream ends (the server died or refused the run)
        the agent tries the next and re-sends every record after the last
        one acknowledged, so nothing acknowledged is lost; the step never
        waits for it. An empty or malformed entry raises ValueError.
    run_id: the run's name, 1 to 128 characters of [A-Za-z0-9._:-] (else
        ValueError); "" takes TRAINWATCH_RUN_ID, then torchrun's
        TORCHELASTIC_RUN_ID (unless "none"), then SLURM_ARRAY_JOB_ID +
        SLURM_ARRAY_TASK_ID or SLURM_JOB_ID, saying on stderr which. With a
        server and none of these the agent does not stream (one message on
        stderr says what to set) and still decides skip and halt locally.
        agent.run_id is the id used, agent.streaming whether records go to
        the server.
    rank/world_size: this process in the job.
    reduce: for world_size > 1, a callable (sums, maxes) -> (sums, maxes)
        running the job's all-reduce (see trainwatch.torch.distributed_reduce).
    rules: thresholds overriding the defaults, e.g. {"warmup_steps": 100}.
        Precedence, highest first: rules given here, then TRAINWATCH_RULES
        (inline JSON starting with "{", or the path of a JSON file), then
        the server's rules for the run (trainwatchd --run_rules), then the
        server's --rules, then the defaults; the first one given is used
        whole, fields it leaves out at their defaults. Rules of the job's
        own (here or TRAINWATCH_RULES) are announced to trainwatchd, which
        judges the run by them too. Without any, the agent runs the defaults
        until the server's answer names the run's rules, then every rank
        switches to them at the same step; the step never waits for it. A
        bad TRAINWATCH_RULES (missing file, bad JSON, a value out of bounds)
        raises ValueError naming the variable, also when rules are given
        here.
    ca_file: TLS to the server, trusting this CA (PEM); cert_file and key_file,
        together: mutual TLS, for a trainwatchd started with --tls_client_ca.
        Each unset falls back to TRAINWATCH_CA_FILE / _CERT_FILE / _KEY_FILE;
        a missing file or a cert without its key raises ValueError naming it.
    resume_step: the step this launch resumed after (the checkpoint it
        loaded); unset, the server takes a checkpoint reported before the
        first step, or else the first step minus 1. A restart that resumes
        before the run's last stored step opens a new attempt on the server,
        keeping both jobs' records.
    observed: judge every step but act on none: the server records the
        run as observed, not enforced, and its tier 1 and tier 3 verdicts
        as recommended, not applied (`trainwatch run --observe-only`).
        The caller must then neither skip nor halt.
    attachment: what `trainwatch run` found when it attached the job, one
        line stored with the run for `twctl status`.

    Used as a context manager, it closes (flushing its records) on the way out.
    """

    def __init__(self, server: Union[str, Sequence[str]] = "", run_id: str = "", rank: int = 0,
                 world_size: int = 1, token: Optional[str] = None,
                 spill_dir: Optional[str] = None, rules: Optional[Mapping[str, Any]] = None,
                 reduce: Optional[Reduce] = None, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None,
                 resume_step: Optional[int] = None, observed: bool = False,
                 attachment: str = "") -> None:
        self._native = _NativeAgent(
            server=_server_list(server), run_id=run_id, rank=rank, world_size=world_size, token=token,
            spill_dir=spill_dir, rules_json=None if rules is None else _json.dumps(rules),
            reduce=reduce, ca_file=ca_file, cert_file=cert_file, key_file=key_file,
            resume_step=resume_step, observed=observed, attachment=attachment)
        # The stack of the thread that builds the agent (the training
        # thread's) goes with the heartbeats when its step is late.
        self._watchdog: Optional[_liveness.Watchdog] = None
        if self._native.streaming:
            self._watchdog = _liveness.Watchdog(
                self._native, _threading.get_ident(),
                int(_os.environ.get("TRAINWATCH_HEARTBEAT_MS", "5000")))
            # A process that ends without close() still flushes its records
            # and says it is closing (else the server sees its ranks fall
            # silent: lost, or a stall, until they time out).
            _atexit.register(_close_at_exit, _weakref.ref(self))

    def step(self, step: int, loss: Optional[float] = None,
             grads: Union[Sequence[Any], Mapping[str, Any], None] = None,
             logits: Any = None, labels: Optional[Sequence[int]] = None,
             log_z: Optional[float] = None, shards: Optional[Iterable[Shard]] = None,
             lr: Optional[float] = None, z_loss_alpha: Optional[float] = None,
             grad_stats: Union[Tuple[float, int, int], Sequence[Tuple[float, int, int, int]],
                               None] = None,
             grad_tensors: Optional[Sequence[Tuple[str, float, int, int]]] = None,
             grad_copies: Union[int, Sequence[int], None] = None,
             log_z_sum: Optional[Tuple[float, int]] = None, ignore_index: int = -100,
             loss_scale: Optional[float] = None,
             loss_scale_overflow: bool = False) -> Verdict:
        """Judges one optimizer step from its numbers: the low-level call that
        trainwatch.torch.Guard.observe() and the trainer integrations make.
        A PyTorch loop uses those; this is for a loop that computes its
        statistics itself. Every rank calls it once per step, in step order.

        loss, lr, z_loss_alpha: the step's numbers (None: not known).
        The gradients, one of:
          grads: host tensors read in place (fp32, bf16, fp16), a list, or a
            dict {name: tensor} that also names a tensor holding a NaN;
            grad_copies: how many ranks hold each (an int for all, a list
            per tensor; None: each rank its own shard);
          grad_stats: (sum of squares over finite elements, nonfinite count,
            elements), or a list of (..., copies) groups; grad_tensors:
            (name, sum of squares, nonfinite, elements) per tensor, read
            when a nonfinite count is > 0.
        log Z, one of: logits ([..., vocab] host tensor; labels and
          ignore_index leave rows out), log_z (the mean), log_z_sum
          ((sum, rows), kept over micro-batches).
        shards: the batch's shard ids or names.
        loss_scale, loss_scale_overflow: fp16 dynamic loss scaling's scale
          and whether this step overflowed.
        Raises ValueError for arguments that contradict each other or a bad
        shard; a step the ranks could not agree on is a halt verdict."""
        return Verdict(self._native.step(
            step, loss, grads, logits, labels, log_z, shards, lr, z_loss_alpha, grad_stats,
            grad_tensors, grad_copies, log_z_sum, ignore_index, loss_scale,
            loss_scale_overflow))

    def set_phase(self, name: str) -> None:
        """Tells the heartbeats where the training thread is, until the next
        set_phase() or the end of the step (phase() below, as a block). The
        first "backward" or "collective" of a step marks this rank's first
        wait on the others, from which a straggler is found."""
        if name not in _liveness.PHASES:
            raise ValueError(f"phase {name!r} is not one of {', '.join(_liveness.PHASES)}")
        self._native.set_phase(_liveness.PHASES[name])

    @_contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """`with agent.phase("checkpoint"): save()`: tells trainwatchd that
        the training thread is in a phase long by design ("checkpoint",
        "eval"), or where it is ("forward", "backward", "collective",
        "optimizer", "data"), so that a long checkpoint or evaluation is not
        paged as a stall (docs/hangs.md). The phase ends with the block."""
        self.set_phase(name)
        try:
            yield
        finally:
            self._native.set_phase(0)

    def report_checkpoint(self, step: int, uri: str) -> None:
        """Tells trainwatchd that the checkpoint of `step` is at `uri` (a
        rollback's target)."""
        self._native.report_checkpoint(step, uri)

    def poll_command(self) -> Optional[Command]:
        """The next command from the server (a Command), or None."""
        c = self._native.poll_command()
        return None if c is None else Command.from_dict(c)

    def on_command(self, callback: Callable[[Command], object]) -> None:
        """Calls callback(Command) on the agent's thread for each command."""
        self._native.on_command(lambda c: callback(Command.from_dict(c)))

    def acknowledge(self, command_id: str, status: Union[AckStatus, str], message: str = "",
                    resumed_step: int = -1) -> None:
        """Tells trainwatchd what became of a command: AckStatus.RECEIVED,
        APPLIED (resumed_step: the step training goes on after) or FAILED
        (message: why), or their names."""
        self._native.acknowledge(command_id, str(getattr(status, "value", status)), message,
                                 resumed_step)

    def quarantined_shards(self) -> list[tuple[int, int]]:
        """The quarantined shard ids, as inclusive ranges [(first, last)]."""
        return self._native.quarantined_shards()

    def quarantined_shard_names(self) -> list[str]:
        """The quarantined shard names."""
        return self._native.quarantined_shard_names()

    def is_quarantined(self, shard: Shard) -> bool:
        """Whether the loader must skip this shard (an id or a name)."""
        return self._native.is_quarantined(shard)

    def resume_from(self, step: int) -> None:
        """After loading the checkpoint of `step` (a rollback, or a restart):
        the rule engine goes back to that step."""
        self._native.resume_from(step)

    def wait_for_server(self, timeout_s: float = 10.0) -> bool:
        """At startup, before step 0: waits up to timeout_s for the server's
        answer to this rank's hello and the command it says follows (a
        restarted job's pending rollback, then ready for poll_command()), so
        that the job loads its checkpoint before its first step. True once
        both arrived; False on timeout or without a server. The answer also
        names the tier 3 incidents still awaiting a decision, with a warning
        on stderr for each."""
        return self._native.wait_for_server(timeout_s)

    def stats(self) -> AgentStats:
        """The agent's transport counters now (an AgentStats)."""
        s = self._native.stats()
        return AgentStats(
            steps=s["steps"], records_queued=s["records_queued"],
            records_acked=s["records_acked"], records_spilled=s["records_spilled"],
            records_dropped=s["records_dropped"], reconnects=s["reconnects"],
            durable_step=s["durable_step"], connected=s["connected"],
            streaming=s["streaming"], unacked=s["unacked"], replaced=s["replaced"],
            run_last_step=s["run_last_step"])

    @property
    def streaming(self) -> bool:
        """Whether records go to a server (a server address and a run id)."""
        return self._native.streaming

    @property
    def run_id(self) -> str:
        """The run id in use ("" without one)."""
        return self._native.run_id

    @property
    def world_size(self) -> int:
        return self._native.world_size

    def close(self, timeout_ms: int = 5000) -> None:
        """Flushes the records to the server (waiting up to timeout_ms) and
        stops the agent's thread."""
        if self._watchdog is not None:
            self._watchdog.stop()
        self._native.close(timeout_ms)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()
