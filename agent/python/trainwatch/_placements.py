"""The gradient layout read from DTensor placements (torch 2.x: FSDP2's
fully_shard, tensor parallel, their 2-D combination, HSDP, torchtitan).

A DTensor gradient's placements say, per mesh dimension, what this rank's
local tensor is of the whole:

- Shard(d), and _StridedShard (FSDP2 x TP on one dimension): a distinct
  slice. Classified as "neither replicate nor partial", because newer torch
  no longer makes _StridedShard a Shard.
- Replicate(): the same values on every rank of that dimension.
- Partial(): addends of the gradient; the sum of their squares is not the
  square of their sum, so no local statistic of them is exact.

The global norm stays exact with the agent's one reduction: each rank sums
the squares of its local tensor (to_local(), never full_tensor(): no
gathering) and weights them by 1/copies, copies being the number of ranks
holding that element: the sizes of the Replicate dimensions, times the
copies of a sub-mesh beside its own (a module sharded on the data-parallel
dimension of a 2-D mesh alone), times any replication outside the mesh
(`replicas`: DDP around a tensor-parallel mesh). Partial gradients are refused, naming the tensor: FSDP2 reduces them
before they reach p.grad, and plain tensor parallel leaves them only where
the trainer reduces them itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

import torch as _torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor as _DTensorType
    from typing_extensions import TypeGuard


def _dtensor_class() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor
        return DTensor
    except ImportError:  # torch < 2.5 (torch.distributed._tensor) or no distributed
        pass
    try:
        from torch.distributed._tensor import DTensor as OlderDTensor  # type: ignore[attr-defined]
        return OlderDTensor
    except ImportError:
        return None


DTensor = _dtensor_class()


def is_dtensor(t: object) -> TypeGuard[_DTensorType]:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: _torch.Tensor) -> _torch.Tensor:
    """This rank's own elements of t: a DTensor's local tensor (the same
    storage, so an in-place scale of it scales the DTensor), else t."""
    return t.to_local() if is_dtensor(t) else t


def _root_size(mesh: Any) -> int:
    """The size of the mesh a (sub-)mesh was sliced from."""
    root = getattr(mesh, "_get_root_mesh", None)
    if callable(root):
        return int(root().size())
    try:  # torch 2.8
        from torch.distributed.device_mesh import _mesh_resources
        return int(_mesh_resources.get_root_mesh(mesh).size())
    except (ImportError, AttributeError):
        return int(mesh.size())


class DTensorLayout:
    """copies(param) for the agent's grad_copies, from the placements of
    each parameter's gradient. Made by watch() when the parameters are
    DTensors; checks once that the meshes and `replicas` account for every
    rank."""

    def __init__(self, named_params: Iterable[tuple[Optional[str], _torch.Tensor]],
                 world_size: int, replicas: Optional[int] = None) -> None:
        meshes: dict[int, Optional[str]] = {}
        roots: dict[int, Optional[str]] = {}
        for name, p in named_params:
            if is_dtensor(p):
                meshes.setdefault(p.device_mesh.size(), name)
                roots.setdefault(_root_size(p.device_mesh), name)
        if replicas is not None and (not isinstance(replicas, int) or isinstance(replicas, bool)
                                     or replicas < 1):
            raise ValueError(f"watch(): replicas must be an int >= 1 (got {replicas!r})")
        mesh_size = max(meshes)
        if len(meshes) > 1 and (len(roots) > 1 or any(mesh_size % m for m in meshes)):
            raise ValueError(
                "watch(): the parameters' DTensors live on meshes of different sizes ("
                + ", ".join(f"{n}: {s} ranks" for s, n in sorted(meshes.items()))
                + ") that are not sub-meshes of one mesh; one mesh (its sub-meshes included) "
                "is supported")
        outer = 1 if replicas is None else replicas
        if replicas is None and mesh_size != world_size:
            raise ValueError(
                f"watch(): the parameters' device mesh has {mesh_size} ranks and the job "
                f"{world_size}: pass replicas= the number of copies held outside the mesh (DDP "
                "around a tensor-parallel mesh: its data-parallel size), or replicas=1 when the "
                "other ranks hold other parameters (pipeline stages)")
        if world_size % (mesh_size * outer) != 0:
            raise ValueError(f"watch(): a mesh of {mesh_size} ranks x replicas {outer} does not "
                             f"divide world_size {world_size}")
        self.outer = outer
        # The largest mesh holds every parameter; a DTensor on a sub-mesh of
        # it (FSDP2 on the data-parallel dimension alone: a norm left out of
        # the tensor-parallel plan) is the same on each of the mesh_size / m
        # sub-meshes beside its own.
        self.mesh_size = mesh_size
        # A plain tensor beside DTensors is the same on every rank of the
        # mesh (a module left unsharded), and on its replicas.
        self.plain = mesh_size * outer

    def __call__(self, param: _torch.Tensor, name: Optional[str] = None) -> int:
        g = param.grad
        if not is_dtensor(g):
            return self.plain
        copies = self.outer * (self.mesh_size // g.device_mesh.size())
        for dim, placement in enumerate(g.placements):
            if placement.is_partial():
                raise ValueError(
                    f"trainwatch: the gradient of {name or 'a parameter'} is a Partial DTensor "
                    f"(placements {tuple(g.placements)}): its local values are addends, whose "
                    "norm is not the gradient's. Reduce it first (grad.redistribute(placements="
                    "[Replicate()] for the Partial dimensions)), as FSDP2 does before p.grad")
            if placement.is_replicate():
                copies *= g.device_mesh.size(dim)
        return copies
