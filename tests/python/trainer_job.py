"""What the trainer jobs of the integration tests (hf_trainer.py,
lightning_trainer.py, torchtitan_trainer.py) share: run as a script with one
JSON argument, a halt exits 3 as a user's trainer would, and rank 0 writes
the results where the test reads them. Without "watch" in the configuration
the job holds no trainwatch import (`trainwatch run` attaches it)."""

import json
import sys

import torch


def run(main, config=None):
    """main(config), config from the command line's JSON unless given, under
    trainwatch.exit_on_halt() when the job attaches trainwatch itself."""
    config = json.loads(sys.argv[1]) if config is None else config
    try:
        if config.get("watch"):
            import trainwatch
            with trainwatch.exit_on_halt():
                main(config)
        else:
            main(config)
    finally:
        # gloo's threads abort the process when it exits with the group alive.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def write_results(path, rank, result):
    if rank == 0:
        with open(path, "w") as f:
            json.dump(result, f)
