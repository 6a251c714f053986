// The Python frameworks' console logs and exports (Hugging Face Trainer's
// stdout and trainer_state.json, torchtitan, Composer, NeMo 1 and 2, Lightning's
// metrics.csv): each reader on an excerpt (tests/data/formats, see its
// README: real where one was found, else written from the framework's
// source and marked so), its detection, its malformed lines, and damaged
// input, which must give a clear error or a trace, never a crash.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"
#include "logs/excerpts.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

absl::StatusOr<Trace> Parse(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto,
                            int64_t logging_steps = 0) {
  ReadOptions o;
  o.format = f;
  o.logging_steps = logging_steps;
  return ParseMetrics(content, "run.log", o);
}

std::string ErrorOf(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto,
                    int64_t logging_steps = 0) {
  auto t = Parse(content, f, logging_steps);
  REQUIRE_FALSE(t.ok());
  return std::string(t.status().message());
}

int64_t HaltedAt(const Trace& t) {
  auto r = Replay(t, core::RuleConfig());
  REQUIRE(r.ok());
  return r->halted_at;
}

// The replay's event at `step` of `tier`, which must exist.
core::Event EventAt(const Trace& t, int64_t step, int tier) {
  auto r = Replay(t, core::RuleConfig());
  REQUIRE(r.ok());
  auto it = std::find_if(r->events.begin(), r->events.end(),
                         [&](const core::Event& e) { return e.step == step && e.tier == tier; });
  REQUIRE(it != r->events.end());
  return *it;
}

TEST_CASE("Hugging Face Trainer: the bar before a dict gives its step and DeepSpeed's lines are read too",
          "[logs][formats][hf]") {
  // ymcui/Chinese-LLaMA-Alpaca#534: bars 377-382, a loss at 380, overflows.
  auto t = Parse(Excerpt("hf-deepspeed-min-scale.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kHfTrainer);
  REQUIRE(t->size() == 6);
  // The overflow printed after bar 378 is step 379's.
  CHECK(t->Record(0).step == 379);
  CHECK(t->Record(0).loss_scale() == 64);
  // Step 380 overflowed and logged its loss: one record.
  CHECK(t->Record(1).step == 380);
  CHECK(t->Record(1).Get(Signal::kLoss) == 2.0491);
  CHECK(t->Record(1).Get(Signal::kLearningRate) == 0.0001961913563176343);
  CHECK(t->Record(1).loss_scale() == 32);
  CHECK(t->Record(5).step == 384);
  CHECK(t->Record(5).loss_scale() == 0);
  CHECK(HaltedAt(*t) == 384);
}

TEST_CASE("Hugging Face Trainer: without bars --logging-steps places the dicts",
          "[logs][formats][hf]") {
  // AnswerDotAI/ModernBERT#233: 'grad_norm': nan from the first line shown.
  const std::string log = Excerpt("hf-modernbert-grad-norm-nan.log");
  CHECK(ErrorOf(log) ==
        "run.log:1:1: a Hugging Face Trainer loss line with no progress bar in the log: its "
        "step is unknown; give --logging-steps N (the run's logging_steps)");
  auto t = Parse(log, MetricsFormat::kAuto, 10);
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kHfTrainer);
  REQUIRE(t->size() == 3);
  CHECK(t->Record(0).step == 10);
  CHECK(t->Record(2).step == 30);
  CHECK(t->Record(0).Get(Signal::kLoss) == 0.2051);
  CHECK(std::isnan(t->Record(0).Get(Signal::kGradNorm)));
  CHECK(HaltedAt(*t) == 10);  // a written nan is a tier 3 signal
}

TEST_CASE("Hugging Face Trainer: bars sharing lines and string values with eval and summary dicts",
          "[logs][formats][hf]") {
  // Written from transformers' ProgressCallback: tqdm.write clears the bar
  // with '\r', prints the dict, draws the bar again; transformers 5 prints
  // floats as f"{v:.4g}" strings. An eval bar (another total) is not the
  // training bar.
  auto t = Parse(
      " 0%|          | 0/100 [00:00<?, ?it/s]\r 5%|▌         | 5/100 [00:05<01:35, 1.00it/s]"
      "\r                                   \r{'loss': '2.31', 'grad_norm': '1.5', "
      "'learning_rate': '4.5e-05', 'epoch': '0.05'}\n"
      " 5%|▌         | 5/100 [00:05<01:35, 1.00it/s]\r 40%|████      | 4/10 [00:01<00:01, "
      "4it/s]\r{'eval_loss': 2.2, 'eval_runtime': 1.0, 'epoch': 0.05}\n"
      "\r 10%|█         | 10/100 [00:10<01:30, 1.00it/s]{'loss': 2.1, 'grad_norm': "
      "tensor(1.25, device='cuda:0'), 'learning_rate': 4e-05, 'epoch': 0.1}\n"
      "{'train_runtime': 12.5, 'train_samples_per_second': 8.0, 'train_loss': 2.2, "
      "'epoch': 0.1}\n");
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kHfTrainer);
  REQUIRE(t->size() == 2);
  CHECK(t->Record(0).step == 5);
  CHECK(t->Record(0).Get(Signal::kLoss) == 2.31);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 4.5e-05);
  CHECK(t->Record(1).step == 10);
  CHECK(t->Record(1).Get(Signal::kGradNorm) == 1.25);

  SECTION("a bar that has not moved since the last dict: the redraw after says") {
    auto lag = Parse(
        " 1%|          | 1/100 [00:00<00:01]\n{'loss': 2.5}\n 2%|          | 2/100 [00:00<00:01]\n"
        "{'loss': 2.4}\n 3%|          | 3/100 [00:00<00:01]\n");
    REQUIRE(lag.ok());
    REQUIRE(lag->size() == 2);
    CHECK(lag->Record(0).step == 1);
    CHECK(lag->Record(1).step == 2);
    auto stale = Parse(
        " 1%|          | 1/100 [00:00<00:01]\n{'loss': 2.5}\n{'loss': 2.4}\n"
        " 3%|          | 3/100 [00:00<00:01]\n");
    REQUIRE(stale.ok());
    REQUIRE(stale->size() == 2);
    CHECK(stale->Record(1).step == 3);
  }
  SECTION("a printed config dict first is not JSON lines") {
    auto cfg = Parse(
        "{'model_name_or_path': 'gpt2', 'learning_rate': 5e-05}\n 1%|  | 1/100 [00:01<00:10]\n"
        "{'loss': 3.5, 'learning_rate': 5e-05, 'epoch': 0.01}\n");
    REQUIRE(cfg.ok());
    CHECK(cfg->format() == MetricsFormat::kHfTrainer);
    REQUIRE(cfg->size() == 1);
    CHECK(cfg->Record(0).step == 1);
  }
  SECTION("JSON lines still start with {\"") {
    auto j =
        Parse("{\"step\": 1, \"loss\": 2.0, \"grad_norm\": 1, \"log_z\": 0, \"nan_frac\": 0}\n");
    REQUIRE(j.ok());
    CHECK(j->format() == MetricsFormat::kJsonLines);
  }
}

TEST_CASE("Hugging Face Trainer: malformed values name line and column", "[logs][formats][hf]") {
  CHECK(ErrorOf(" 1%|  | 1/100 [00:01<00:10]\n{'loss': 'abc', 'epoch': 0.01}\n") ==
        "run.log:2:10: loss \"'abc'\" is not a number");
  CHECK(ErrorOf("{'loss': 1.0, 'grad_norm': 1.x}\n", MetricsFormat::kHfTrainer, 5) ==
        "run.log:1:28: grad_norm \"1.x\" is not a number");
  CHECK(ErrorOf("{'eval_loss': 1.0}\n", MetricsFormat::kHfTrainer, 5) ==
        "run.log:1:1: no Hugging Face Trainer \"{'loss': ...}\" lines: nothing to replay");
}

TEST_CASE("Hugging Face trainer_state.json: log_history's train entries",
          "[logs][formats][hf-state]") {
  auto t = Parse(Excerpt("hf-trainer-state-from-source.json"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kHfTrainerState);
  REQUIRE(t->size() == 3);  // the eval entry at 20 is read past
  CHECK(t->Record(0).step == 10);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 1.8359375);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 1.9e-05);
  CHECK(t->Record(1).Get(Signal::kLoss) == 2.0781);
  CHECK(std::isnan(t->Record(2).Get(Signal::kGradNorm)));
  CHECK(HaltedAt(*t) == 30);
  CHECK(ErrorOf("{\n  \"log_history\": [\n    {\"loss\": \"x\", \"step\": 1}\n  ]\n}\n") ==
        "run.log:3:14: loss \"x\" is not a number");
  CHECK(ErrorOf("{\n  \"log_history\": [\n    {\"loss\": 1.0, \"step\": 1}\n",
                MetricsFormat::kHfTrainerState)
            .find("run.log:") == 0);
}

TEST_CASE("Hugging Face trainer_state.json: real files from model repositories",
          "[logs][formats][hf-state]") {
  // philschmid's bart-large-cnn-samsum (rnpcs/philschmid-bart-large-cnn-samsum),
  // whole: an older Trainer's file, no grad_norm, one log and the summary.
  auto bart = Parse(Excerpt("hf-trainer-state-bart-samsum.json"));
  REQUIRE(bart.ok());
  CHECK(bart->format() == MetricsFormat::kHfTrainerState);
  REQUIRE(bart->size() == 1);  // the summary entry at 693 has no loss
  CHECK(bart->Record(0).step == 500);
  CHECK(bart->Record(0).Get(Signal::kLoss) == 1.2342);
  CHECK(bart->Record(0).Get(Signal::kLearningRate) == 1.3924963924963927e-05);
  CHECK_FALSE(bart->Record(0).Has(Signal::kGradNorm));
  CHECK(HaltedAt(*bart) == -1);
  // P4P4N1CK/whisper-large-v2-japanese-5k-steps, trimmed: eval entries
  // (eval_wer) at 1000 and 5000 and the summary (train_loss) read past.
  auto whisper = Parse(Excerpt("hf-trainer-state-whisper-ja.json"));
  REQUIRE(whisper.ok());
  CHECK(whisper->format() == MetricsFormat::kHfTrainerState);
  REQUIRE(whisper->size() == 6);
  const int64_t steps[] = {950, 975, 1000, 1025, 1050, 5000};
  for (size_t i = 0; i < 6; ++i) CHECK(whisper->Record(i).step == steps[i]);
  CHECK(whisper->Record(2).Get(Signal::kLoss) == 0.0111);
  CHECK(whisper->Record(3).Get(Signal::kLoss) == 0.01);
  CHECK(whisper->Record(5).Get(Signal::kLoss) == 0.0002);
  CHECK(whisper->Record(5).Get(Signal::kLearningRate) == 8.88888888888889e-09);
  CHECK(HaltedAt(*whisper) == -1);
}

TEST_CASE("Hugging Face trainer_state.json: an output folder is read through its newest",
          "[logs][formats][hf-state]") {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("tw-hf-output-" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out / "checkpoint-10");
  fs::create_directories(out / "checkpoint-30");
  const std::string full = Excerpt("hf-trainer-state-from-source.json");
  std::ofstream(out / "checkpoint-30" / "trainer_state.json") << full;
  std::ofstream(out / "checkpoint-10" / "trainer_state.json") << "{\"log_history\": []}\n";
  // checkpoint-10's is older, whatever the order the writes landed in.
  fs::last_write_time(
      out / "checkpoint-10" / "trainer_state.json",
      fs::last_write_time(out / "checkpoint-30" / "trainer_state.json") - std::chrono::seconds(60));
  ReadOptions o;
  o.format = MetricsFormat::kHfTrainerState;
  auto t = ReadMetricsFile(out.string(), o);
  REQUIRE(t.ok());
  CHECK(t->size() == 3);
  // Without the format a folder is TensorBoard's.
  CHECK_FALSE(ReadMetricsFile(out.string()).ok());
  fs::remove_all(out);
}

TEST_CASE("torchtitan: rank 0's step lines with colours and other ranks read past",
          "[logs][formats][torchtitan]") {
  // pytorch/torchtitan#3393: the current shape, with torchrun's [rank0]:.
  auto t = Parse(Excerpt("torchtitan-rank0.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kTorchTitan);
  REQUIRE(t->size() == 8);
  CHECK(t->Record(0).step == 14);
  CHECK(t->Record(0).Get(Signal::kLoss) == 3.24405);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 0.8319);
  CHECK(t->Record(7).step == 21);
  // pytorch/torchtitan#1287: the older shape, no grad_norm, 4 decimals,
  // between the GC and profiler lines.
  auto older = Parse(Excerpt("torchtitan-older-no-grad-norm.log"));
  REQUIRE(older.ok());
  CHECK(older->format() == MetricsFormat::kTorchTitan);
  REQUIRE(older->size() == 6);
  CHECK(older->Record(0).step == 200);
  CHECK(older->Record(5).Get(Signal::kLoss) == 5.8383);
  CHECK_FALSE(older->Record(0).Has(Signal::kGradNorm));
  // pytorch/torchtitan#2389: every rank's line, no prefix: one record a step.
  auto every = Parse(Excerpt("torchtitan-every-rank.log"));
  REQUIRE(every.ok());
  CHECK(every->format() == MetricsFormat::kTorchTitan);
  REQUIRE(every->size() == 2);
  CHECK(every->Record(1).step == 5);
  CHECK(every->Record(1).Get(Signal::kGradNorm) == 46.5);
  // Written from metrics.py's f-string: ANSI colours; an older release's
  // line (wps, no grad_norm); another rank; a validation line.
  auto colored = Parse(
      "[rank0]:[titan] 2025-01-01 12:00:00,000 - root - INFO - \x1b[31mstep:  1  "
      "\x1b[32mloss: 10.8750  \x1b[33mmemory: 12.34GiB(15.00%)  \x1b[34mwps: 1,234  "
      "\x1b[35mmfu: 1.23%\x1b[39m\n"
      "[rank1]:[titan] 2025-01-01 12:00:00,000 - root - INFO - \x1b[31mstep:  2  "
      "\x1b[32mloss:  9.0000  \x1b[38;2;180;60;0mgrad_norm:  1.0000\n"
      "[rank0]:[titan] 2025-01-01 12:00:01,000 - root - INFO - \x1b[33mvalidate step:  2  "
      "\x1b[32mloss:  9.5000  \x1b[33mmemory: 12.34GiB(15.00%)\x1b[39m\n"
      "[rank0]:[titan] 2025-01-01 12:00:02,000 - root - INFO - \x1b[31mstep:  2  "
      "\x1b[32mloss:     nan  \x1b[38;2;180;60;0mgrad_norm:     nan  \x1b[33mmemory: "
      "12.34GiB(15.00%)\x1b[39m\n");
  REQUIRE(colored.ok());
  CHECK(colored->format() == MetricsFormat::kTorchTitan);
  REQUIRE(colored->size() == 2);
  CHECK(colored->Record(0).Get(Signal::kLoss) == 10.875);
  CHECK_FALSE(colored->Record(0).Has(Signal::kGradNorm));
  CHECK(std::isnan(colored->Record(1).Get(Signal::kLoss)));
  CHECK(HaltedAt(*colored) == 2);
  // The column is the raw line's, colour codes counted.
  CHECK(ErrorOf("[titan] - root - INFO - \x1b[31mstep: 3  \x1b[32mloss: 7.x  memory: 1GiB\n") ==
        "run.log:1:50: loss \"7.x\" is not a number");
}

TEST_CASE("Composer: a ConsoleLogger block is one record at its batch",
          "[logs][formats][composer]") {
  auto t = Parse(Excerpt("composer-console-from-source.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kComposer);
  REQUIRE(t->size() == 3);  // the eval blocks are read past
  CHECK(t->Record(0).step == 1);
  CHECK(t->Record(0).Get(Signal::kLoss) == 11.0312);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 4.125);
  CHECK(t->Record(1).Get(Signal::kLearningRate) == 0.0001);
  CHECK(t->Record(2).step == 3);
  CHECK(std::isnan(t->Record(2).Get(Signal::kLoss)));
  CHECK(HaltedAt(*t) == 3);
  // princeton-nlp/LLM-Shearing#15: a real header and its Train lines, cut
  // before the loss: detected, and nothing to replay.
  const std::string real = Excerpt("composer-llm-shearing-header.log");
  CHECK(ErrorOf(real) ==
        "run.log:1:1: no Composer \"[batch=N/M]:\" blocks with Train lines: nothing to replay");
  // Helios113/dyna: tab-indented blocks of a Composer 0.31 run, W&B
  // objects as values, per-layer norms, then the global one.
  auto dyna = Parse(Excerpt("composer-dyna-console.log"));
  REQUIRE(dyna.ok());
  CHECK(dyna->format() == MetricsFormat::kComposer);
  REQUIRE(dyna->size() == 2);
  CHECK(dyna->Record(0).step == 1);
  CHECK(dyna->Record(0).Get(Signal::kLoss) == 0.0053);
  CHECK(dyna->Record(0).Get(Signal::kLearningRate) == 0);
  CHECK_FALSE(dyna->Record(0).Has(Signal::kGradNorm));  // OptimizerMonitor: not at batch 1
  CHECK(dyna->Record(1).step == 10);
  CHECK(dyna->Record(1).Get(Signal::kLoss) == 0.0053);
  CHECK(dyna->Record(1).Get(Signal::kGradNorm) == 0.003);  // l2_norm/grad/global
  CHECK(HaltedAt(*dyna) == -1);
  // mosaicml/llm-foundry's scripts/train/README.md: an older console, its
  // tabs shown as spaces, no grad norm.
  auto foundry = Parse(Excerpt("composer-llm-foundry-readme.log"));
  REQUIRE(foundry.ok());
  CHECK(foundry->format() == MetricsFormat::kComposer);
  REQUIRE(foundry->size() == 4);
  CHECK(foundry->Record(0).step == 1);
  CHECK(foundry->Record(0).Get(Signal::kLoss) == 10.9736);
  CHECK(foundry->Record(3).step == 4);
  CHECK(foundry->Record(3).Get(Signal::kLoss) == 10.6459);
  CHECK_FALSE(foundry->Record(3).Has(Signal::kGradNorm));
  CHECK(HaltedAt(*foundry) == -1);
  // [epoch=E][batch=B/T]: B counts within the epoch.
  auto epochs = Parse("[epoch=2][batch=3/10]:\n\t Train loss/train/total: 1.5\n");
  REQUIRE(epochs.ok());
  CHECK(epochs->format() == MetricsFormat::kComposer);
  REQUIRE(epochs->size() == 1);
  CHECK(epochs->Record(0).step == 13);
  auto tokens =
      Parse("[token=4096/100000]:\n\t Train time/batch: 7\n\t Train loss/train/total: 1\n");
  REQUIRE(tokens.ok());
  CHECK(tokens->Record(0).step == 8);
  CHECK(ErrorOf("[batch=1/10]:\n\t Train loss/train/total: 1.2.3\n") ==
        "run.log:2:27: loss/train/total \"1.2.3\" is not a number");
}

TEST_CASE("NeMo 2: Training epoch lines at their global_step", "[logs][formats][nemo]") {
  // NVIDIA-BioNeMo/bionemo-recipes#740.
  auto t = Parse(Excerpt("nemo2-training-epoch.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kNemo);
  REQUIRE(t->size() == 6);
  CHECK(t->Record(0).step == 120);
  CHECK(t->Record(0).Get(Signal::kLoss) == 1.233);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 3e-05);
  CHECK_FALSE(t->Record(0).Has(Signal::kGradNorm));
  CHECK(t->Record(5).step == 125);
  CHECK(HaltedAt(*t) == -1);
  CHECK(ErrorOf("Training epoch 0, iteration 1/9 | lr: 1e-4 | global_step: 1 | "
                "reduced_train_loss: 7.x |\n") ==
        "run.log:1:83: reduced_train_loss \"7.x\" is not a number");
  auto nan = Parse(
      "Training epoch 0, iteration 1/9 | lr: 1e-4 | global_step: 1 | "
      "reduced_train_loss: nan | train_step_timing in s: 0.1\n");
  REQUIRE(nan.ok());
  CHECK(HaltedAt(*nan) == 1);
}

TEST_CASE("NeMo 1: Lightning's progress bar gives one record per step it shows",
          "[logs][formats][nemo]") {
  // NVIDIA/NeMo-Framework-Launcher#55: global_step one behind the bar's N.
  auto t = Parse(Excerpt("nemo1-progress-bar.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kNemo);
  REQUIRE(t->size() == 1);
  CHECK(t->Record(0).step == 794);
  CHECK(t->Record(0).Get(Signal::kLoss) == 3.09);
  // NVIDIA/NeMo#7957 (NVIDIA-NeMo/Speech in the index): "nan.0", and a
  // global_step shortened to "9e+3"; the checkpoint line is read past.
  auto nan = Parse(Excerpt("nemo1-nan-progress-bar.log"));
  REQUIRE(nan.ok());
  REQUIRE(nan->size() == 1);
  CHECK(nan->Record(0).step == 9000);
  CHECK(std::isnan(nan->Record(0).Get(Signal::kLoss)));
  CHECK(HaltedAt(*nan) == 9000);
  // Redraws joined by '\r': a record per new step; past 999 the shortened
  // global_step is read through the bar's N and the offset an exact one
  // showed; a new epoch's bar (N from 1 again) takes the shortened figure.
  auto bars = Parse(
      "Epoch 0:  1%|   | 999/2000 [00:10<00:10, v_num=1, reduced_train_loss=3.100, "
      "global_step=998.0]\rEpoch 0:  1%|   | 999/2000 [00:10<00:10, v_num=1, "
      "reduced_train_loss=3.100, global_step=998.0]\rEpoch 0:  1%|   | 1001/2000 [00:10<00:10, "
      "v_num=1, reduced_train_loss=3.000, global_step=1e+3]\r\n"
      "Epoch 1:  0%|   | 5/2000 [00:10<00:10, v_num=1, reduced_train_loss=2.900, "
      "global_step=2e+3]\n");
  REQUIRE(bars.ok());
  REQUIRE(bars->size() == 3);
  CHECK(bars->Record(0).step == 998);
  CHECK(bars->Record(1).step == 1000);
  CHECK(bars->Record(2).step == 2000);  // the shortened figure: no exact one since the epoch
  CHECK(ErrorOf("Epoch 0:  1%|   | 9/20 [00:10<00:10, reduced_train_loss=x, global_step=8.0]\n") ==
        "run.log:1:57: reduced_train_loss \"x\" is not a number");
}

TEST_CASE("Lightning's metrics.csv is a wandb-csv: train rows read and val rows read past",
          "[logs][formats][lightning]") {
  auto t = Parse(Excerpt("lightning-metrics-from-source.csv"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kGenericCsv);
  REQUIRE(t->size() == 4);
  CHECK(t->Record(0).step == 49);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 1.2345);
  CHECK(t->Record(0).Get(Signal::kLoss) == 0.6931);
  CHECK(HaltedAt(*t) == 199);
  // HySonLab/ArcRoute's lightning_logs/version_0, epochs 10-12: an RL
  // loss (train/loss) with a spike at 6249, a validation row per epoch.
  auto real = Parse(Excerpt("lightning-arcroute-metrics.csv"));
  REQUIRE(real.ok());
  CHECK(real->format() == MetricsFormat::kGenericCsv);
  REQUIRE(real->size() == 30);  // 33 rows, the val/reward rows at 5378, 5867, 6356 read past
  CHECK(real->Record(0).step == 4899);
  CHECK(real->Record(0).Get(Signal::kLoss) == 0.09683222323656082);
  CHECK(real->Record(23).Get(Signal::kLoss) == -0.11423496156930923);
  CHECK(real->Record(27).step == 6249);
  CHECK(real->Record(27).Get(Signal::kLoss) == 3668.494384765625);
  CHECK(real->Record(29).step == 6349);
  CHECK_FALSE(real->Record(0).Has(Signal::kGradNorm));
  // The spike skips its update (tier 1) and the run goes on.
  CHECK(EventAt(*real, 6249, 1).action == core::Action::kSkipUpdate);
  CHECK(HaltedAt(*real) == -1);
  auto both = Parse("epoch,step,train_loss_epoch,train_loss_step\n0,9,,2.5\n0,9,2.6,\n");
  REQUIRE(both.ok());
  REQUIRE(both->size() == 1);
  CHECK(both->Record(0).Get(Signal::kLoss) == 2.5);
}

TEST_CASE("format names: the frameworks' round-trip", "[logs][formats]") {
  for (MetricsFormat f :
       {MetricsFormat::kHfTrainer, MetricsFormat::kHfTrainerState, MetricsFormat::kTorchTitan,
        MetricsFormat::kComposer, MetricsFormat::kNemo}) {
    MetricsFormat back;
    REQUIRE(ParseFormatName(FormatName(f), &back));
    CHECK(back == f);
  }
}

// Damaged copies of every excerpt (excerpts.h).
TEST_CASE("the frameworks' readers never crash on damaged input", "[logs][formats][robustness]") {
  ReadOptions o;
  o.logging_steps = 5;
  CheckDamagedCopies(
      {"hf-deepspeed-min-scale.log", "hf-modernbert-grad-norm-nan.log",
       "hf-trainer-state-from-source.json", "torchtitan-rank0.log", "torchtitan-every-rank.log",
       "composer-console-from-source.log", "composer-llm-shearing-header.log",
       "nemo2-training-epoch.log", "lightning-metrics-from-source.csv",
       "hf-trainer-state-bart-samsum.json", "hf-trainer-state-whisper-ja.json",
       "composer-llm-foundry-readme.log", "lightning-arcroute-metrics.csv",
       "composer-dyna-console.log"},
      {MetricsFormat::kAuto, MetricsFormat::kHfTrainer, MetricsFormat::kHfTrainerState,
       MetricsFormat::kTorchTitan, MetricsFormat::kComposer, MetricsFormat::kNemo},
      o, 11, 7);
}

}  // namespace
}  // namespace trainwatch::logs
