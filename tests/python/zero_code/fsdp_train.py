"""An FSDP2 training script as users write them, with no trainwatch in it,
for torchrun (gloo, CPU): fully_shard on a 1-D mesh of every rank, or with
--tp, tensor parallel on a 2 x 2 (dp, tp) mesh with the embedding and a
LayerNorm left out of the TP plan, so that FSDP2 shards those on the dp
sub-mesh alone. Prints each step's loss (the mean over ranks) and its
gradient norm: the pre-clip norm torch's clip returns (--clip), else the norm
of the gathered full gradients (each DTensor's full_tensor())."""

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, EMBD, HIDDEN, BLOCK, BATCH = 24, 16, 36, 8, 4


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.up = nn.Linear(EMBD, HIDDEN)
        self.down = nn.Linear(HIDDEN, EMBD)
        self.norm = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB)

    def forward(self, idx):
        x = self.wte(idx)
        x = x + self.down(torch.tanh(self.up(x)))
        return self.lm_head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tp", action="store_true")
    p.add_argument("--clip", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM()
    if args.tp:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {
            "up": ColwiseParallel(), "down": RowwiseParallel(),
            "lm_head": ColwiseParallel(output_layouts=Replicate())})
        dp = mesh["dp"]
        data_rank = dp.get_local_rank()
    else:
        dp = init_device_mesh("cpu", (world,))
        data_rank = rank
    for m in (model.wte, model.up, model.down, model.norm, model.lm_head):
        fully_shard(m, mesh=dp)
    fully_shard(model, mesh=dp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(7 + data_rank)
    for step in range(args.steps):
        start = torch.randint(VOCAB, (BATCH, 1), generator=gen)
        seq = (start + torch.arange(BLOCK + 1)) % VOCAB
        logits = model(seq[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        loss.backward()
        if args.clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        else:
            total = 0.0
            for q in model.parameters():
                g = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
                total += float(g.double().pow(2).sum())
            norm = math.sqrt(total)
        t = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(t)
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} loss {float(t) / world:.9g} norm {norm:.9g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
