"""Commands from trainwatchd, as the agent hands them to the trainer, and the
statuses the trainer acknowledges them with.

A Command is a dataclass; cmd["checkpoint_uri"] still reads as it did when
commands were plain dicts (deprecated: read cmd.checkpoint_uri).
"""

from __future__ import annotations

import enum as _enum
import warnings as _warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Tuple

from ._legacy import KeyAccess

__all__ = ["Command", "CommandKind", "AckStatus"]


class CommandKind(str, _enum.Enum):
    """What a command asks for. A str enum: cmd.kind == "rollback" holds."""

    ROLLBACK = "rollback"
    HALT = "halt"
    RESUME = "resume"

    def __str__(self) -> str:
        return self.value


class AckStatus(str, _enum.Enum):
    """Agent.acknowledge()'s status: the command was received (and is being
    applied), applied, or failed. Agent.acknowledge() takes the strings too."""

    RECEIVED = "received"
    APPLIED = "applied"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass
class Command(KeyAccess):
    """One command from the server.

    kind: rollback, halt or resume.
    command_id, incident_id: what to acknowledge, and why it was sent.
    target_step, checkpoint_uri: the checkpoint to load (rollback).
    quarantine: [(first, last)] inclusive shard ranges the loader must skip.
    quarantine_names: shard names the loader must skip (exact matches).
    skip_steps: (first, last) steps whose batches no rank serves again, or None.
    z_loss_alpha: the new z-loss alpha, or None (unchanged).
    precision: [(module name, "fp32" | "bf16" | "fp16")], in order
        (trainwatch.rollback.Precision names them).
    lr_scale: factor on every learning rate, or None (unchanged).
    reason: the halt's or resume's reason.
    """

    kind: CommandKind
    command_id: str = ""
    incident_id: str = ""
    target_step: int = -1
    checkpoint_uri: str = ""
    quarantine: list[tuple[int, int]] = field(default_factory=list)
    quarantine_names: list[str] = field(default_factory=list)
    skip_steps: Optional[Tuple[int, int]] = None
    z_loss_alpha: Optional[float] = None
    precision: list[tuple[str, str]] = field(default_factory=list)
    lr_scale: Optional[float] = None
    reason: str = ""

    # The keys of the dict commands were (and the binding still hands over).
    FIELDS: ClassVar[tuple[str, ...]] = (
        "kind", "command_id", "incident_id", "target_step", "checkpoint_uri", "quarantine",
        "quarantine_names", "skip_steps", "z_loss_alpha", "precision", "lr_scale", "reason")

    def __post_init__(self) -> None:
        fields: Any = self.kind
        if isinstance(fields, Mapping):
            # Command(dict), as earlier releases were made.
            _warnings.warn("trainwatch: Command(dict) is deprecated; use Command.from_dict()",
                           DeprecationWarning, stacklevel=3)
            self.__dict__.update(vars(Command.from_dict(fields)))
            return
        self.kind = CommandKind(self.kind)
        self.quarantine = [(int(r[0]), int(r[1])) for r in self.quarantine]
        self.quarantine_names = list(self.quarantine_names)
        self.precision = [(str(p[0]), str(p[1])) for p in self.precision]
        if self.skip_steps is not None:
            self.skip_steps = (int(self.skip_steps[0]), int(self.skip_steps[1]))

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Command:
        """A Command from the binding's dict (keys: FIELDS; a key left out or
        None takes the field's default)."""
        given = {k: fields[k] for k in cls.FIELDS if fields.get(k) is not None}
        return cls(**given)

    def __repr__(self) -> str:
        set_fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.FIELDS
                               if getattr(self, k) not in (None, "", [], -1))
        return f"Command({set_fields})"
