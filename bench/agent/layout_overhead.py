"""observe() per step by gradient layout (watch(layout=)), for a model of 150
tensors and 25M parameters on CPU: the per-tensor grouping of "hybrid" must
not cost more than the one fused pass of "sharded".

  PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/agent/layout_overhead.py

The non-sharded runs use a 2-rank agent whose reduce returns its input: the
collective is not what is measured."""
import time, torch, trainwatch, trainwatch.torch as twt
torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(580, 290)) for _ in range(150)]
for i, p in enumerate(params):
    p.grad = torch.randn_like(p)
    if i % 2: twt.mark_tensor_parallel(p)
n = sum(p.numel() for p in params)
def run(layout, **kw):
    world = 1 if layout == "sharded" else 2
    agent = trainwatch.Agent(run_id="b", rank=0, world_size=world,
                             reduce=None if world == 1 else (lambda s, m: (s, m)))
    opt = torch.optim.SGD(params, lr=0.1)
    g = twt.watch(opt, agent, layout=layout, **kw)
    for s in range(3): g.observe(s, 1.0)
    t = time.perf_counter()
    for s in range(3, 23): g.observe(s, 1.0)
    dt = (time.perf_counter() - t) / 20
    g.detach(); agent.close()
    return dt
print(f"{len(params)} tensors, {n/1e6:.1f}M params")
base = run("sharded")
for layout, kw in (("sharded", {}), ("replicated", {}),
                   ("hybrid", dict(data_parallel_size=1, tensor_parallel_size=2))):
    dt = run(layout, **kw)
    print(f"{layout:10s} observe {dt*1e3:.2f} ms  ({dt/base:.2f}x sharded)")
