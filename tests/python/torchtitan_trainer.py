"""A torchtitan job for test_torchtitan.py: torchtitan 0.3's real Trainer
with its smallest model, llama3 "debugmodel", on the CPU over gloo, a
tokenizer and a text dataset made here (nothing downloaded), configured by
torchtitan's own command line (flags() below). Run under
torch.distributed.run with one JSON argument, either of two ways:

- built here (config.build(), trainer.train()), trainwatch attached with
  integrations.torchtitan.watch() when "watch" is set;
- torchtitan's own training entry point: the JSON argument is followed by
  torchtitan's command line, and torchtitan.train runs as `python -m
  torchtitan.train` would (runpy), this file only patching from outside.

The JSON argument:

  work        a folder (the tokenizer, the data, torchtitan's outputs)
  steps       training steps; accum: gradient accumulation steps
  dp_shard, tp  FSDP2 and tensor-parallel degrees
  watch, server, run_id  attach trainwatch (integrations.torchtitan.watch)
  bad_step    the step whose micro-batches are random tokens (every rank's)
  nan_step, nan_rank  a NaN in one element of NAN_PARAM's gradient shard
              on that rank, after the step's last backward
  out         where rank 0 writes its results (JSON): torchtitan's own
              logged loss and grad_norm per step (metrics_processor.log)

torchtitan picks its device as `torch._utils._get_available_device_type()
or "cuda"`, so on a machine without a GPU it asks for CUDA. The patches
below, all from outside (module and class attributes, no installed file
changed), make it run on the CPU:
1. device_type "cpu" in every torchtitan module that copied it at import,
   and a CPU stand-in for torch.cuda as device_module (set_device, memory
   statistics for its memory monitor, an int device id for barriers);
2. training.disable_cuda_graphs;
3. torch's flex_attention has no backward on the CPU ("FlexAttention does
   not support backward on CPU"), and llama3 accepts no other masked
   attention there: its kernel is replaced by SDPA on the dense mask of the
   same mask_mod (torchtitan's per-document causal mask);
4. gloo has no PREMUL_SUM, which FSDP2 uses for torchtitan's gradient divide
   factor of 1.0: set_force_sum_reduction_for_comms(True) makes it a SUM of
   the same gradients (torchtitan's symmetric-memory option sets it too).
"""

import json
import os
import random
import runpy
import sys
import time
import types

import torch

import trainer_job

VOCAB_TEXT = 512
NAN_PARAM = "layers.1.feed_forward.w1.weight"
RULES = {"warmup_steps": 15, "warmup_min_records": 12, "warmup_min_grad_samples": 12,
         "logz_rise": 50.0}  # short warm-ups for a short job (see hf_trainer.py)
WORDS = ("the a one some every small large red blue green cat dog bird fish horse tree river "
         "stone house city road king queen child runs jumps sees eats likes finds builds makes "
         "takes over under near into from with and but so then").split()


def make_assets(work, rank):
    """Rank 0 trains a byte-level BPE tokenizer and writes a jsonl dataset of
    sentences with a little grammar, which torchtitan's "c4_test" loader
    reads from dataloader.dataset_path; the other ranks wait for it."""
    tok_dir, data_dir = os.path.join(work, "tokenizer"), os.path.join(work, "data")
    ready = os.path.join(work, "assets-ready")
    if rank == 0 and not os.path.exists(ready):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        os.makedirs(tok_dir, exist_ok=True)
        os.makedirs(data_dir, exist_ok=True)
        rng = random.Random(1234)
        docs = []
        for _ in range(3000):
            sentences = []
            for _ in range(rng.randint(2, 8)):
                words = [rng.choice(WORDS[:10]), rng.choice(WORDS[10:24]),
                         rng.choice(WORDS[24:32]), rng.choice(WORDS[:10]),
                         rng.choice(WORDS[10:24])] + rng.sample(WORDS, rng.randint(0, 5))
                sentences.append(" ".join(words).capitalize() + ".")
            docs.append(" ".join(sentences))
        with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
        bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(docs, trainer=trainers.BpeTrainer(
            vocab_size=VOCAB_TEXT, special_tokens=[bos, eos],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(os.path.join(tok_dir, "tokenizer.json"))
        with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": bos, "eos_token": eos, "add_bos_token": True,
                       "add_eos_token": True}, f)
        open(ready, "w").close()
    while not os.path.exists(ready):
        time.sleep(0.1)
    return tok_dir, data_dir


class CpuDevice(types.ModuleType):
    """torch.cuda's part that torchtitan calls, for the CPU (patch 1)."""

    def __init__(self):
        super().__init__("cpu_device")

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def current_device(self):
        return 0

    def set_device(self, device):
        pass

    def device_count(self):
        return 1

    def synchronize(self, device=None):
        pass

    def empty_cache(self):
        pass

    def reset_peak_memory_stats(self, device=None):
        pass

    def get_device_name(self, device=None):
        return "cpu"

    def get_device_properties(self, device=None):
        return types.SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE")
                                     * os.sysconf("SC_PHYS_PAGES"), name="cpu")

    def memory_stats(self, device=None):
        return {"active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0,
                "num_alloc_retries": 0, "num_ooms": 0}


def patch_for_cpu():
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxOutput, create_block_mask, create_mask

    import torchtitan.models.common.attention as attention
    import torchtitan.trainer  # noqa: F401  (imports the modules patched below)
    device = CpuDevice()
    for name, module in list(sys.modules.items()):  # patch 1
        if name.startswith("torchtitan") and module is not None:
            if getattr(module, "device_type", None) == "cuda":
                module.device_type = "cpu"
            if getattr(module, "device_module", None) is torch.cuda:
                module.device_module = device

    def dense_flex_attention(q, k, v, *, score_mod=None, block_mask=None, scale=None,
                             enable_gqa=False, return_aux=None, kernel_options=None):  # patch 3
        assert score_mod is None and (return_aux is None or not return_aux.lse)
        mask = None if block_mask is None else create_mask(
            block_mask.mask_mod, q.size(0), 1, q.size(-2), k.size(-2), device=q.device)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                               enable_gqa=enable_gqa), AuxOutput(lse=None))

    attention.FlexAttention._compiled_flex_attn = staticmethod(dense_flex_attention)
    attention._compiled_create_block_mask = create_block_mask  # no inductor build: faster


def flags(cfg):
    """torchtitan's command line for the job cfg describes."""
    dp = cfg.get("dp_shard", 1)
    return ["--module", "llama3", "--config", "llama3_debugmodel",
            "--hf-assets-path", os.path.join(cfg["work"], "tokenizer"),
            "--dump-folder", os.path.join(cfg["work"], "outputs"),
            "--dataloader.dataset", "c4_test",
            "--dataloader.dataset-path", os.path.join(cfg["work"], "data"),
            "--training.steps", str(cfg["steps"]), "--training.seq-len", "64",
            "--training.local-batch-size", "2",
            "--training.global-batch-size", str(2 * dp * cfg.get("accum", 1)),
            "--training.disable-cuda-graphs",  # patch 2
            "--training.mixed-precision-param", "float32",
            "--parallelism.data-parallel-shard-degree", str(dp),
            "--parallelism.tensor-parallel-degree", str(cfg.get("tp", 1)),
            "--optimizer.param-groups.0.optimizer-kwargs.lr", "2e-3",
            "--lr-scheduler.warmup-steps", "2", "--checkpoint.no-enable",
            "--validator.no-enable", "--metrics.log-freq", "1", "--debug.seed", "0",
            "activation-checkpoint:none"]


def prepare(cfg, rank):
    """The assets, and the CPU patches on the modules the llama3 job uses."""
    make_assets(cfg["work"], rank)
    import torchtitan.models.llama3.config_registry  # noqa: F401
    patch_for_cpu()


def force_sum_reduction(trainer):  # patch 4
    from torch.distributed.fsdp import FSDPModule
    for part in trainer.model_parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)


def build(cfg, rank):
    """The job's Trainer, built here from torchtitan's command line."""
    from torchtitan.config import ConfigManager
    prepare(cfg, rank)
    trainer = ConfigManager().parse_args(flags(cfg)).build()
    force_sum_reduction(trainer)
    return trainer


def instrument(trainer, cfg, rank, logged):
    """The injections, and torchtitan's own logged numbers recorded in
    `logged`."""
    log = trainer.metrics_processor.log

    def record(step, loss, max_loss, grad_norm, *args, **kwargs):  # torchtitan's own numbers
        logged[step] = {"loss": float(loss), "grad_norm": float(grad_norm)}
        return log(step, loss, max_loss, grad_norm, *args, **kwargs)

    trainer.metrics_processor.log = record
    fwd_bwd = trainer.forward_backward_step
    gen = torch.Generator().manual_seed(rank)
    micro = {"n": 0}

    def injected(*, input_dict, labels, **kwargs):
        if trainer.step == cfg.get("bad_step"):  # a corrupted shard: random tokens
            input_dict = dict(input_dict, input=torch.randint(
                0, VOCAB_TEXT, input_dict["input"].shape, generator=gen))
            labels = torch.randint(0, VOCAB_TEXT, labels.shape, generator=gen)
        loss = fwd_bwd(input_dict=input_dict, labels=labels, **kwargs)
        micro["n"] += 1
        if trainer.step == cfg.get("nan_step") and rank == cfg.get("nan_rank", 0) and \
                micro["n"] % trainer.gradient_accumulation_steps == 0:
            grad = dict(trainer.model_parts[0].named_parameters())[NAN_PARAM].grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[7] = float("nan")
        return loss

    trainer.forward_backward_step = injected


def main(cfg, titan_args):
    import torchtitan
    rank = int(os.environ["RANK"])
    result = {"torchtitan": getattr(torchtitan, "__version__", "?"), "torch": torch.__version__}
    logged, trainers = {}, []
    try:
        if titan_args:  # torchtitan's entry point builds the Trainer
            from torchtitan.trainer import Trainer
            prepare(cfg, rank)
            init = Trainer.__init__

            def test_init(trainer, *args, **kwargs):
                init(trainer, *args, **kwargs)
                force_sum_reduction(trainer)
                instrument(trainer, cfg, rank, logged)
                trainers.append(trainer)
            Trainer.__init__ = test_init
            sys.argv = ["torchtitan.train", *titan_args]
            runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
        else:
            trainers.append(build(cfg, rank))
            instrument(trainers[0], cfg, rank, logged)
            if cfg.get("watch"):
                from trainwatch.integrations.torchtitan import watch
                watch(trainers[0], server=cfg["server"], run_id=cfg["run_id"], rules=RULES)
            trainers[0].train()
    finally:
        result.update(logged=logged, step=trainers[0].step if trainers else None)
        trainer_job.write_results(cfg["out"], rank, result)


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      HF_HOME=os.path.join(config["work"], "hf"))
    trainer_job.run(lambda cfg: main(cfg, sys.argv[2:]), config)
