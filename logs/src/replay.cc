#include "trainwatch/logs/replay.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/tensorboard.h"
#include "trainwatch/core/json.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::logs {

using core::Event;

namespace {

// The engine of an attempt resuming after `resumed_from`: `history` (rows of
// `trace`, in step order: what the engine of the attempt before had seen)
// cut to the steps up to it, and replayed. What is cut is the abandoned
// tail: it stays in the earlier attempt's counts and events, and none of it
// reaches the new engine's windows.
std::unique_ptr<core::RuleEngine> Resume(const Trace& trace, const core::RuleConfig& config,
                                         int64_t resumed_from, std::vector<size_t>* history) {
  while (!history->empty() && trace.Record(history->back()).step > resumed_from) {
    history->pop_back();
  }
  core::EngineRebuilder rebuild(config, resumed_from);
  for (size_t i : *history) rebuild.Feed(trace.Record(i));
  return std::move(rebuild).Finish();
}

}  // namespace

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const core::RuleConfig& config) {
  auto engine = std::make_unique<core::RuleEngine>(config);
  std::vector<size_t> history;  // the current attempt's engine's records, for a restart
  core::StepOutcome out;
  ReplayResult result;
  for (size_t i = 0; i < trace.size(); ++i) {
    const core::StepRecord rec = trace.Record(i);
    if (result.attempts.empty() || rec.step <= result.attempts.back().last_step) {
      ReplayAttempt next;
      if (!result.attempts.empty()) {
        next.resumed_from = rec.step - 1;
        engine = Resume(trace, config, next.resumed_from, &history);
      }
      next.first_step = rec.step;
      next.first_event = result.events.size();
      result.attempts.push_back(next);
    }
    if (absl::Status s = engine->Judge(rec, &out); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", trace.line(i), ": ", s.message()));
    }
    history.push_back(i);
    ReplayAttempt& attempt = result.attempts.back();
    attempt.last_step = rec.step;
    ++attempt.records;
    ++result.records;
    if (out.verdict.decision == core::Decision::kSkipUpdate) {
      ++attempt.skipped_steps;
      ++result.skipped_steps;
    }
    if (out.verdict.decision == core::Decision::kHalt) {
      if (attempt.halted_at < 0) attempt.halted_at = rec.step;
      if (result.halted_at < 0) result.halted_at = rec.step;
    }
    attempt.events += out.events.size();
    for (Event& e : out.events) result.events.push_back(std::move(e));
  }
  return result;
}

namespace {

std::vector<std::string> LackedNames(uint32_t mask) {
  std::vector<std::string> names;
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (mask & (1u << s)) names.emplace_back(core::SignalName(static_cast<core::Signal>(s)));
  }
  return names;
}

// Ids then names, ';' between them as in the CSV's shard column; a long
// list of either is summarised.
std::string ShardsText(const Event& e) {
  if (e.shards.empty() && e.shard_names.empty()) return "-";
  std::vector<std::string> parts;
  if (e.shards.size() <= 3) {
    for (uint64_t id : e.shards) parts.push_back(absl::StrCat(id));
  } else {
    parts.push_back(absl::StrFormat("%d..%d (%d)", e.shards.front(), e.shards.back(),
                                    e.shards.size()));
  }
  if (e.shard_names.size() <= 3) {
    parts.insert(parts.end(), e.shard_names.begin(), e.shard_names.end());
  } else {
    parts.push_back(absl::StrFormat("%s..%s (%d names)", e.shard_names.front(),
                                    e.shard_names.back(), e.shard_names.size()));
  }
  return absl::StrCat(absl::StrJoin(parts, ";"), e.shards_truncated ? "+" : "");
}

std::string AttemptLine(const ReplayResult& r, size_t a) {
  const ReplayAttempt& t = r.attempts[a];
  return absl::StrFormat(
      "attempt %d: %s, steps %d..%d, %d records\n", a,
      a == 0 ? std::string("the first start") : absl::StrCat("resumed from step ", t.resumed_from),
      t.first_step, t.last_step, t.records);
}

std::string OptionalStep(int64_t step) { return step >= 0 ? absl::StrCat(step) : "null"; }

}  // namespace

namespace {

void AppendEventJson(std::string* out_ptr, const Event& e, size_t attempt) {
  std::string& out = *out_ptr;
  absl::StrAppend(&out, "{\"step\":", e.step, ",\"tier\":", e.tier, ",\"action\":");
  core::AppendJsonString(&out, core::ActionName(e.action));
  out += ",\"kind\":";
  core::AppendJsonString(&out, core::EventKindName(e.kind));
  absl::StrAppend(&out, ",\"episode\":", e.episode, ",\"onset_step\":", e.onset_step,
                  ",\"shards\":[", absl::StrJoin(e.shards, ","), "]");
  out += ",\"shard_names\":";
  core::AppendJsonStrings(&out, e.shard_names);
  absl::StrAppend(&out, ",\"shards_truncated\":", e.shards_truncated ? "true" : "false");
  out += ",\"recommended_checkpoint_step\":";
  if (e.recommended_checkpoint_step >= 0) {
    absl::StrAppend(&out, e.recommended_checkpoint_step);
  } else {
    out += "null";
  }
  out += ",\"recommended_checkpoint_uri\":";
  if (e.recommended_checkpoint_step >= 0) {
    core::AppendJsonString(&out, e.recommended_checkpoint_uri);
  } else {
    out += "null";
  }
  out += ",\"recommended_actions\":";
  core::AppendRecommendedActionsJson(&out, e.recommended_actions);
  out += ",\"reason\":";
  core::AppendJsonString(&out, e.reason);
  out += ",\"lacked_signals\":[";
  const std::vector<std::string> lacked = LackedNames(e.lacked_signals);
  for (size_t i = 0; i < lacked.size(); ++i) {
    if (i) out += ",";
    core::AppendJsonString(&out, lacked[i]);
  }
  absl::StrAppend(&out, "],\"attempt\":", attempt, "}\n");
}

void AppendEventRow(std::string* out_ptr, const Event& e) {
  std::string& out = *out_ptr;
  const std::string ckpt =
      e.recommended_checkpoint_step >= 0 ? absl::StrCat(e.recommended_checkpoint_step) : "-";
  absl::StrAppendFormat(&out, "%-9d %-4d %-11s %-20s %-9d %-9s %-22s %s\n", e.step, e.tier,
                        core::ActionName(e.action), core::EventKindName(e.kind), e.onset_step, ckpt,
                        ShardsText(e), e.reason);
  for (const core::RecommendedAction& a : e.recommended_actions) {
    absl::StrAppendFormat(&out, "%88s-> %s\n", "", a.text);
  }
  if (e.lacked_signals != 0) {
    absl::StrAppendFormat(&out, "%88s(no %s in this run)\n", "",
                          absl::StrJoin(LackedNames(e.lacked_signals), ", "));
  }
}

}  // namespace

std::string FormatEventsJson(const ReplayResult& result) {
  std::string out;
  for (size_t a = 0; a < result.attempts.size(); ++a) {
    const ReplayAttempt& t = result.attempts[a];
    for (size_t i = t.first_event; i < t.first_event + t.events; ++i) {
      AppendEventJson(&out, result.events[i], a);
    }
  }
  return out;
}

std::string FormatEventsTable(const ReplayResult& result) {
  const bool restarted = result.attempts.size() > 1;
  if (result.events.empty() && !restarted) return "no events\n";
  std::string out =
      absl::StrFormat("%-9s %-4s %-11s %-20s %-9s %-9s %-22s %s\n", "STEP", "TIER", "ACTION",
                      "KIND", "ONSET", "CKPT", "SHARDS", "REASON / RECOMMENDED");
  for (size_t a = 0; a < result.attempts.size(); ++a) {
    const ReplayAttempt& t = result.attempts[a];
    // Every attempt gets its line, with events or without: the restart is news.
    if (restarted) out += AttemptLine(result, a);
    for (size_t i = t.first_event; i < t.first_event + t.events; ++i) {
      AppendEventRow(&out, result.events[i]);
    }
  }
  return out;
}

namespace {

struct TierSummary {
  // An episode by number and onset: a rebuilt engine numbers episodes anew
  // after a restart, so one number may name an abandoned tail's episode and
  // a different one of the new attempt; one that spans the restart keeps both.
  std::set<std::pair<uint64_t, int64_t>> incidents;
  int64_t events = 0;
  int64_t first = -1;
  int64_t last = -1;
};

std::map<int, TierSummary> Summarise(const ReplayResult& r) {
  std::map<int, TierSummary> tiers;
  for (int t = 0; t <= 3; ++t) tiers[t];
  for (const Event& e : r.events) {
    // Recovery notes close episodes; they are not incidents of their own.
    if (e.action == core::Action::kNone) continue;
    TierSummary& s = tiers[e.tier];
    s.incidents.insert({e.episode, e.onset_step});
    ++s.events;
    if (s.first < 0) s.first = e.step;
    s.last = e.step;
  }
  return tiers;
}

}  // namespace

std::string FormatSummaryTable(const ReplayResult& r) {
  std::string out = absl::StrFormat("%-5s %-10s %-8s %-10s %-10s %s\n", "TIER", "INCIDENTS",
                                    "EVENTS", "FIRST", "LAST", "SKIPPED");
  for (const auto& [tier, s] : Summarise(r)) {
    absl::StrAppendFormat(&out, "%-5d %-10d %-8d %-10s %-10s %s\n", tier, s.incidents.size(),
                          s.events, s.first >= 0 ? absl::StrCat(s.first) : "-",
                          s.last >= 0 ? absl::StrCat(s.last) : "-",
                          tier == 1 ? absl::StrCat(r.skipped_steps) : "-");
  }
  absl::StrAppendFormat(&out, "records %d, skipped steps %d, halted at %s\n", r.records,
                        r.skipped_steps,
                        r.halted_at >= 0 ? absl::StrCat("step ", r.halted_at) : "no step");
  if (r.attempts.size() > 1) {
    absl::StrAppendFormat(&out, "%-8s %-8s %-16s %-8s %-8s %-8s %s\n", "ATTEMPT", "RESUMED",
                          "STEPS", "RECORDS", "EVENTS", "SKIPPED", "HALTED");
    for (size_t a = 0; a < r.attempts.size(); ++a) {
      const ReplayAttempt& t = r.attempts[a];
      absl::StrAppendFormat(&out, "%-8d %-8s %-16s %-8d %-8d %-8d %s\n", a,
                            a == 0 ? "-" : absl::StrCat(t.resumed_from),
                            absl::StrCat(t.first_step, "..", t.last_step), t.records, t.events,
                            t.skipped_steps, t.halted_at >= 0 ? absl::StrCat(t.halted_at) : "-");
    }
  }
  return out;
}

std::string FormatSummaryJson(const ReplayResult& r) {
  std::string out;
  for (const auto& [tier, s] : Summarise(r)) {
    absl::StrAppend(&out, "{\"tier\":", tier, ",\"incidents\":", s.incidents.size(),
                    ",\"events\":", s.events,
                    ",\"first_step\":", s.first >= 0 ? absl::StrCat(s.first) : "null",
                    ",\"last_step\":", s.last >= 0 ? absl::StrCat(s.last) : "null",
                    ",\"skipped_steps\":", tier == 1 ? r.skipped_steps : 0, "}\n");
  }
  for (size_t a = 0; a < r.attempts.size(); ++a) {
    const ReplayAttempt& t = r.attempts[a];
    absl::StrAppend(&out, "{\"attempt\":", a,
                    ",\"resumed_from\":", a == 0 ? "null" : absl::StrCat(t.resumed_from),
                    ",\"first_step\":", t.first_step, ",\"last_step\":", t.last_step,
                    ",\"records\":", t.records, ",\"events\":", t.events,
                    ",\"skipped_steps\":", t.skipped_steps,
                    ",\"halted_at\":", OptionalStep(t.halted_at), "}\n");
  }
  return out;
}

namespace {

constexpr char kReplayUsage[] =
    "usage: twctl replay FILE|DIR [--config FILE] [--format FORMAT | --pattern TEMPLATE|REGEX]\n"
    "                         [--map SIGNAL=COLUMN,...] [--logging-steps N] [-o table|json]\n"
    "                         [--summary] [--print-config]\n"
    "Replays a run's metrics through the rule engine that runs in the agent and the\n"
    "server, and prints one event per line ('-' reads stdin).\n"
    "Formats, detected from the content unless --format says:\n"
    "  csv        trainwatch CSV, header step,loss,grad_norm,log_z,nan_frac[,shard,\n"
    "             checkpoint,lr,z_loss_alpha,activation_max,attention_logit_p99]\n"
    "  wandb-csv  a W&B or TensorBoard CSV export: a step column and metric columns,\n"
    "             found by name or mapped: --map loss=train/loss,grad_norm=train/grad_norm\n"
    "  jsonl      JSON lines with the keys of the CSV\n"
    "  llmc       llm.c main.log (s:STEP trl:LOSS lr:LR norm:NORM)\n"
    "  steplog    step:S/N train_loss:L ... (modded-nanogpt family)\n"
    "  megatron   Megatron-LM iteration lines (a grad norm without lm loss: a NaN loss)\n"
    "  nanogpt    nanoGPT: iter N: loss X, ... (a timestamp before it or not); step N:\n"
    "             train loss X, val loss Y read past; saving checkpoint to DIR: a\n"
    "             checkpoint at that eval's step\n"
    "  hf         Hugging Face Trainer stdout: {'loss': ..., 'grad_norm': ...,\n"
    "             'learning_rate': ...} lines, each at the step of the tqdm bar (N/M)\n"
    "             drawn before it; without bars, the k-th at k * --logging-steps N.\n"
    "             Eval and summary dicts are read past\n"
    "  hf-state   Hugging Face trainer_state.json: log_history entries with a loss;\n"
    "             a Trainer's output folder: its newest trainer_state.json\n"
    "  torchtitan torchtitan: step: N  loss: L  grad_norm: G  memory: ... (colours,\n"
    "             logger prefix and other ranks' lines read past)\n"
    "  composer   Composer / llm-foundry ConsoleLogger: [batch=N/M]: then\n"
    "             Train loss/train/total, l2_norm/grad/global, lr-* lines\n"
    "  nemo       NeMo 2: Training epoch E, iteration I/T | lr: X | global_step: S |\n"
    "             reduced_train_loss: L | ...; NeMo 1's progress bar with\n"
    "             reduced_train_loss=L, global_step=S\n"
    "  lightning  Lightning's CSVLogger metrics.csv, read as wandb-csv (another name\n"
    "             for it): step, train_loss or train_loss_step, grad_2.0_norm_total;\n"
    "             validation rows have no train metric and are read past\n"
    "  deepspeed  DeepSpeed's fp16 loss-scaler lines alone (OVERFLOW!, hysteresis,\n"
    "             step=N, skipped=K, already at minimum); in the trainers' text logs\n"
    "             above (all but composer) they are read too: an overflow is a skipped\n"
    "             step at the step after the last one the log named, at minimum a\n"
    "             loss scale of 0 (tier 3)\n"
    "  tensorboard  TensorBoard event files (events.out.tfevents.*): one file, or a\n"
    "             folder whose event files are merged by step; tags found by name\n"
    "             (loss, train/loss, Loss/train, grad_norm, lr, ...) or mapped:\n"
    "             --map loss=train/total_loss. A torn final record is a warning\n"
    "             (the rest is replayed); a bad CRC is an error naming file and offset\n"
    "A log in none of these formats (the first 500 lines say) is an error naming them.\n"
    "--pattern describes your own lines instead: a template such as\n"
    "  'step {step}/{} | loss {loss} | gnorm {grad_norm} | lr {lr}'\n"
    "({NAME} a number: step, loss, grad_norm, log_z, nan_frac, lr, ...; {} any text; a\n"
    "space one or more), or an RE2 regex with those names as groups (?<step>\\d+).\n"
    "Metrics a log never reports are unknown: the rules that need them stay silent and\n"
    "each event lists them under lacked_signals. A nan or inf the log writes is a\n"
    "report: a numerical failure (tier 3), even when the metric was never finite.\n"
    "--config FILE   JSON object of rule thresholds (see --print-config)\n"
    "--vocab N       the model's vocabulary size (the rules' vocab_size): a loss above\n"
    "                tier3_vocab_factor (3) x ln(N) is a numerical failure from the\n"
    "                first record\n"
    "A log whose steps go back (a job restarted from a checkpoint, writing to the same\n"
    "file) is replayed as a new attempt resuming after the step before the jump: its\n"
    "engine is rebuilt from the history up to there, the abandoned tail stays the\n"
    "earlier attempt's, and every event says its attempt. Lines or rows at the step\n"
    "just read are more of it (train and eval lines, a line every rank prints): they\n"
    "merge into one record; one giving another value of a metric the step holds is a\n"
    "restart at that step (a new attempt), never an overwrite.\n"
    "--summary       per tier: incidents, first and last step, skipped steps; then the\n"
    "                attempts (resumed from, steps, records, events, skipped, halted)\n"
    "Exit codes: 0 ok, 1 error, 2 usage or malformed input (nothing printed on stdout).\n";

template <typename String>
bool ReadAll(const std::string& path, String* content) {
  std::ifstream file;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) return false;
  }
  std::istream& in = path == "-" ? std::cin : file;
  // file_size is -1 with ec set for what is not a regular file (a pipe named
  // /dev/stdin, a FIFO): reserving that was a length_error.
  std::error_code ec;
  const uintmax_t size = path == "-" ? 0 : std::filesystem::file_size(path, ec);
  return ReadStream(in, ec ? 0 : static_cast<size_t>(size), content);
}

}  // namespace

absl::StatusOr<core::RuleConfig> RulesFromFlags(const std::string& config_path,
                                                absl::string_view vocab) {
  core::RuleConfig config;
  if (!config_path.empty()) {
    std::string text;
    if (!ReadAll(config_path, &text)) {
      return absl::NotFoundError(absl::StrCat("cannot read ", config_path));
    }
    absl::StatusOr<core::RuleConfig> parsed = core::ParseRuleConfigJson(text, config_path);
    if (!parsed.ok()) return parsed.status();
    config = *parsed;
  }
  if (!vocab.empty() && (!absl::SimpleAtoi(vocab, &config.vocab_size) ||
                         config.vocab_size < 2 || !core::Validate(config).ok())) {
    // The bound is the rules file's (config.cc).
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab must be the model's vocabulary size (2 to 10^9), not ", vocab));
  }
  return config;
}

namespace {

// twctl replay's command line.
struct ReplayFlags {
  std::string file, config_path, output = "table", format = "auto", map, logging_steps, vocab;
  std::optional<std::string> pattern;
  bool summary = false, print_config = false, help = false;
};

// A usage error is InvalidArgument with what to print.
absl::Status ParseReplayFlags(const std::vector<std::string>& args, ReplayFlags* f) {
  // FLAG VALUE and FLAG=VALUE alike.
  const std::pair<const char*, std::string*> valued[] = {
      {"--config", &f->config_path}, {"-o", &f->output}, {"--output", &f->output},
      {"--format", &f->format},      {"--map", &f->map}, {"--logging-steps", &f->logging_steps},
      {"--vocab", &f->vocab}};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      f->help = true;
      return absl::OkStatus();
    }
    const std::string name = a.substr(0, a.find('='));
    std::string* dst = name == "--pattern" ? &f->pattern.emplace() : nullptr;
    for (const auto& [flag, field] : valued) {
      if (name == flag) dst = field;
    }
    if (dst != nullptr) {
      if (name.size() < a.size()) {
        *dst = a.substr(name.size() + 1);
      } else if (i + 1 < args.size()) {
        *dst = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      }
    } else if (a == "--summary") {
      f->summary = true;
    } else if (a == "--print-config") {
      f->print_config = true;
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a, "\n", kReplayUsage));
    } else if (f->file.empty()) {
      f->file = a;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("one FILE only (got ", f->file, " and ", a, ")"));
    }
  }
  if (f->output != "table" && f->output != "json") {
    return absl::InvalidArgumentError(absl::StrCat("-o must be table or json, not ", f->output));
  }
  return absl::OkStatus();
}

// The file (a folder or event file through its own reader, whose messages
// name the file and byte offset; anything else read whole). `*code` is the
// exit status of a failure: 1 for what cannot be read, 2 for bad content.
absl::StatusOr<Trace> ReadTrace(const std::string& file, const ReadOptions& read, int* code) {
  std::error_code ec;
  if (file != "-" && (std::filesystem::is_directory(file, ec) ||
                      (read.format == MetricsFormat::kAuto && IsEventFileName(file)))) {
    absl::StatusOr<Trace> trace = ReadMetricsFile(file, read);
    *code = !trace.ok() && absl::IsNotFound(trace.status()) ? 1 : 2;
    return trace;
  }
  LargeString content;
  if (!ReadAll(file, &content)) {
    *code = 1;
    return absl::NotFoundError(absl::StrCat("cannot read ", file));
  }
  *code = 2;
  return ParseMetrics(absl::string_view(content.data(), content.size()),
                      file == "-" ? "<stdin>" : file, read);
}

}  // namespace

absl::StatusOr<ReadOptions> ReadOptionsFromFlags(absl::string_view format, absl::string_view map,
                                                 const std::optional<std::string>& pattern,
                                                 absl::string_view logging_steps) {
  ReadOptions read;
  if (!ParseFormatName(format.empty() ? "auto" : format, &read.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --format ", format,
                     " (auto, csv, wandb-csv, jsonl, llmc, steplog, megatron, nanogpt, deepspeed,\n"
                     " hf, hf-state, torchtitan, composer, nemo, lightning, tensorboard)"));
  }
  if (pattern.has_value()) {
    if (read.format != MetricsFormat::kAuto) {
      return absl::InvalidArgumentError("give --pattern or --format, not both");
    }
    absl::StatusOr<std::shared_ptr<const LinePattern>> p = LinePattern::Compile(*pattern);
    if (!p.ok()) return p.status();
    read.format = MetricsFormat::kPattern;
    read.pattern = *std::move(p);
  }
  if (!logging_steps.empty() &&
      (!absl::SimpleAtoi(logging_steps, &read.logging_steps) || read.logging_steps < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--logging-steps must be a positive integer, not ", logging_steps));
  }
  if (!map.empty()) {
    absl::StatusOr<ColumnMap> m = ParseColumnMap(map);
    if (!m.ok()) return m.status();
    read.column_map = *std::move(m);
  }
  return read;
}

int ReplayCommand(const std::vector<std::string>& args, std::string* out, std::string* err) {
  auto fail = [&](absl::string_view what, int code) {
    *err = absl::StrCat("twctl replay: ", what, "\n");
    return code;
  };
  ReplayFlags f;
  if (absl::Status s = ParseReplayFlags(args, &f); !s.ok()) return fail(s.message(), 2);
  if (f.help) {
    *out = kReplayUsage;
    return 0;
  }
  absl::StatusOr<ReadOptions> read =
      ReadOptionsFromFlags(f.format, f.map, f.pattern, f.logging_steps);
  if (!read.ok()) return fail(read.status().message(), 2);
  absl::StatusOr<core::RuleConfig> config = RulesFromFlags(f.config_path, f.vocab);
  if (!config.ok()) {
    return fail(config.status().message(),
                config.status().code() == absl::StatusCode::kNotFound ? 1 : 2);
  }
  if (f.print_config) {
    *out = core::RuleConfigToJson(*config);
    return 0;
  }
  if (f.file.empty()) {
    return fail(absl::StrCat("a metrics FILE or folder is required\n", kReplayUsage), 2);
  }
  int code = 2;
  absl::StatusOr<Trace> trace = ReadTrace(f.file, *read, &code);
  if (!trace.ok()) return fail(trace.status().message(), code);
  for (const std::string& w : trace->warnings()) {
    absl::StrAppend(err, "twctl replay: warning: ", w, "\n");
  }
  absl::StatusOr<ReplayResult> result = Replay(*trace, *config);
  if (!result.ok()) return fail(absl::StrCat(f.file, ": ", result.status().message()), 2);
  if (f.summary) {
    *out = f.output == "json" ? FormatSummaryJson(*result) : FormatSummaryTable(*result);
  } else {
    *out = f.output == "json" ? FormatEventsJson(*result) : FormatEventsTable(*result);
  }
  return 0;
}

}  // namespace trainwatch::logs
