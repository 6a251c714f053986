"""A Lightning job for test_lightning.py: a small next-token model learning a
counting language on the CPU. Run as a script with one JSON argument:

  watch       attach trainwatch (TrainwatchCallback)
  server      trainwatchd's address (with watch)
  run_id      the run's id
  steps       optimizer steps (0-based, as Lightning's global_step)
  accum       accumulate_grad_batches
  fp16        MixedPrecision("16-mixed", "cpu") with a real GradScaler
              starting at 2^30 (overflows until it has halved into range)
  fused       AdamW(fused=True)
  clip        gradient_clip_val (default 1.0; 0: none, as a fused optimizer needs)
  devices     1, or 2 for the DDP strategy on two processes (gloo)
  bad_step    the step whose micro-batches are random tokens (rank 0's)
  nan_step    the step whose gradient of NAN_PARAM gets a NaN
  out         where rank 0 writes its results (JSON)

Results: the pre-clip norm of the unscaled gradients at each step, as a
probe callback ahead of trainwatch's computes it with torch; each step's
micro-batch losses; whether weights and AdamW's state were bit-identical
across bad_step.
"""


import lightning
import torch
from lightning.pytorch.plugins import MixedPrecision

import trainer_job

VOCAB, SEQ, MICRO = 64, 16, 4
NAN_PARAM = "body.2.weight"
RULES = {"warmup_steps": 30, "warmup_min_records": 20, "warmup_min_grad_samples": 20,
         "logz_rise": 50.0}  # short warm-ups for a short job (see hf_trainer.py)


class Counting(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        start, k = (i * 7) % VOCAB, 1 + i % 3
        ids = torch.tensor([(start + k * t) % VOCAB for t in range(SEQ)])
        return {"input_ids": ids, "trainwatch_shards": 1000 + i}


class Model(lightning.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                        torch.nn.Linear(64, VOCAB))
        self.losses = {}  # step -> its micro-batches' losses
        self.gen = torch.Generator().manual_seed(7)

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        if self.global_step == self.cfg.get("bad_step") and self.global_rank == 0:
            ids = torch.randint(0, VOCAB, ids.shape, generator=self.gen)
        # Each position sees itself and the token before it.
        x = self.embed(ids)
        x = torch.cat([x[:, 1:-1], x[:, :-2]], dim=-1)
        logits = self.body(x)
        labels = ids[:, 2:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                                 labels.reshape(-1))
        self.losses.setdefault(self.global_step, []).append(loss.item())
        return {"loss": loss, "logits": logits, "labels": labels}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01,
                                 fused=bool(self.cfg.get("fused")))


class Probe(lightning.Callback):
    """The oracle: torch's norm of the unscaled gradients, and weights and
    AdamW's state around bad_step. Ahead of trainwatch in the callback list,
    so it sees the gradients before a skip drops them."""

    def __init__(self, bad_step):
        self.bad_step, self.norms, self.scales, self.before, self.same = bad_step, {}, {}, None, None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            self.scales[trainer.global_step] = float(scaler.get_scale())
            if getattr(optimizer, "_step_supports_amp_scaling", False):
                norm /= float(scaler.get_scale())  # a fused optimizer unscales in its step
        self.norms[trainer.global_step] = norm

    def _state(self, trainer, pl_module):
        opt = trainer.optimizers[0]
        return ({n: p.detach().clone() for n, p in pl_module.named_parameters()},
                [{k: v.clone() for k, v in s.items()} for s in opt.state.values()])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.bad_step and self.before is None:
            self.before = self._state(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.bad_step + 1 and self.same is None:
            (w0, s0), (w1, s1) = self.before, self._state(trainer, pl_module)
            self.same = {"weights": all(torch.equal(w0[n], w1[n]) for n in w0),
                         "optimizer_state": len(s0) == len(s1) and all(
                             torch.equal(a[k], b[k]) for a, b in zip(s0, s1) for k in a)}


def main(cfg):
    torch.manual_seed(0)
    model = Model(cfg)
    accum, devices = cfg.get("accum", 2), cfg.get("devices", 1)
    probe = Probe(cfg.get("bad_step", -1))
    callbacks = [probe]
    if cfg.get("watch"):
        from trainwatch.integrations.lightning import TrainwatchCallback
        callbacks.append(TrainwatchCallback(server=cfg.get("server", ""), run_id=cfg["run_id"],
                                            rules=RULES))
    plugins = []
    if cfg.get("fp16"):
        plugins.append(MixedPrecision("16-mixed", "cpu",
                                      scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 30)))
    nan_step = cfg.get("nan_step")
    if nan_step is not None:
        def poison(grad):
            if model.global_step == nan_step:
                grad = grad.clone()
                grad[3, 5] = float("nan")
            return grad
        dict(model.named_parameters())[NAN_PARAM].register_hook(poison)
    trainer = lightning.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_steps=cfg["steps"], accumulate_grad_batches=accum,
        gradient_clip_val=cfg.get("clip", 1.0) or None,
        plugins=plugins, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    loader = torch.utils.data.DataLoader(Counting(MICRO * accum * cfg["steps"] * devices),
                                         batch_size=MICRO, shuffle=False)
    result = {"lightning": lightning.__version__, "torch": torch.__version__}
    try:
        trainer.fit(model, loader)
    finally:
        result.update(norms=probe.norms, scales=probe.scales, losses=model.losses,
                      skip_snapshot=probe.same, global_step=trainer.global_step)
        trainer_job.write_results(cfg["out"], trainer.global_rank, result)


if __name__ == "__main__":
    trainer_job.run(main)
