"""What `trainwatch run`'s bootstrap (trainwatch/_bootstrap/sitecustomize.py)
takes each process of a job for, from the command line it was started with:
launchers and compile workers stay inert, multiprocessing children wait for a
process group, everything else is a rank. Standard library only: Debian's
/usr/bin/python3, the module loaded from the build's package folder under
another name, so that nothing of it runs at import."""

import importlib.util
import os
import unittest

import trainwatch

spec = importlib.util.spec_from_file_location(
    "trainwatch_bootstrap", os.path.join(os.path.dirname(trainwatch.__file__), "_bootstrap",
                                         "sitecustomize.py"))
bootstrap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bootstrap)

PY = "/venv/bin/python"


class RoleTest(unittest.TestCase):
    def check(self, argv, want, env=None):
        self.assertEqual(bootstrap.role(argv, env or {}), want, argv)

    def test_launchers_are_inert_without_rank(self):
        self.check([PY, "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], "launcher")
        self.check([PY, "-m", "torch.distributed.run", "--standalone", "train.py"], "launcher")
        self.check([PY, "-mtorch.distributed.launch", "train.py"], "launcher")
        self.check([PY, "/venv/bin/accelerate", "launch", "train.py"], "launcher")
        self.check([PY, "/venv/bin/deepspeed", "train.py"], "launcher")
        # A process that has RANK is a rank whatever it is named.
        self.check([PY, "/venv/bin/torchrun", "train.py"], "rank", {"RANK": "0"})

    def test_ranks(self):
        self.check([PY, "train.py"], "rank")
        self.check([PY, "-u", "train.py", "--lr", "3e-4"], "rank")  # torchrun's workers
        self.check([PY, "-X", "faulthandler", "-W", "ignore", "train.py"], "rank")
        self.check([PY, "-m", "torchtitan.train", "--job.config_file", "x.toml"], "rank")
        self.check([PY, "-u", "-m", "pkg.train"], "rank", {"RANK": "3"})

    def test_helpers_and_children(self):
        self.check([PY, "-c", "from multiprocessing.spawn import spawn_main; "
                    "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"], "child",
                   {"RANK": "1"})
        self.check([PY, "-c", "from multiprocessing.forkserver import main; main(3, 4)"],
                   "child")
        self.check([PY, "-c", "from multiprocessing.resource_tracker import main;main(5)"],
                   "child")
        self.check([PY, "-m", "torch._inductor.compile_worker", "--pickler=x"], "helper",
                   {"RANK": "0"})
        self.check([PY, "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/"
                    "__main__.py", "--workers=4"], "helper", {"RANK": "0"})

    def test_program(self):
        self.assertEqual(bootstrap._program([PY, "-m", "pkg.mod", "-m", "x"]), "pkg.mod")
        self.assertEqual(bootstrap._program([PY, "-c", "print(1)"]), "-c")
        self.assertEqual(bootstrap._program([PY, "-X", "dev", "/a/b/train.py"]), "train")
        self.assertEqual(bootstrap._program(["/venv/bin/torchrun"]), "torchrun")


if __name__ == "__main__":
    unittest.main()
