"""What the trainer integrations share: the agent they make, and acting on a
verdict inside the trainer's step."""

from .. import Agent, TrainingHalted


def make_agent(agent, options, rank, world_size, where):
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


def act(verdict, params):
    """Halt: raises TrainingHalted. Skip: drops every gradient, so that the
    optimizer step the trainer runs next leaves the weights and the
    optimizer's state untouched (torch optimizers pass over parameters
    without a gradient). True when the step was skipped."""
    if verdict.halt:
        raise TrainingHalted(verdict)
    if verdict.skip:
        for p in params:
            p.grad = None
        return True
    return False


def shard_list(value):
    """A batch's shard ids or names as a list (a tensor, a list, one value)."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(shard_list(v) if isinstance(v, (list, tuple)) else [v])
        return out
    return [value]
