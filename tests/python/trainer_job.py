"""What the trainer jobs of the integration tests (hf_trainer.py,
lightning_trainer.py, torchtitan_trainer.py) share: run as a script with one
JSON argument, a halt exits 3 as a user's trainer would, and rank 0 writes
the results where the test reads them."""

import json
import sys

import torch

import trainwatch


def run(main, config=None):
    """main(config), config from the command line's JSON unless given, under
    trainwatch.exit_on_halt()."""
    try:
        with trainwatch.exit_on_halt():
            main(json.loads(sys.argv[1]) if config is None else config)
    finally:
        # gloo's threads abort the process when it exits with the group alive.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def write_results(path, rank, result):
    if rank == 0:
        with open(path, "w") as f:
            json.dump(result, f)
