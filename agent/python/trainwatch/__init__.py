"""trainwatch: training-health monitoring for large-model pre-training.

Attach an agent to a trainer in a few lines::

    import trainwatch
    agent = trainwatch.Agent(server="127.0.0.1:7070", run_id="my-run")
    ...
    loss.backward()
    verdict = agent.step(step, loss=loss.item(), grads=[p.grad for p in model.parameters()],
                         logits=logits.detach(), shards=batch_shard_ids,
                         lr=optimizer.param_groups[0]["lr"])
    if verdict.halt:
        raise SystemExit(verdict.reason)
    if not verdict.skip:
        optimizer.step()

or let trainwatch.torch.watch() wrap the optimizer. The verdict is decided
locally (tier 1 skip, tier 3 halt) by the same rule engine the server runs,
on statistics reduced across ranks, so every rank reaches the same verdict.
Configuration not given here comes from TRAINWATCH_SERVER, TRAINWATCH_RUN_ID,
TRAINWATCH_TOKEN and TRAINWATCH_SPILL_DIR.
"""

import json as _json

from ._trainwatch import Verdict  # noqa: F401
from ._trainwatch import __version__  # noqa: F401  (the C++ build's, one source)
from ._trainwatch import Agent as _NativeAgent

__all__ = ["Agent", "Verdict", "TrainingHalted", "__version__"]


class TrainingHalted(RuntimeError):
    """Raised by trainwatch.torch when the agent halts the run (tier 3)."""

    def __init__(self, verdict):
        super().__init__(verdict.reason or "trainwatch halted the run")
        self.verdict = verdict


class Agent(_NativeAgent):
    """The in-process agent.

    server: trainwatchd's address ("" for local decisions only).
    run_id: the run's name; rank/world_size: this process in the job.
    reduce: for world_size > 1, a callable (sums, maxes) -> (sums, maxes)
        running the job's all-reduce (see trainwatch.torch.distributed_reduce).
    rules: thresholds overriding the defaults, e.g. {"warmup_steps": 100}.
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
