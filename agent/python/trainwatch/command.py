"""Commands from trainwatchd, as the agent hands them to the trainer.

A Command has attributes instead of string keys; cmd["checkpoint_uri"] still
reads as it did when commands were plain dicts, so older trainer code keeps
working.
"""

__all__ = ["Command"]


class Command:
    """One command from the server.

    kind: "rollback", "halt" or "resume".
    command_id, incident_id: what to acknowledge, and why it was sent.
    target_step, checkpoint_uri: the checkpoint to load (rollback).
    quarantine: [(first, last)] inclusive shard ranges the loader must skip.
    quarantine_names: shard names the loader must skip (exact matches).
    skip_steps: (first, last) steps whose batches no rank serves again, or None.
    z_loss_alpha: the new z-loss alpha, or None (unchanged).
    precision: [(module name, "fp32" | "bf16" | "fp16")], in order.
    lr_scale: factor on every learning rate, or None (unchanged).
    reason: the halt's or resume's reason.
    """

    FIELDS = ("kind", "command_id", "incident_id", "target_step", "checkpoint_uri",
              "quarantine", "quarantine_names", "skip_steps", "z_loss_alpha", "precision", "lr_scale", "reason")
    __slots__ = FIELDS

    def __init__(self, fields):
        for key in self.FIELDS:
            setattr(self, key, fields.get(key))
        self.quarantine = [tuple(r) for r in (self.quarantine or [])]
        self.quarantine_names = list(self.quarantine_names or [])
        self.precision = [tuple(p) for p in (self.precision or [])]
        if self.skip_steps is not None:
            self.skip_steps = tuple(self.skip_steps)

    # The dict the agent used to hand over, read the same way.
    def __getitem__(self, key):
        if key not in self.FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key):
        return key in self.FIELDS

    def get(self, key, default=None):
        return getattr(self, key) if key in self.FIELDS else default

    def keys(self):
        return list(self.FIELDS)

    def __repr__(self):
        set_fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.FIELDS
                               if getattr(self, k) not in (None, "", [], -1))
        return f"Command({set_fields})"
