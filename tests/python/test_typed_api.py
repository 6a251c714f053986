"""The typed Python API: the str enums that stand for the choices (equal to
the strings earlier releases took and gave), the dataclasses that replaced
dicts (Verdict.events, Agent.stats(), Command) and their deprecated dict
reads, and the binding's stub (_trainwatch.pyi) against the binding itself,
so that a def, argument or property changed in bindings.cc without its stub
fails here. mypy --strict over the package is trainers_mypy_strict."""

import ast
import dataclasses
import os
import random
import re
import unittest

import torch

import trainwatch
import trainwatch.rollback as twr
import trainwatch.torch as twt
from trainwatch import _trainwatch

PACKAGE = os.path.dirname(trainwatch.__file__)


class EnumsTest(unittest.TestCase):
    def test_each_choice_is_a_str_enum_equal_to_its_old_string(self):
        for enum, names in ((trainwatch.Decision, ("continue", "skip_update", "halt")),
                            (trainwatch.AckStatus, ("received", "applied", "failed")),
                            (trainwatch.CommandKind, ("rollback", "halt", "resume")),
                            (twt.Layout, ("replicated", "sharded", "hybrid", "dtensor")),
                            (twr.Precision, ("fp32", "bf16", "fp16"))):
            self.assertEqual([m.value for m in enum], list(names))
            for member, name in zip(enum, names):
                self.assertIsInstance(member, str)
                self.assertEqual(member, name)
                self.assertEqual(str(member), name)
                self.assertEqual(f"{member}", name)
                self.assertIs(enum(name), member)
        self.assertEqual(list(twt.LAYOUTS), ["replicated", "sharded", "hybrid"])

    def test_layout_given_as_a_string_or_a_member(self):
        model = torch.nn.Linear(3, 2)
        for given in ("sharded", twt.Layout.SHARDED):
            agent = trainwatch.Agent(run_id="typed", world_size=1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            guard = twt.watch(opt, agent, layout=given)
            self.assertIs(guard.layout, twt.Layout.SHARDED)
            self.assertEqual(guard.layout, "sharded")
            guard.detach()
            agent.close()
        with self.assertRaisesRegex(ValueError, "not one of replicated, sharded, hybrid"):
            twt.watch(torch.optim.SGD(model.parameters(), lr=0.1),
                      trainwatch.Agent(run_id="typed"), layout="dtensor")

    def test_acknowledge_takes_a_status_or_its_name(self):
        with trainwatch.Agent(run_id="typed") as agent:
            agent.acknowledge("C-1", trainwatch.AckStatus.RECEIVED)
            agent.acknowledge("C-1", "failed", "no such checkpoint")
            with self.assertRaisesRegex(ValueError, "received, applied or failed"):
                agent.acknowledge("C-1", "done")

    def test_module_precision_takes_a_precision_or_its_name(self):
        for given in ("fp32", twr.Precision.FP32):
            module = torch.nn.Linear(2, 2)
            twr.set_module_precision(module, given)
            self.assertEqual(module(torch.ones(1, 2, dtype=torch.float64)).dtype, torch.float32)
        with self.assertRaisesRegex(ValueError, "fp32, bf16 or fp16, not 'fp8'"):
            twr.set_module_precision(torch.nn.Linear(2, 2), "fp8")


class DataclassesTest(unittest.TestCase):
    def setUp(self):
        self.agent = trainwatch.Agent(run_id="typed", rules={
            "warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20})

    def tearDown(self):
        self.agent.close()

    def test_verdict_events_and_tensors(self):
        rng = random.Random(3)
        for step in range(80):
            v = self.agent.step(step, loss=2.5 + 0.02 * rng.gauss(0, 1),
                                grad_stats=(rng.uniform(0.8, 1.2), 0, 1000), shards=[step])
        self.assertIsInstance(v, trainwatch.Verdict)
        self.assertIs(v.decision, trainwatch.Decision.CONTINUE)
        self.assertEqual((v.step, v.tier, v.rule, v.skip, v.halt), (79, 0, "", False, False))
        self.assertEqual(repr(v), "Verdict(continue, tier=0)")
        with self.assertRaises(AttributeError):  # read-only
            v.step = 3
        # A data anomaly: a skip with its event.
        v = self.agent.step(80, loss=6.0, grad_stats=(160.0, 0, 1000), shards=[7, "s-7"])
        self.assertTrue(v.skip)
        self.assertIs(v.decision, trainwatch.Decision.SKIP)
        self.assertEqual(v.decision, "skip_update")
        event = [e for e in v.events if e.action == "skip_update"][0]
        self.assertIsInstance(event, trainwatch.Event)
        self.assertEqual((event.step, event.tier, event.kind), (80, 1, "data_anomaly"))
        self.assertEqual((event.shards, event.shard_names), ([7], ["s-7"]))
        self.assertEqual(v.reason, event.reason)
        with self.assertWarnsRegex(DeprecationWarning, r"Event as a dict \(\['kind'\]\)"):
            self.assertEqual(event["kind"], "data_anomaly")
        # A NaN in a named gradient: the tensor, as a tuple too.
        v = self.agent.step(81, loss=2.5, grads={"w": torch.tensor([1.0, float("nan")])})
        self.assertTrue(v.halt)
        self.assertIs(v.decision, trainwatch.Decision.HALT)
        self.assertEqual(v.tensors, [trainwatch.NonfiniteTensor("w", 1, 2)])
        name, bad, total = v.tensors[0]
        self.assertEqual((name, bad, total), ("w", 1, 2))
        self.assertEqual(v.tensors[0].nonfinite, 1)

    def test_stats(self):
        self.agent.step(0, loss=2.0)
        stats = self.agent.stats()
        self.assertIsInstance(stats, trainwatch.AgentStats)
        self.assertEqual((stats.steps, stats.streaming, stats.durable_step), (1, False, -1))
        with self.assertWarnsRegex(DeprecationWarning, r"read \.steps"):
            self.assertEqual(stats["steps"], 1)
        with self.assertWarns(DeprecationWarning):
            self.assertEqual(dict(stats), dataclasses.asdict(stats))


def _params(args):
    return [a.arg for a in args.posonlyargs + args.args if a.arg != "self"]


def _native_params(doc):
    """The argument names in a pybind11 signature line: name(self: T, a: int, ...) -> R."""
    sig = doc.strip().splitlines()[0]
    inside = sig[sig.index("(") + 1:sig.rindex(")")]
    names = re.findall(r"(?:^|, )(\w+): ", inside)
    return [n for n in names if n != "self"]


class StubTest(unittest.TestCase):
    def test_the_package_is_typed(self):
        self.assertTrue(os.path.isfile(os.path.join(PACKAGE, "py.typed")))

    def test_the_stub_declares_what_the_binding_defines(self):
        with open(os.path.join(PACKAGE, "_trainwatch.pyi")) as f:
            stub = ast.parse(f.read())
        classes = {n.name: n for n in stub.body if isinstance(n, ast.ClassDef)}
        functions = {n.name: n for n in stub.body if isinstance(n, ast.FunctionDef)}
        variables = {n.target.id for n in stub.body if isinstance(n, ast.AnnAssign)
                     and not n.target.id.startswith("_")} | {"__version__"}
        native = {n for n in dir(_trainwatch) if not n.startswith("__")} | {"__version__"}
        declared = set(functions) | variables | {c for c in classes if c != "DeviceStatsResult"}
        if not _trainwatch.built_with_cuda:
            declared.discard("DeviceStats")  # only in a CUDA build
        self.assertEqual(declared, native)
        for name, fn in functions.items():
            self.assertEqual(_params(fn.args), _native_params(getattr(_trainwatch, name).__doc__),
                             name)
        for cls_name in sorted(native & set(classes)):
            cls = getattr(_trainwatch, cls_name)
            members = {n.name: n for n in classes[cls_name].body if isinstance(n, ast.FunctionDef)}
            public = {n for n in dir(cls) if not n.startswith("_")}
            self.assertEqual({n for n in members if not n.startswith("_")}, public, cls_name)
            for name, fn in members.items():
                attr = getattr(cls, name)
                if isinstance(attr, property):
                    self.assertTrue(any(isinstance(d, ast.Name) and d.id == "property"
                                        for d in fn.decorator_list), f"{cls_name}.{name}")
                    continue
                want = _native_params(attr.__doc__)
                got = _params(fn.args)
                if want and all(re.fullmatch(r"arg\d+", n) for n in want):
                    # Unnamed in the binding: positional only in the stub.
                    self.assertEqual(len(fn.args.posonlyargs) - 1, len(want), f"{cls_name}.{name}")
                else:
                    self.assertEqual(got, want, f"{cls_name}.{name}")


if __name__ == "__main__":
    unittest.main()
