"""A data-parallel loop as users write it (DDP, AdamW, clip_grad_norm_),
with no trainwatch import: test_hangs.py runs it under `trainwatch run --
torchrun ...` on gloo ranks, with one of these failures:

  --block-rank R --block-step S  rank R stops before the backward of step
      S (DDP's gradient all-reduce), until the file --release names exists
      (forever without it); the other ranks wait in that all-reduce. The
      rank writes --marker (the time it blocked) first.
  --work-ms W --slow-rank R --slow-factor F  every rank works W ms per step
      before its backward (a sleep standing for its share of the compute),
      rank R F times as long: a straggler the others wait for.
  --checkpoint-step S --checkpoint-seconds T  rank 0 saves a checkpoint
      with torch.save after step S into a file that takes T seconds to
      write (a slow filesystem), while the others wait in the next step's
      all-reduce.

Each rank prints its step times at the end ("rank R: N steps, median M ms").
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--tag", default="")  # names the job's processes (test_hangs.py kills by it)
p.add_argument("--block-rank", type=int, default=-1)
p.add_argument("--block-step", type=int, default=-1)
p.add_argument("--release", default="")
p.add_argument("--marker", default="")
p.add_argument("--work-ms", type=float, default=0.0)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-factor", type=float, default=1.0)
p.add_argument("--checkpoint-step", type=int, default=-1)
p.add_argument("--checkpoint-seconds", type=float, default=0.0)
p.add_argument("--checkpoint", default="")
a = p.parse_args()


class SlowFile:
    """A file whose writes take `seconds` in all (a slow filesystem)."""

    def __init__(self, path, seconds):
        self.f = open(path, "wb")
        self.until = time.monotonic() + seconds

    def write(self, data):
        return self.f.write(data)

    def flush(self):
        self.f.flush()
        left = self.until - time.monotonic()
        if left > 0:
            time.sleep(left)

    def close(self):
        self.flush()
        self.f.close()


def wait_for_release():
    while not (a.release and os.path.exists(a.release)):
        time.sleep(0.05)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    times, last = [], time.monotonic()
    for step in range(a.steps):
        x = torch.randn(32, 16, generator=gen)
        y = x[:, :8].argmax(1)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        if a.work_ms:
            time.sleep(a.work_ms / 1000 * (a.slow_factor if rank == a.slow_rank else 1.0))
        if rank == a.block_rank and step == a.block_step:
            if a.marker:
                with open(a.marker, "w") as f:
                    f.write(str(time.time()))
            wait_for_release()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if rank == 0 and step == a.checkpoint_step:
            f = SlowFile(a.checkpoint, a.checkpoint_seconds)
            torch.save({"model": model.state_dict(), "step": step}, f)
            f.close()
        now = time.monotonic()
        times.append(now - last)
        last = now
    print(f"rank {rank}: {len(times)} steps, median {statistics.median(times) * 1000:.1f} ms",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
