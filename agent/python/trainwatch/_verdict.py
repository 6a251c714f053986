"""What Agent.step() returns: the Verdict, its Decision, the rule engine's
Events and the gradients found holding nonfinite values. The binding hands
them over as a native object with dicts and tuples inside; these are their
typed form."""

from __future__ import annotations

import enum as _enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ._legacy import KeyAccess

if TYPE_CHECKING:
    from . import _trainwatch

__all__ = ["Decision", "Event", "NonfiniteTensor", "Verdict"]


class Decision(str, _enum.Enum):
    """A verdict's decision. A str enum, so comparisons with the names of
    older releases ("continue", "skip_update", "halt") still hold."""

    CONTINUE = "continue"
    SKIP = "skip_update"
    HALT = "halt"

    def __str__(self) -> str:
        return self.value


class NonfiniteTensor(NamedTuple):
    """A named gradient holding NaN or inf elements on this rank (a tuple,
    as earlier releases gave: ``for name, bad, total in verdict.tensors``)."""

    name: str
    nonfinite: int
    elements: int


@dataclass(frozen=True)
class Event(KeyAccess):
    """One event of the rule engine at this step (trainwatchd stores the same).

    kind: what was seen, e.g. "data_anomaly", "spike", "nonfinite_gradients"
        (core/src/names.cc lists them; new kinds may come with new rules).
    action: what it asks for: "none", "record", "warn", "skip_update", "page"
        or "halt".
    onset_step: where the anomaly began; recommended_checkpoint_step: the
        checkpoint a rollback should go back to (-1: none).
    shards, shard_names: the step's batch, when the event blames it.

    event["kind"] reads as the dict of earlier releases did (deprecated).
    """

    step: int
    tier: int
    action: str
    kind: str
    onset_step: int
    reason: str
    shards: list[int] = field(default_factory=list)
    shard_names: list[str] = field(default_factory=list)
    recommended_checkpoint_step: int = -1


class Verdict:
    """The verdict on one step: a typed, read-only view of the binding's
    (a copy would cost every step more than the step's own call).

    decision: continue, skip the update (tier 1) or halt (tier 3); skip and
        halt say the same as booleans.
    step, tier, rule, reason: the step judged, the tier and rule that
        decided ("" when it continues) and why.
    loss, loss_ema_ratio, grad_norm, nan_frac, log_z: the record the engine
        judged, reduced across ranks: the same on every rank, NaN for a
        signal the step did not have.
    rank, tensors: this rank, and the named gradients it saw holding
        nonfinite elements (only its own).
    events: the rule engine's events at this step.
    """

    __slots__ = ("_native",)

    def __init__(self, native: _trainwatch.Verdict) -> None:
        self._native = native

    @property
    def decision(self) -> Decision:
        # From the two booleans: the binding's own decision imports the
        # package at each read.
        v = self._native
        return Decision.HALT if v.halt else Decision.SKIP if v.skip else Decision.CONTINUE

    @property
    def skip(self) -> bool:
        return self._native.skip

    @property
    def halt(self) -> bool:
        return self._native.halt

    @property
    def step(self) -> int:
        return self._native.step

    @property
    def tier(self) -> int:
        return self._native.tier

    @property
    def rule(self) -> str:
        return self._native.rule

    @property
    def reason(self) -> str:
        return self._native.reason

    @property
    def loss(self) -> float:
        return self._native.loss

    @property
    def loss_ema_ratio(self) -> float:
        return self._native.loss_ema_ratio

    @property
    def grad_norm(self) -> float:
        return self._native.grad_norm

    @property
    def nan_frac(self) -> float:
        return self._native.nan_frac

    @property
    def log_z(self) -> float:
        return self._native.log_z

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def tensors(self) -> list[NonfiniteTensor]:
        return [NonfiniteTensor(*t) for t in self._native.tensors]

    @property
    def events(self) -> list[Event]:
        return [Event(step=e["step"], tier=e["tier"], action=e["action"], kind=e["kind"],
                      onset_step=e["onset_step"], reason=e["reason"], shards=list(e["shards"]),
                      shard_names=list(e["shard_names"]),
                      recommended_checkpoint_step=e["recommended_checkpoint_step"])
                for e in self._native.events]

    def __repr__(self) -> str:
        return repr(self._native)
