"""DTensor gradients on torch 2.x (run in the torch 2.x test environments,
tests/python/env): real gloo ranks, real FSDP2 (fully_shard), tensor
parallel (parallelize_module) and their combinations, streaming to a real
trainwatchd. watch() is given no layout: it reads the placements.

For every step the grad_norm trainwatchd stores must be torch's own,
torch.nn.utils.get_total_norm(grads).full_tensor(), within 1e-6, and the
norm of the gathered full gradients in one process (computed on every rank;
all agree), and guard.clip_grad_norm_ to half that norm must scale every
rank's local shards as torch's clip does. The last step carries NaNs put
into one rank's shard of a named parameter: the halt names that parameter's
fully qualified name and that rank, and nan_frac counts each element once.
"""

import json
import math
import os
import sqlite3
import unittest
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import trainwatch
import trainwatch.torch as twt
from trainwatchd_process import DaemonTestCase, free_port

STEPS = 6  # the last one carries the NaN
NAN_AT = STEPS - 1


class Net(torch.nn.Module):
    """Odd sizes, so that shards are uneven: on 4 ranks, out's 3 rows leave
    the last rank none of out.weight and out.bias."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 36)
        self.down = torch.nn.Linear(36, 12)
        self.out = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.down(torch.tanh(self.up(x)))))


def tp_plan():
    # out: 3 rows over the tensor-parallel ranks, uneven; its output gathered
    # for the loss.
    return {"up": ColwiseParallel(), "down": RowwiseParallel(),
            "out": ColwiseParallel(output_layouts=Replicate())}


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def setup_fsdp(mesh):
    model = Net()
    for m in (model.up, model.down, model.out):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def setup_tp(mesh):
    return parallelize_module(Net(), mesh, tp_plan())


def setup_fsdp_tp(mesh):
    model = parallelize_module(Net(), mesh["tp"], tp_plan())
    for m in (model.up, model.down, model.out):
        fully_shard(m, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


class NormNet(Net):
    """A LayerNorm between down and out, left out of the tensor-parallel
    plan: FSDP2 shards it on the data-parallel sub-mesh alone."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(12)

    def forward(self, x):
        return self.out(self.norm(torch.tanh(self.down(torch.tanh(self.up(x))))))


def setup_fsdp_tp_submesh(mesh):
    model = parallelize_module(NormNet(), mesh["tp"], tp_plan())
    for m in (model.up, model.down, model.norm, model.out):
        fully_shard(m, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    assert model.norm.weight.device_mesh.size() == 2 and model.up.weight.device_mesh.size() == 4
    return model


def setup_hsdp(mesh):
    model = Net()
    for m in (model.up, model.down, model.out):
        fully_shard(m, mesh=mesh)  # 2-D mesh: replicate x shard
    fully_shard(model, mesh=mesh)
    return model


# case: (world, mesh shape, mesh names, setup, which ranks see the same batch,
# the ranks holding the NaN shard, and its parameter).
CASES = {
    "fsdp2": (2, (2,), ("dp",), setup_fsdp, None, (1,), "down.weight"),
    "fsdp2_uneven": (4, (4,), ("dp",), setup_fsdp, None, (2,), "out.weight"),
    "tp": (2, (2,), ("tp",), setup_tp, "all", (1,), "up.weight"),
    "fsdp2_tp": (4, (2, 2), ("dp", "tp"), setup_fsdp_tp, "tp", (3,), "down.weight"),
    # DTensors on the 2x2 mesh and on its dp sub-mesh (norm.*): torch's
    # get_total_norm refuses the mix, so the gathered norm is the oracle.
    "fsdp2_tp_submesh": (4, (2, 2), ("dp", "tp"), setup_fsdp_tp_submesh, "tp", (3,),
                         "down.weight"),
    # Ranks 0 and 2 hold the same shard (HSDP replicates it): both see the NaN.
    "hsdp": (4, (2, 2), ("replicate", "shard"), setup_hsdp, None, (0, 2), "up.weight"),
}


def rank_main(rank, world, port, out_dir, case):
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # the model is ours
    _, shape, names, setup, same_data, nan_ranks, nan_param = CASES[case]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)  # the same initial weights everywhere
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = setup(mesh)
    agent = trainwatch.Agent(server=os.environ["TW_ADDRESS"], run_id=os.environ["TW_RUN"],
                             rank=rank, world_size=world, reduce=twt.distributed_reduce())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = twt.watch(opt, agent, model=model)  # no layout: from the placements
    assert guard.layout == "dtensor", guard.layout
    # Ranks that must see the same batch: every tensor-parallel rank of a
    # replica; otherwise each data-parallel rank its own.
    if same_data == "all":
        seed = 0
    elif same_data == "tp":
        seed = mesh["dp"].get_local_rank()
    else:
        seed = rank
    gen = torch.Generator().manual_seed(100 + seed)
    refs, halted = {}, None
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if step == NAN_AT:
            g = dict(model.named_parameters())[nan_param].grad
            if rank in nan_ranks:
                local = g.to_local()
                assert local.numel() >= 2, (case, rank, local.shape)
                local.view(-1)[:2] = math.nan
        gathered = [full(g) for g in grads]  # collective: every rank
        bad = sum(int((~torch.isfinite(g)).sum()) for g in gathered)
        n = sum(g.numel() for g in gathered)
        whole = float(torch.linalg.vector_norm(torch.cat([g.flatten().double()
                                                          for g in gathered])))
        if case == "fsdp2_tp_submesh":
            oracle = whole
        else:
            oracle = float(torch.nn.utils.get_total_norm(grads).full_tensor())
        try:
            v = guard.observe(step, loss)
            refs[step] = [oracle, whole, bad, n, None]
            if not v.halt:
                # Clipped to half the norm: each local shard scaled as torch's
                # clip scales it, by max_norm / (norm + 1e-6).
                before = torch.cat([g.to_local().flatten().double() for g in grads])
                max_norm = oracle / 2
                total = guard.clip_grad_norm_(max_norm)
                after = torch.cat([g.to_local().flatten().double() for g in grads])
                want = before * (max_norm / (oracle + 1e-6))
                err = float(torch.linalg.vector_norm(after - want) /
                            max(float(torch.linalg.vector_norm(want)), 1e-30))
                refs[step][4] = [err, float(total), v.grad_norm]
            opt.step()
        except trainwatch.TrainingHalted as e:
            refs[step] = [oracle, whole, bad, n, None]
            halted = {"step": e.step, "tensors": [list(t) for t in e.tensors], "ranks": e.ranks}
            break
    agent.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"refs": refs, "halted": halted,
                   "locals": {n: p.grad.to_local().numel() if p.grad is not None else None
                              for n, p in model.named_parameters()}}, f)
    dist.destroy_process_group()


class _DaemonTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        print(f"torch {torch.__version__}, trainwatch {trainwatch.__version__}")


class DTensorNormTest(_DaemonTest):
    def run_case(self, case):
        world, _, _, _, _, nan_ranks, nan_param = CASES[case]
        os.environ["TW_ADDRESS"], os.environ["TW_RUN"] = self.daemon.address, case
        mp.spawn(rank_main, args=(world, free_port(), self.work.name, case), nprocs=world,
                 join=True)
        ranks = []
        for r in range(world):
            with open(os.path.join(self.work.name, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        db = sqlite3.connect(self.daemon.db)
        stored = dict(db.execute("SELECT step, grad_norm FROM steps WHERE run_id=? ORDER BY step",
                                 (case,)))
        nan_frac = db.execute("SELECT nan_frac FROM steps WHERE run_id=? AND step=?",
                              (case, NAN_AT)).fetchone()[0]
        db.close()
        self.assertEqual(sorted(stored), list(range(STEPS)))
        worst = max(abs(stored[s] - ranks[0]["refs"][str(s)][0]) / ranks[0]["refs"][str(s)][0]
                    for s in range(NAN_AT))
        print(f"\n{case}: stored grad_norm vs get_total_norm().full_tensor(), largest relative "
              f"error over {NAN_AT} steps: {worst:.2e}")
        for step in range(NAN_AT):
            oracle, whole, bad, _, _ = ranks[0]["refs"][str(step)]
            for r in ranks:  # guard.clip_grad_norm_ scaled every rank's shards as torch would
                err, total, verdict_norm = r["refs"][str(step)][4]
                self.assertLessEqual(err, 1e-6, f"{case} step {step}")
                self.assertAlmostEqual(total, verdict_norm, delta=1e-6 * verdict_norm)  # its dtype
            self.assertEqual(bad, 0)
            for r in ranks:
                self.assertAlmostEqual(r["refs"][str(step)][0], oracle, delta=1e-6 * oracle)
            self.assertLessEqual(abs(whole - oracle) / oracle, 1e-6)
            self.assertLessEqual(abs(stored[step] - oracle) / oracle, 1e-6,
                                 f"{case} step {step}: stored {stored[step]}, torch {oracle}")
        _, _, bad, n, _ = ranks[0]["refs"][str(NAN_AT)]
        self.assertGreater(bad, 0)
        self.assertEqual(nan_frac, bad / n)  # each NaN element counted once
        for r, out in enumerate(ranks):  # every rank halts at the same step
            self.assertEqual(out["halted"]["step"], NAN_AT, f"rank {r}")
            if r in nan_ranks:  # named by the rank holding the shard
                self.assertEqual(out["halted"]["ranks"], [r])
                self.assertEqual([t[0] for t in out["halted"]["tensors"]], [nan_param])
                self.assertEqual(out["halted"]["tensors"][0][1], 2)
            else:
                self.assertEqual(out["halted"]["tensors"], [], f"rank {r}")
        return ranks

    def test_fsdp2(self):
        self.run_case("fsdp2")

    def test_fsdp2_uneven_shards_and_a_rank_holding_none(self):
        ranks = self.run_case("fsdp2_uneven")
        self.assertEqual([r["locals"]["out.weight"] for r in ranks], [12, 12, 12, 0])

    def test_tensor_parallel_colwise_rowwise(self):
        self.run_case("tp")

    def test_fsdp2_x_tp_on_a_2x2_mesh(self):
        self.run_case("fsdp2_tp")

    def test_fsdp2_x_tp_with_a_norm_on_the_dp_sub_mesh(self):
        self.run_case("fsdp2_tp_submesh")

    def test_hsdp(self):
        self.run_case("hsdp")


def outer_replicas_main(rank, world, port, out_dir, give_replicas):
    """Tensor parallel on a 2-rank sub-mesh, replicated twice outside it by
    data parallelism done as DDP does it (an all-reduce of the gradients over
    the replicas): the DTensors know nothing of the outer copies."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(Net(), mesh["tp"], tp_plan())
    agent = trainwatch.Agent(server=os.environ["TW_ADDRESS"], run_id=os.environ["TW_RUN"],
                             rank=rank, world_size=world, reduce=twt.distributed_reduce())
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    try:
        guard = twt.watch(opt, agent, model=model, replicas=2 if give_replicas else None)
    except ValueError as e:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"error": str(e)}, f)
        agent.close()
        dist.destroy_process_group()
        return
    gen = torch.Generator().manual_seed(100 + mesh["dp"].get_local_rank())
    refs = {}
    dp_group = mesh["dp"].get_group()
    for step in range(3):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        for g in grads:
            local = g.to_local() if isinstance(g, DTensor) else g
            dist.all_reduce(local, group=dp_group)
            local /= 2
        refs[step] = float(torch.nn.utils.get_total_norm(grads).full_tensor())
        guard.observe(step, 1.0)
        opt.step()
    agent.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"refs": refs}, f)
    dist.destroy_process_group()


class OuterReplicationTest(_DaemonTest):
    def spawn(self, run, give_replicas):
        os.environ["TW_ADDRESS"], os.environ["TW_RUN"] = self.daemon.address, run
        mp.spawn(outer_replicas_main, args=(4, free_port(), self.work.name, give_replicas),
                 nprocs=4, join=True)
        with open(os.path.join(self.work.name, "rank0.json")) as f:
            return json.load(f)

    def test_replicas_outside_the_mesh_count_once(self):
        out = self.spawn("outer", True)
        db = sqlite3.connect(self.daemon.db)
        stored = dict(db.execute("SELECT step, grad_norm FROM steps WHERE run_id='outer'"))
        db.close()
        self.assertEqual(sorted(stored), [0, 1, 2])
        worst = max(abs(stored[int(s)] - o) / o for s, o in out["refs"].items())
        print(f"\nTP replicated outside its mesh: largest relative error {worst:.2e}")
        for step, oracle in out["refs"].items():
            self.assertLessEqual(abs(stored[int(step)] - oracle) / oracle, 1e-6)

    def test_a_mesh_short_of_the_world_needs_replicas(self):
        out = self.spawn("no-replicas", False)
        self.assertIn("device mesh has 2 ranks and the job 4: pass replicas=", out["error"])


class PartialGradientTest(unittest.TestCase):
    """A Partial gradient (addends, not values) is refused naming it."""

    def test_partial_is_refused_naming_the_parameter(self):
        port = free_port()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        try:
            mesh = init_device_mesh("cpu", (1,))
            model = parallelize_module(Net(), mesh, tp_plan())
            agent = trainwatch.Agent(run_id="partial", world_size=1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            guard = twt.watch(opt, agent, model=model)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            w = model.down.bias
            w.grad = DTensor.from_local(torch.ones(12), mesh, [Partial()])
            with self.assertRaisesRegex(ValueError, "gradient of down.bias is a Partial"):
                guard.observe(0, 1.0)
            self.assertEqual(agent.stats().steps, 0)  # nothing judged
            w.grad = DTensor.from_local(torch.ones(12), mesh, [Replicate()])
            self.assertEqual(guard.observe(0, 1.0).decision, "continue")
            agent.close()
        finally:
            dist.destroy_process_group()

    def test_an_explicit_layout_is_refused_for_dtensors(self):
        port = free_port()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        try:
            model = parallelize_module(Net(), init_device_mesh("cpu", (1,)), tp_plan())
            agent = trainwatch.Agent(run_id="layout", world_size=1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with self.assertRaisesRegex(ValueError, "placements give the layout"):
                twt.watch(opt, agent, model=model, layout="sharded")
            agent.close()
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
