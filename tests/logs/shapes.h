// Logs in the shapes trainers and loggers really write them, where records
// share a step or bars are sparse, written the way each writes them (its
// format string or its file layout, named at each), for the readers' tests
// and twctl follow's. The metric values are a smooth function of the step,
// so that a test can say which step a record came from.

#ifndef TRAINWATCH_TESTS_LOGS_SHAPES_H_
#define TRAINWATCH_TESTS_LOGS_SHAPES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace trainwatch::logs::shapes {

inline double Loss(int64_t step) { return 3.0 + 1.0 / (1.0 + 0.01 * static_cast<double>(step)); }
inline double GradNorm(int64_t step) { return 0.5 + 0.001 * static_cast<double>(step % 50); }

// A JSON-lines logger that writes one object per log call, a train call
// each `every` steps and an eval call each `eval_every`, both keyed by the
// step: {"step": 100, "train_loss": ...} then {"step": 100, "val_loss": ...}.
inline std::string JsonLinesTrainVal(int64_t steps, int64_t every, int64_t eval_every) {
  std::string out;
  char line[256];
  for (int64_t s = every; s <= steps; s += every) {
    std::snprintf(line, sizeof line,
                  "{\"step\": %lld, \"train_loss\": %.6f, \"train/grad_norm\": %.6f, "
                  "\"lr\": 0.0003}\n",
                  static_cast<long long>(s), Loss(s), GradNorm(s));
    out += line;
    if (s % eval_every == 0) {
      std::snprintf(line, sizeof line, "{\"step\": %lld, \"val_loss\": %.6f, \"val_ppl\": %.3f}\n",
                    static_cast<long long>(s), Loss(s) + 0.1, 20.0);
      out += line;
    }
  }
  return out;
}

// W&B's run history exported as CSV: one row per wandb.log call, a column
// per key, empty where the call did not log it. A trainer that logs the
// loss and the grad norm in separate calls at one step (commit=False, or
// step= given) exports two rows with the same _step.
inline std::string WandbHistoryCsv(int64_t steps) {
  std::string out = "_step,_runtime,train/loss,train/grad_norm,eval/loss\n";
  char line[256];
  for (int64_t s = 1; s <= steps; ++s) {
    std::snprintf(line, sizeof line, "%lld,%.1f,%.6f,,\n%lld,%.1f,,%.6f,\n",
                  static_cast<long long>(s), 1.5 * s, Loss(s), static_cast<long long>(s), 1.5 * s,
                  GradNorm(s));
    out += line;
    if (s % 100 == 0) {
      std::snprintf(line, sizeof line, "%lld,%.1f,,,%.6f\n", static_cast<long long>(s), 1.5 * s,
                    Loss(s) + 0.1);
      out += line;
    }
  }
  return out;
}

// Hugging Face Trainer's stdout and stderr in one file (python train.py >
// log 2>&1) with logging_steps 1: every dict (tqdm.write: stdout) comes,
// and the bar's redraws (stderr, '\r', no newline) reach the file only
// every `bar_every` steps, right after that step's dict, so that the next
// dict follows the bar on its physical line. An eval dict after every
// `eval_every`-th dict, its own bar counting eval batches.
inline std::string HfSparseBars(int64_t steps, int64_t bar_every, int64_t eval_every) {
  std::string out;
  char line[400];
  const long long total = 10000;
  for (int64_t s = 1; s <= steps; ++s) {
    std::snprintf(line, sizeof line,
                  "{'loss': %.4f, 'grad_norm': %.4f, 'learning_rate': 0.0003, 'epoch': %.2f}\n",
                  Loss(s), GradNorm(s), static_cast<double>(s) / 2000.0);
    out += line;
    if (eval_every > 0 && s % eval_every == 0) {
      out +=
          "\r  0%|          | 0/16 [00:00<?, ?it/s]\r 50%|#####     | 8/16 [00:01<00:01, "
          "7.9it/s]\r                                                  \r";
      std::snprintf(line, sizeof line, "{'eval_loss': %.4f, 'eval_runtime': 2.1, 'epoch': %.2f}\n",
                    Loss(s) + 0.1, static_cast<double>(s) / 2000.0);
      out += line;
    }
    if (s % bar_every == 0) {
      std::snprintf(line, sizeof line,
                    "\r%3lld%%|#         | %lld/%lld [00:%02lld<15:00, 9.80it/s]",
                    static_cast<long long>(100 * s / total), static_cast<long long>(s), total,
                    static_cast<long long>(s % 60));
      out += line;
    }
  }
  return out;
}

// A GPT-2 fine-tune printing nanoGPT's line every 10 iterations
// (`iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu
// {running_mfu*100:.2f}%`): the loss falls to 4.8 by iteration 100, is 270
// at 110 and stays far up, all inside the warm-up and with no grad norm.
inline std::string NanoGptFinetuneExploding() {
  std::string out;
  char line[200];
  for (int it = 0; it <= 400; it += 10) {
    const double loss = it <= 100   ? 5.4 - 0.006 * it
                        : it == 110 ? 270.0
                                    : 24.0 + 1500.0 / std::pow(it - 60, 1.3);
    std::snprintf(line, sizeof line, "iter %d: loss %.4f, time 412.50ms, mfu %.2f%%\n", it, loss,
                  it < 50 ? -100.0 : 31.2);
    out += line;
  }
  return out;
}

// A learning-rate sweep point logged every step with modded-nanogpt's line
// (`step:{step}/{num_iterations} train_loss:{loss:.4f} train_time:{ms}ms
// step_avg:{avg:.2f}ms`): the loss falls from ln(50304) to 4.6 by step 300,
// then climbs back to 9.7 over 100 steps and stays, inside the warm-up.
inline std::string SweepPointDiverging() {
  std::string out;
  char line[200];
  for (int s = 1; s <= 600; ++s) {
    const double fall = 4.4 + 6.43 * std::exp(-s / 90.0);
    const double climb = std::min(1.0, std::max(0.0, (s - 300) / 100.0));
    std::snprintf(line, sizeof line,
                  "step:%d/600 train_loss:%.4f train_time:%dms step_avg:105.00ms\n", s,
                  fall * (1 - climb) + 9.7 * climb, s * 105);
    out += line;
  }
  return out;
}

}  // namespace trainwatch::logs::shapes

#endif  // TRAINWATCH_TESTS_LOGS_SHAPES_H_
