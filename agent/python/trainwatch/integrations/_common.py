"""What the trainer integrations share: the agent they make, and acting on a
verdict inside the trainer's step."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

from .. import Agent, Shard, TrainingHalted, Verdict

if TYPE_CHECKING:
    import torch as _torch


def make_agent(agent: Optional[Agent], options: Mapping[str, Any], rank: int, world_size: int,
               where: str) -> tuple[Agent, bool]:
    """(agent, owned): the given agent, or one made from options (trainwatch.Agent's
    keyword arguments) for this rank, reducing over torch.distributed's world
    when there are several ranks. An owned agent is closed by the integration."""
    if agent is not None:
        if options:
            raise TypeError(f"{where}: {', '.join(sorted(options))} configure the agent it makes; "
                            "with agent= given, pass them to trainwatch.Agent instead")
        if agent.world_size != world_size:
            raise ValueError(f"{where}: the agent's world_size is {agent.world_size}, the "
                             f"trainer's {world_size}")
        return agent, False
    for key in ("rank", "world_size", "reduce"):
        if key in options:
            raise TypeError(f"{where}: {key} comes from the trainer")
    reduce = None
    if world_size > 1:
        from ..torch import distributed_reduce
        reduce = distributed_reduce()
    return Agent(rank=rank, world_size=world_size, reduce=reduce, **options), True


# Set by `trainwatch run` (trainwatch.attach), which attaches an integration
# to a trainer whose code has no trainwatch.exit_on_halt() around it: the
# halt handler ends the process with the halt's line and status instead of
# raising TrainingHalted, and an observe-only run acts on nothing.
halt_handler: Optional[Callable[[Verdict], None]] = None
enforcing = True


def act(verdict: Verdict, params: Iterable[_torch.Tensor]) -> bool:
    """Halt: raises TrainingHalted. Skip: drops every gradient, so that the
    optimizer step the trainer runs next leaves the weights and the
    optimizer's state untouched (torch optimizers pass over parameters
    without a gradient). True when the step was skipped."""
    if not enforcing:
        return False
    if verdict.halt:
        if halt_handler is not None:
            halt_handler(verdict)
        raise TrainingHalted(verdict)
    if verdict.skip:
        for p in params:
            p.grad = None
        return True
    return False


def shard_list(value: Any) -> Optional[list[Shard]]:
    """A batch's shard ids or names as a list (a tensor, a list, one value)."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        out: list[Shard] = []
        for v in value:
            out.extend(shard_list(v) or [] if isinstance(v, (list, tuple)) else [v])
        return out
    return [value]


def wrap_method(orig: Callable[..., Any], hook: Callable[..., Any]) -> Callable[..., Any]:
    """A trainer's method `orig`, to be set as an instance attribute, calling
    hook(orig, ...): the trainer's own code runs inside the hook."""
    @functools.wraps(orig)
    def method(*args: Any, **kwargs: Any) -> Any:
        return hook(orig, *args, **kwargs)
    return method
