"""trainwatch inside trainers that own their training loop.

- trainwatch.integrations.transformers.watch(trainer): the Hugging Face Trainer.
- trainwatch.integrations.lightning.TrainwatchCallback(): Lightning.
- trainwatch.integrations.torchtitan.watch(trainer): torchtitan's Trainer.

Each one decides where the trainer has the step's pre-clip gradients and
before anything acts on them: a skip drops the step's gradients, so the
optimizer leaves every weight and its state as they were; a halt raises
trainwatch.TrainingHalted naming the tensor (exit status 3 under
trainwatch.exit_on_halt()). Each module imports its trainer only when used.
"""
