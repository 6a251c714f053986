"""A Hugging Face Trainer job for test_transformers.py: a tiny GPT-2 built
from its config (no download) learning a counting language on the CPU, with
gradient accumulation 2. Run as a script with one JSON argument:

  watch       attach trainwatch (trainwatch.integrations.transformers.watch)
  server      trainwatchd's address (with watch)
  run_id      the run's id
  steps       optimizer steps to run
  clip        max_grad_norm (0: clipping off)
  bad_step    the optimizer step whose first micro-batch is random tokens
  nan_step    the optimizer step whose gradient of NAN_PARAM gets a NaN
  nan_loss_step  the optimizer step whose logits are NaN (a NaN loss)
  out         where to write the results (JSON)

Under torchrun it is one rank of a DDP job (gloo). The results: the
Trainer's log_history, the number of optimizer steps it ran, and around
bad_step whether the weights and AdamW's state were bit-identical across it.
"""

import os

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import trainer_job

VOCAB, SEQ, MICRO = 64, 16, 4
NAN_PARAM = "transformer.h.1.mlp.c_fc.weight"
# Warm-up shortened from the production 1,000 steps to fit a short job; so is
# log Z's: a tiny model leaving its uniform start raises log Z by 4 in 45
# steps, which the production warm-up covers.
RULES = {"warmup_steps": 30, "warmup_min_records": 20, "warmup_min_grad_samples": 20,
         "logz_rise": 50.0}


class Counting(torch.utils.data.Dataset):
    """Sequences start, start+k, start+2k, ... mod VOCAB: learnable in a few
    dozen steps, so that a batch of random tokens stands out."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start, k = (i * 7) % VOCAB, 1 + i % 3
        ids = [(start + k * t) % VOCAB for t in range(SEQ)]
        return {"input_ids": ids, "labels": ids, "trainwatch_shards": 1000 + i}


class Collator:
    """Stacks a micro-batch; micro-batches in `bad` (counted from 0 on this
    rank) become random tokens, as a corrupted shard's would be."""

    def __init__(self, bad):
        self.bad, self.calls = bad, 0
        self.gen = torch.Generator().manual_seed(7)

    def __call__(self, features):
        batch = {k: torch.tensor([f[k] for f in features]) for k in features[0]}
        if self.calls in self.bad:
            noise = torch.randint(0, VOCAB, batch["input_ids"].shape, generator=self.gen)
            batch["input_ids"] = batch["labels"] = noise
        self.calls += 1
        return batch


class Snapshots(TrainerCallback):
    """Weights and AdamW's state just before and after one optimizer step."""

    def __init__(self, step):
        self.step, self.before, self.same = step, None, None

    def _state(self, model, optimizer):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = getattr(optimizer, "optimizer", optimizer)
        state = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                 for i, s in enumerate(opt.state.values())}
        return weights, state

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
        if state.global_step + 1 == self.step:
            self.before = self._state(model, optimizer)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
        if state.global_step == self.step and self.before is not None:
            (w0, s0), (w1, s1) = self.before, self._state(model, optimizer)
            self.same = {
                "weights": all(torch.equal(w0[n], w1[n]) for n in w0),
                "optimizer_state": len(s0) == len(s1) and all(
                    s0[i].keys() == s1[i].keys() and all(
                        torch.equal(s0[i][k], s1[i][k]) if torch.is_tensor(s0[i][k])
                        else s0[i][k] == s1[i][k] for k in s0[i]) for i in s0),
                "optimizer_state_entries": len(s1)}


def main(cfg):
    rank = int(os.environ.get("RANK", "0"))
    steps = cfg["steps"]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                       n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(
        output_dir=cfg["out"] + ".trainer", use_cpu=True, report_to="none", save_strategy="no",
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=2, max_steps=steps,
        learning_rate=1e-2, warmup_steps=0, lr_scheduler_type="constant", weight_decay=0.01,
        max_grad_norm=cfg.get("clip", 1.0), logging_steps=1, disable_tqdm=True, seed=0,
        train_sampling_strategy="sequential", dataloader_num_workers=0)
    bad = cfg.get("bad_step")
    # Micro-batch numbers count from 0; optimizer step s holds 2(s-1), 2(s-1)+1.
    collator = Collator((2 * bad - 2, 2 * bad - 1) if bad and rank == 0 else ())
    snapshots = Snapshots(bad or -1)
    trainer = Trainer(model=model, args=args, train_dataset=Counting(MICRO * 2 * steps * world),
                      data_collator=collator, callbacks=[snapshots])
    hook = None
    if cfg.get("watch"):
        from trainwatch.integrations.transformers import watch
        hook = watch(trainer, server=cfg.get("server", ""), run_id=cfg["run_id"], rules=RULES)
    params = dict(model.named_parameters())
    nan_step = cfg.get("nan_step")
    if nan_step:
        def poison(grad):
            # Each micro-batch's backward of nan_step.
            if trainer.state.global_step + 1 == nan_step:
                grad = grad.clone()
                grad[3, 5] = float("nan")
            return grad
        params[NAN_PARAM].register_hook(poison)
    nan_loss_step = cfg.get("nan_loss_step")
    if nan_loss_step:
        def nan_logits(module, inputs, output):
            if trainer.state.global_step + 1 == nan_loss_step:
                return output * float("nan")
            return output
        model.lm_head.register_forward_hook(nan_logits)
    result = {"transformers": transformers.__version__, "torch": torch.__version__}
    try:
        trainer.train()
    finally:
        result.update(log_history=trainer.state.log_history, global_step=trainer.state.global_step,
                      skip_snapshot=snapshots.same,
                      verdict=None if hook is None or hook.verdict is None else {
                          "step": hook.verdict.step, "decision": str(hook.verdict.decision),
                          "loss": hook.verdict.loss},
                      final_weights_sum=float(sum(p.detach().double().sum() for p in model.parameters())))
        trainer_job.write_results(cfg["out"], rank, result)


if __name__ == "__main__":
    trainer_job.run(main)
