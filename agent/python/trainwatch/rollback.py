"""Carry out a rollback command from trainwatchd in a PyTorch trainer.

After a human approved a rollback (`twctl rollback approve I-4 --precision
blocks.0.norm=fp32 --lr-scale 0.5`), every rank receives the command: a
running job by poll or callback, a restarted one at hello (wait for it with
agent.wait_for_server() before step 0). apply_rollback() does the part that
is the same in every trainer::

    cmd = agent.poll_command()
    if cmd is not None and cmd.kind == "rollback":
        done = trainwatch.rollback.apply_rollback(cmd, agent, model, optimizer, load, guard=guard)
        step = done.step + 1          # and done.z_loss_alpha, done.quarantine for the loader

where load(uri, model, optimizer) restores both from the checkpoint and
returns its step. It checks every setting first (an unknown module, a
precision this device's autocast cannot run), so a command that cannot be
applied is acknowledged as failed with the reason and changes nothing; then
it loads the checkpoint, applies the settings (the learning-rate factor on
every parameter group, per-module precision), rebuilds the agent's rule
engine (resume_from) and acknowledges the command as applied. The data
loader's part (quarantine, quarantine_names, skip_steps) and the z-loss alpha are returned for
the trainer, which owns both.

Per-module precision: the module's forward runs outside autocast with its
floating inputs in float32 ("fp32"), or under autocast to bf16 or fp16. It
holds for the life of the process; a restarted job gets it again from the
command that restarted it, since the agent delivers a pending rollback at
hello.
"""

from __future__ import annotations

import enum as _enum
import math as _math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Protocol, Union

import torch as _torch

from .command import AckStatus, CommandKind

if TYPE_CHECKING:
    from .command import Command

__all__ = ["apply_rollback", "set_module_precision", "Precision", "RollbackFailed",
           "RollbackResult"]


class Precision(str, _enum.Enum):
    """A module's precision in a rollback command. A str enum: "fp32" and
    the other names are taken where a Precision is."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    def __str__(self) -> str:
        return self.value


# Keyed by the members: an enum's hash is its name's, so a str finds no entry
# here until Precision(str) makes it a member.
_DTYPES = {Precision.FP32: _torch.float32, Precision.BF16: _torch.bfloat16,
           Precision.FP16: _torch.float16}
# What torch 1.13's autocast runs per device type (CPU autocast is bf16 only).
_AUTOCAST_DTYPES = {"cpu": (Precision.BF16,), "cuda": (Precision.BF16, Precision.FP16)}


class _Acknowledging(Protocol):
    """What apply_rollback() needs of the agent (a trainwatch.Agent)."""

    def acknowledge(self, command_id: str, status: Union[AckStatus, str], message: str = "",
                    resumed_step: int = -1) -> None: ...

    def resume_from(self, step: int) -> None: ...


class _Resuming(Protocol):
    def resume_from(self, step: int) -> None: ...


# load(uri, model, optimizer) -> the checkpoint's step.
Load = Callable[[str, _torch.nn.Module, _torch.optim.Optimizer], int]


class RollbackFailed(RuntimeError):
    """The command could not be applied; it was acknowledged as failed with this reason."""


@dataclass
class RollbackResult:
    """What apply_rollback() did.

    step: the checkpoint's step; training goes on at step + 1.
    precision: module name -> its precision now.
    lr_scale: applied to every parameter group, or None.
    z_loss_alpha: for the trainer to use from now on, or None (unchanged).
    quarantine, quarantine_names: shard ranges [(first, last)] and names
        for the data loader to skip.
    skip_steps: (first, last) steps whose batches the loader must not serve.
    message: what was acknowledged.
    """

    command_id: str
    step: int
    checkpoint_uri: str
    precision: dict[str, Precision] = field(default_factory=dict)
    lr_scale: Optional[float] = None
    z_loss_alpha: Optional[float] = None
    quarantine: list[tuple[int, int]] = field(default_factory=list)
    quarantine_names: list[str] = field(default_factory=list)
    skip_steps: Optional[tuple[int, int]] = None
    message: str = ""


def set_module_precision(module: _torch.nn.Module, precision: Union[Precision, str],
                         device_type: str = "cpu") -> None:
    """Runs `module`'s forward in `precision` from now on: "fp32" outside
    autocast with floating inputs cast to float32, "bf16" or "fp16" under
    autocast to that type. Calling it again replaces the earlier choice."""
    try:
        precision = Precision(precision)
    except ValueError:
        raise ValueError(f"precision must be fp32, bf16 or fp16, not {precision!r}") from None
    original = getattr(module, "_trainwatch_forward", None) or module.forward
    setattr(module, "_trainwatch_forward", original)
    dtype = _DTYPES[precision]

    def cast(v: Any) -> Any:
        return v.float() if _torch.is_tensor(v) and v.is_floating_point() else v

    def forward(*args: Any, **kwargs: Any) -> Any:
        if precision is Precision.FP32:
            with _torch.autocast(device_type, enabled=False):
                return original(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        with _torch.autocast(device_type, dtype=dtype):
            return original(*args, **kwargs)

    setattr(module, "forward", forward)


def _problems(cmd: Command, model: _torch.nn.Module, device_type: str) -> list[str]:
    """Why the command's settings cannot be applied to this model ([] if they can)."""
    problems: list[str] = []
    modules = dict(model.named_modules())
    for name, precision in cmd.precision:
        if name not in modules:
            near = sorted(n for n in modules if n and (name in n or n in name))[:5]
            problems.append(f"no module '{name}' in the model" +
                            (f" (did you mean {', '.join(near)}?)" if near else ""))
        elif precision not in {p.value for p in Precision}:
            problems.append(f"module '{name}': unknown precision {precision}")
        elif precision != "fp32" and precision not in _AUTOCAST_DTYPES.get(device_type, ()):
            problems.append(f"module '{name}': {device_type} autocast cannot run {precision}")
    if cmd.lr_scale is not None and not (_math.isfinite(cmd.lr_scale) and cmd.lr_scale > 0):
        problems.append(f"lr_scale must be a finite number > 0, not {cmd.lr_scale}")
    return problems


def apply_rollback(cmd: Command, agent: _Acknowledging, model: _torch.nn.Module,
                   optimizer: _torch.optim.Optimizer, load: Load, guard: Optional[_Resuming] = None,
                   scheduler: Any = None, device_type: str = "cpu") -> RollbackResult:
    """Loads the command's checkpoint with load(uri, model, optimizer) -> step,
    applies its settings, calls resume_from and acknowledges; returns a
    RollbackResult. On a setting that cannot be applied, a load that raises or
    a checkpoint of another step, acknowledges the command as failed with the
    reason and raises RollbackFailed (settings are checked before anything is
    loaded, so a refused command changes nothing). `scheduler`: an LR
    scheduler whose base_lrs are scaled too, so that it does not undo
    lr_scale at its next step."""
    if cmd.kind != CommandKind.ROLLBACK:
        raise ValueError(f"apply_rollback needs a rollback command, not {cmd.kind}")

    def fail(reason: str) -> NoReturn:
        agent.acknowledge(cmd.command_id, AckStatus.FAILED, reason)
        raise RollbackFailed(f"rollback {cmd.command_id}: {reason}")

    problems = _problems(cmd, model, device_type)
    if problems:
        fail("; ".join(problems))
    try:
        step = int(load(cmd.checkpoint_uri, model, optimizer))
    except Exception as e:  # noqa: BLE001 - any loader failure is the command's failure
        fail(f"loading {cmd.checkpoint_uri}: {type(e).__name__}: {e}")
    if step != cmd.target_step:
        fail(f"{cmd.checkpoint_uri} holds step {step}, not the command's {cmd.target_step}")
    done = RollbackResult(command_id=cmd.command_id, step=step, checkpoint_uri=cmd.checkpoint_uri,
                          z_loss_alpha=cmd.z_loss_alpha, quarantine=list(cmd.quarantine),
                          quarantine_names=list(cmd.quarantine_names), skip_steps=cmd.skip_steps)
    if cmd.lr_scale is not None:
        for group in optimizer.param_groups:
            group["lr"] *= cmd.lr_scale
        if scheduler is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * cmd.lr_scale for lr in scheduler.base_lrs]
        done.lr_scale = cmd.lr_scale
    modules = dict(model.named_modules())
    for name, precision in cmd.precision:
        set_module_precision(modules[name], precision, device_type)
        done.precision[name] = Precision(precision)
    # The agent's rule engine goes back to the checkpoint before the ack.
    (guard if guard is not None else agent).resume_from(step)
    parts = [f"loaded {cmd.checkpoint_uri} (step {step})"]
    parts += [f"{name} in {p}" for name, p in done.precision.items()]
    if done.lr_scale is not None:
        parts.append(f"learning rate x{done.lr_scale:g}")
    if done.z_loss_alpha is not None:
        parts.append(f"z-loss {done.z_loss_alpha:g}")
    if done.skip_steps:
        parts.append(f"skipped the batches of steps {done.skip_steps[0]}..{done.skip_steps[1]}")
    done.message = ", ".join(parts)
    agent.acknowledge(cmd.command_id, AckStatus.APPLIED, done.message, step)
    return done
