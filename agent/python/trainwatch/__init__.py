"""trainwatch: training-health monitoring for large-model pre-training.

Attach an agent to a trainer in a few lines::

    import trainwatch
    agent = trainwatch.Agent(server="127.0.0.1:7070", run_id="my-run")
    ...
    loss.backward()
    verdict = agent.step(step, loss=loss.item(), grads=[p.grad for p in model.parameters()],
                         logits=logits.detach(), shards=batch_shard_ids,
                         lr=optimizer.param_groups[0]["lr"])
    if verdict.decision == trainwatch.Decision.HALT:
        raise trainwatch.TrainingHalted(verdict)
    if verdict.decision != trainwatch.Decision.SKIP:
        optimizer.step()

The verdict's numbers (loss, grad_norm, nan_frac, log_z, loss_ema_ratio)
are the record the engine judged, reduced across ranks: the same on every
rank, NaN for a signal the step did not have. verdict.tensors and
verdict.rank are this rank's own: the named gradients (a dict of grads, or
watch(..., params=model.named_parameters())) holding nonfinite elements.

A halt ends the trainer the usual way under trainwatch.exit_on_halt(): one
line on stderr naming the step, the rule, the reason and the tensors, and
exit status 3 (trainwatch.EXIT_HALTED) instead of a traceback::

    with trainwatch.exit_on_halt():
        train()

or let trainwatch.torch.watch() wrap the optimizer. The verdict is decided
locally (tier 1 skip, tier 3 halt) by the same rule engine the server runs,
on statistics reduced across ranks, so every rank reaches the same verdict.
Configuration not given here comes from TRAINWATCH_SERVER, TRAINWATCH_RUN_ID,
TRAINWATCH_TOKEN and TRAINWATCH_SPILL_DIR. Without a run id the launcher's
name for the job is taken (torchrun --rdzv-id, SLURM's job id), and with no
name at all the agent does not stream: agent.streaming says which.

Shards: ``shards=`` is a list of the batch's shards, each an int (a shard id)
or a str (a shard name, as loaders that name their data use: a webdataset
url, "train-00012-of-01024.parquet:7"); a list may mix them. A name is 1 to
256 bytes, at most 1,024 names a step; past that, or for anything else in
the list, step() raises ValueError. The data loader asks what to skip:
``agent.is_quarantined(shard)`` (an id or a name; names match exactly),
``agent.quarantined_shards()`` (id ranges, [(first, last), ...]) and
``agent.quarantined_shard_names()``; a rollback Command carries
"quarantine" (ranges) and "quarantine_names". With world_size > 1 the run's
record names rank 0's batch only (ids are gathered from every rank on a
skipped step, names are not).
"""

import contextlib as _contextlib
import enum as _enum
import json as _json
import sys as _sys

from ._trainwatch import Verdict  # noqa: F401
from ._trainwatch import __version__  # noqa: F401  (the C++ build's, one source)
from ._trainwatch import Agent as _NativeAgent
from .command import Command

__all__ = ["Agent", "Command", "Decision", "Verdict", "TrainingHalted", "EXIT_HALTED",
           "exit_on_halt", "__version__"]

# The exit status of a trainer that trainwatch halted, under exit_on_halt():
# distinct from 1 (a crash) and 2 (bad usage), so a launcher or a retry
# policy can tell "the monitor stopped a diverging run" from a bug.
EXIT_HALTED = 3


class Decision(str, _enum.Enum):
    """A verdict's decision. A str enum, so comparisons with the names of
    older releases ("continue", "skip_update", "halt") still hold."""

    CONTINUE = "continue"
    SKIP = "skip_update"
    HALT = "halt"

    def __str__(self):
        return self.value


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

    def __init__(self, verdict):
        self.verdict = verdict
        self.step = verdict.step
        self.tier = verdict.tier
        self.rule = verdict.rule
        self.reason = verdict.reason or "trainwatch halted the run"
        self.tensors = list(verdict.tensors)
        self.ranks = [verdict.rank] if self.tensors else []
        super().__init__(self._one_line())

    def _one_line(self):
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
def exit_on_halt():
    """Turns a TrainingHalted raised inside (from optimizer.step(),
    scaler.step(), anywhere) into one line on stderr ("trainwatch: halted at
    step ...") and SystemExit(EXIT_HALTED), instead of a traceback. Also a
    decorator. Put it outside ``with agent:`` so the agent flushes its
    records on the way out. Other exceptions pass unchanged."""
    try:
        yield
    except TrainingHalted as e:
        print(f"trainwatch: {e}", file=_sys.stderr, flush=True)
        raise SystemExit(EXIT_HALTED) from None


class Agent(_NativeAgent):
    """The in-process agent.

    server: trainwatchd's address ("" for local decisions only).
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
    """

    def __init__(self, server="", run_id="", rank=0, world_size=1, token=None, spill_dir=None,
                 rules=None, reduce=None, ca_file=None, cert_file=None, key_file=None,
                 resume_step=None):
        super().__init__(server=server, run_id=run_id, rank=rank, world_size=world_size,
                         token=token, spill_dir=spill_dir,
                         rules_json=None if rules is None else _json.dumps(rules),
                         reduce=reduce, ca_file=ca_file, cert_file=cert_file,
                         key_file=key_file, resume_step=resume_step)

    def poll_command(self):
        """The next command from the server (a Command), or None."""
        c = super().poll_command()
        return None if c is None else Command(c)

    def on_command(self, callback):
        """Calls callback(Command) on the agent's thread for each command."""
        super().on_command(lambda c: callback(Command(c)))

    def wait_for_server(self, timeout_s=10.0):
        """At startup, before step 0: waits up to timeout_s for the server's
        answer to this rank's hello and the command it says follows (a
        restarted job's pending rollback, then ready for poll_command()), so
        that the job loads its checkpoint before its first step. True once
        both arrived; False on timeout or without a server. The answer also
        names the tier 3 incidents still awaiting a decision, with a warning
        on stderr for each."""
        return super().wait_for_server(timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
