// twctl follow: a running job's log or TensorBoard events streamed to
// trainwatchd as the job writes them, parsed by replay's readers (one line
// or record at a time) and sent through the agent library as an observed
// run (follow_stream.h). The sources are follow_source.h's.

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "commands.h"
#include "follow_source.h"
#include "follow_stream.h"
#include "trainwatch/logs/lines.h"
#include "operator_client.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/replay.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::cli {

using logs::DetectFormat;
using logs::FormatName;
using logs::IsEventFileName;
using logs::kUnmappedTag;
using logs::LineParser;
using logs::LineReader;
using logs::MetricsFormat;
using logs::NewLineParser;
using logs::ReadOptions;
using logs::ScalarEvent;
using logs::SignalOfTag;
using logs::TraceBuilder;

namespace {

using core::Signal;

volatile std::sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int sig) { g_stop_signal = sig; }

// Lines buffered to detect the format before the first is parsed; after
// kUnknownNoteLines unknown ones, a note says how to give --pattern.
constexpr int kDetectLines = 500;
constexpr int kUnknownNoteLines = 50;

struct Progress {
  int64_t lines = 0;
  int64_t events = 0;  // TensorBoard events with scalars
  int64_t rejected = 0;
};

// Everything one follow needs between polls.
class Follower {
 public:
  // `options`: the format (kAuto: detected), the column map, logging steps
  // and the pattern.
  Follower(std::string source, ReadOptions options, CheckpointMatcher matcher,
           FollowStream* stream)
      : source_(std::move(source)),
        format_(options.format),
        options_(std::move(options)),
        matcher_(std::move(matcher)),
        stream_(stream) {}

  // One line of a text source. An error: no format matched (nothing was
  // sent; a guess would report a wrong run as followed).
  absl::Status Line(absl::string_view line) {
    ++progress_.lines;
    if (parser_ != nullptr) return Parse(line);
    if (Detect(line)) return ParseHeld();
    if (held_lines_ >= kDetectLines) return Unknown();
    if (held_lines_ == kUnknownNoteLines && !unknown_noted_ &&
        DetectFormat(held_) == MetricsFormat::kAuto) {
      unknown_noted_ = true;
      std::fprintf(stderr, "twctl follow: still looking for a known format after %d lines: %s\n",
                   kUnknownNoteLines,
                   std::string(logs::UnknownFormatError(source_, held_).message()).c_str());
    }
    return absl::OkStatus();
  }
  // The stream ended (`last`) or restarted: what was held for detection is
  // parsed. Lines in no known format end the follow only at the end: a log
  // rotated or truncated before its first metric line is waited on.
  absl::Status EndOfStream(bool last = true) {
    if (parser_ == nullptr && !held_.empty()) {
      const MetricsFormat f = DetectFormat(held_);
      if (f == MetricsFormat::kAuto) return last ? Unknown() : absl::OkStatus();
      Choose(f);
      if (absl::Status s = ParseHeld(); !s.ok()) return s;
    }
    if (parser_ == nullptr) return absl::OkStatus();
    // What the reader held for a later line (a DeepSpeed overflow waiting for
    // its step's record) is sent now: no later line will come.
    if (absl::Status s = parser_->Flush(*builder_); !s.ok()) {
      builder_->Drop();
      ++progress_.rejected;
      std::fprintf(stderr, "twctl follow: %s (read past)\n", std::string(s.message()).c_str());
    }
    return SendDrained();
  }
  // The source has nothing new and no partial line: what the reader holds
  // for a line that may still come is sent (LineParser::Idle).
  absl::Status Idle() {
    if (parser_ == nullptr) return absl::OkStatus();
    if (absl::Status s = parser_->Idle(*builder_); !s.ok()) {
      builder_->Drop();
      ++progress_.rejected;
      std::fprintf(stderr, "twctl follow: %s (read past)\n", std::string(s.message()).c_str());
    }
    return SendDrained();
  }
  // A rotation or truncation: the next bytes are a new file (a CSV header
  // again, line numbers from 1). `rewritten`: the same file written again
  // whole with more in it (a CSV with a new column): its steps up to the
  // last one sent were sent, and are read past, not a restart of the job.
  absl::Status Restart(bool rewritten) {
    if (absl::Status s = EndOfStream(/*last=*/false); !s.ok()) return s;
    if (rewritten) skip_through_ = last_sent_;
    // trainer_state.json's reader is fed each version of the file and gives
    // only the steps not given before: it stays.
    if (parser_ != nullptr && format_ != MetricsFormat::kHfTrainerState) NewParser();
    line_no_ = 0;
    return absl::OkStatus();
  }
  // One TensorBoard event: its scalars join the step's; a later step sends
  // the one before (events of one step arrive one tag at a time).
  absl::Status Event(const ScalarEvent& e) {
    ++progress_.events;
    if (have_pending_ && e.step != pending_.step) {
      if (absl::Status s = SendPending(); !s.ok()) return s;
    }
    if (!have_pending_) {
      pending_ = core::StepRecord();
      pending_.step = e.step;
      have_pending_ = true;
    }
    for (const ScalarEvent::Value& v : e.values) {
      Signal s;
      if (SignalOfTag(v.tag, options_.column_map, &s) != kUnmappedTag) pending_.Set(s, v.value);
    }
    return absl::OkStatus();
  }
  absl::Status SendPending() {
    if (!have_pending_) return absl::OkStatus();
    have_pending_ = false;
    return stream_->Send(pending_);
  }
  const Progress& progress() const { return progress_; }
  MetricsFormat format() const { return format_; }
  // No known format matched the lines: a usage error (give --pattern).
  bool unknown_format() const { return unknown_; }
  // A CSV's first line is its header: a new one means the file was
  // rewritten (FileTail::WatchFirstLine).
  bool HeaderFirst() const {
    return parser_ != nullptr &&
           (format_ == MetricsFormat::kCsv || format_ == MetricsFormat::kGenericCsv);
  }

 private:
  absl::Status Unknown() {
    unknown_ = true;
    return logs::UnknownFormatError(source_, held_);
  }
  bool Detect(absl::string_view line) {
    absl::StrAppend(&held_, line, "\n");
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty()) return false;
    ++held_lines_;
    MetricsFormat f = format_;
    if (f == MetricsFormat::kAuto) {
      f = DetectFormat(held_);
      if (f == MetricsFormat::kAuto) return false;
      // A CSV is told by its header, the first line; a log by a metric line
      // among the first kDetectLines.
      if (f == MetricsFormat::kJsonLines && held_lines_ < kDetectLines &&
          absl::StartsWith(absl::StripLeadingAsciiWhitespace(held_), "{\n")) {
        // A JSON document on many lines: trainer_state.json once its
        // "log_history" key comes (DetectFormat then says so).
        return false;
      }
      if (f == MetricsFormat::kCsv) {
        // DetectFormat took the first line that is not a comment for a
        // header (a step column, or names alone), as replay does.
        f = MetricsFormat::kGenericCsv;
      } else if (f == MetricsFormat::kDeepSpeed && held_lines_ < kDetectLines) {
        // DeepSpeed's lines come before a trainer's first metric line (the
        // start-up overflows): that trainer's reader, which reads them too,
        // is the one to choose.
        return false;
      }
    }
    Choose(f);
    return true;
  }
  void Choose(MetricsFormat f) {
    if (f == MetricsFormat::kCsv && format_ == MetricsFormat::kAuto) {
      f = MetricsFormat::kGenericCsv;  // as replay reads a detected CSV
    }
    format_ = f;
    NewParser();
  }
  void NewParser() {
    parser_ = NewLineParser(format_, source_, options_);
    builder_ = std::make_unique<TraceBuilder>(source_);
    builder_->Live();
  }
  absl::Status ParseHeld() {
    std::string held = std::move(held_);
    held_.clear();
    LineReader lines(held);
    absl::string_view line;
    while (lines.Next(&line)) {
      if (absl::Status s = Parse(line); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status Parse(absl::string_view line) {
    ++line_no_;
    if (absl::Status s = parser_->Line(line, line_no_, *builder_); !s.ok()) {
      // Reported and read past: one bad line must not end a job's watch.
      builder_->Drop();
      ++progress_.rejected;
      std::fprintf(stderr, "twctl follow: %s (line read past)\n", std::string(s.message()).c_str());
    }
    // The last record waits for the next line or an idle source: the next
    // line may be more of its step.
    if (absl::Status s = SendDrained(/*hold_last=*/true); !s.ok()) return s;
    int64_t step;
    std::string uri;
    if (matcher_.Match(line, &step, &uri)) stream_->Checkpoint(step, uri);
    return absl::OkStatus();
  }

  // Sends the records the reader built since the last call (but the last
  // one, with `hold_last`).
  absl::Status SendDrained(bool hold_last = false) {
    absl::Status sent = absl::OkStatus();
    builder_->Drain([&](const core::StepRecord& rec, int) {
      if (!sent.ok()) return;
      if (skip_through_ >= 0) {
        if (rec.step <= skip_through_) return;  // sent before the rewrite
        skip_through_ = -1;
      }
      last_sent_ = rec.step;
      sent = stream_->Send(rec);
      if (sent.ok() && !rec.checkpoint_uri.empty()) {
        stream_->Checkpoint(rec.step, std::string(rec.checkpoint_uri));
      }
    }, hold_last);
    for (const std::string& w : builder_->TakeWarnings()) {
      std::fprintf(stderr, "twctl follow: warning: %s\n", w.c_str());
    }
    return sent;
  }

  std::string source_;
  MetricsFormat format_;
  ReadOptions options_;
  CheckpointMatcher matcher_;
  FollowStream* stream_;
  std::unique_ptr<LineParser> parser_;
  std::unique_ptr<TraceBuilder> builder_;
  std::string held_;  // lines before the format is known
  int held_lines_ = 0;
  int line_no_ = 0;
  int64_t last_sent_ = -1;     // the step of the last record sent
  int64_t skip_through_ = -1;  // after a rewrite: steps up to here were sent
  core::StepRecord pending_;  // the TensorBoard step being gathered
  bool have_pending_ = false;
  Progress progress_;
  bool unknown_ = false, unknown_noted_ = false;
};

// `live`: a status while following, which says when the server is away.
std::string StatusLine(const std::string& source, const Progress& p, const FollowCounts& c,
                       bool events, bool live) {
  return absl::StrFormat(
      "twctl follow: %s: %s %d, records sent %d, acknowledged %d, spilled %d, in flight %d, "
      "attempts %d, checkpoints %d, rejected %d%s%s\n",
      source, events ? "events read" : "lines read", events ? p.events : p.lines, c.sent, c.acked,
      c.spilled, c.in_flight, c.attempts, c.checkpoints, p.rejected,
      c.dropped > 0 ? absl::StrCat(", lost ", c.dropped) : "",
      live && !c.connected ? " (server not connected)" : "");
}

class FollowCommand : public Command {
 public:
  FollowCommand()
      : Command(
            CommandSpec(
                "follow", "SOURCE",
                "stream a running job's log or TensorBoard events to trainwatchd as a run",
                {Flag("run", "RUN", "the run the records belong to (required)", true),
                 Flag("format", "FORMAT",
                      "auto (default), csv, wandb-csv, jsonl, llmc, steplog, megatron, "
                      "nanogpt, deepspeed, hf, hf-state, torchtitan, composer, nemo, "
                      "lightning (a wandb-csv), tensorboard"),
                 Flag("logging-steps", "N",
                      "a Hugging Face Trainer log without progress bars: its k-th loss "
                      "line is step k * N"),
                 Flag("map", "SIGNAL=NAME,...", "columns or tags to signals, as replay's"),
                 Flag("config", "FILE",
                      "the run's rules, a JSON object of thresholds as replay's (announced to "
                      "trainwatchd, which then judges the run by them)"),
                 Flag("vocab", "N",
                      "the model's vocabulary size (vocab_size): a loss above 3 x ln(N) is a "
                      "numerical failure from the first record; as --config, announced"),
                 Flag("pattern", "TEMPLATE|REGEX",
                      "the job's own line format: 'step {step}/{} | loss {loss}', or a regex "
                      "with groups (?<step>..) (?<loss>..)"),
                 Flag("checkpoint-pattern", "REGEX",
                      "a line announcing a checkpoint: one group the step, (?<path>..) its uri"),
                 Flag("drain-timeout", "SECONDS",
                      "at exit and at a restart, the longest wait for acks (default 30)"),
                 Flag("status-interval", "SECONDS",
                      "a status line on stderr this often (default 5; 0: none)"),
                 Flag("poll-interval", "MS",
                      "wait between reads of an idle file or folder (default 100); standard "
                      "input is read as soon as it has data"),
                 Flag("max-in-flight", "N",
                      "records sent and unacknowledged before reading pauses (default 65536)"),
                 Flag("spill-dir", "DIR",
                      "spill unacknowledged records here (default: none, memory only)")})
                .WithNotes(
                    "SOURCE: a file, followed like tail -F (waited for until it exists;\n"
                    "rotation and truncation start the new content from its first byte);\n"
                    "'-', standard input, until its end; or a TensorBoard log folder, whose\n"
                    "event files are read as they appear and grow (a torn final record is\n"
                    "waited for). The format is detected as replay does, or --format.\n"
                    "A file named trainer_state.json (or --format hf-state) is read whole\n"
                    "each time the trainer rewrites it; only steps not sent before are sent.\n"
                    "With --format hf-state, a folder (a Trainer's output_dir) is followed\n"
                    "through its newest trainer_state.json, its own or a checkpoint-N/'s.\n"
                    "The run is marked observed: nothing is skipped or halted in the job.\n"
                    "Steps going back (a restart) open a new attempt resuming after the step\n"
                    "before; lines at one step merge into one record, as replay merges them.\n"
                    "Checkpoints: Megatron's 'saving checkpoint at iteration N',\n"
                    "nanoGPT's 'saving checkpoint to DIR', a checkpoint column, or\n"
                    "--checkpoint-pattern. Stalls: the time between the log's writes is\n"
                    "learned; no step for a multiple of it is a stall (trainwatchd's\n"
                    "--stall_* flags), unless no process has the file open for writing any\n"
                    "more (seen in /proc on this host): the job ended.\n"
                    "A malformed line is reported\n"
                    "and read past. SIGINT/SIGTERM: what was read is sent and acknowledged\n"
                    "(up to --drain-timeout), then a summary.\n"
                    "--pattern describes lines no reader knows: a template, {NAME} a number\n"
                    "(step, loss, grad_norm, log_z, nan_frac, lr, ...), {} any text, a space\n"
                    "one or more; or an RE2 regex with those names as groups. A source whose\n"
                    "first 500 lines match no format stops with the formats tried.\n"
                    "Exit codes: 0 every record acknowledged; 1 records unacknowledged or lost,\n"
                    "or the source failed; 2 usage, no known format, or lines rejected as\n"
                    "malformed.\n")) {}

  int Execute(const Args& args, Context& ctx) const override {
    auto usage = [&](absl::string_view what) {
      *ctx.err = absl::StrCat("twctl follow: ", what, "\n", Usage());
      return kUsage;
    };
    const std::string source = args.operands.at(0);
    const std::string run = args.Get("run");
    if (run.empty()) return usage("--run RUN is required");
    // Read as replay reads them (logs::ReadOptionsFromFlags).
    absl::StatusOr<ReadOptions> parsed = logs::ReadOptionsFromFlags(
        args.Get("format", "auto"), args.Get("map"),
        args.Has("pattern") ? std::optional<std::string>(args.Get("pattern")) : std::nullopt,
        args.Get("logging-steps"));
    if (!parsed.ok()) return usage(parsed.status().message());
    ReadOptions read = *std::move(parsed);
    MetricsFormat format = read.format;
    absl::StatusOr<int64_t> drain = args.GetInt("drain-timeout", 30, 0, 3600);
    absl::StatusOr<int64_t> interval = args.GetInt("status-interval", 5, 0, 86400);
    absl::StatusOr<int64_t> poll_ms = args.GetInt("poll-interval", 100, 1, 60000);
    absl::StatusOr<int64_t> window = args.GetInt("max-in-flight", 65536, 1024, 1 << 24);
    for (const auto* v : {&drain, &interval, &poll_ms, &window}) {
      if (!v->ok()) return usage(v->status().message());
    }
    std::error_code ec;
    const bool folder = source != "-" && std::filesystem::is_directory(source, ec);
    // With hf-state, a folder is a Trainer's output folder (its newest
    // trainer_state.json), not TensorBoard's.
    const bool trainer_output = folder && format == MetricsFormat::kHfTrainerState;
    if (!trainer_output &&
        (folder || (format == MetricsFormat::kAuto &&
                    IsEventFileName(std::filesystem::path(source).filename().string())))) {
      if (format != MetricsFormat::kAuto && format != MetricsFormat::kTensorBoard) {
        return usage(absl::StrCat(source, " is followed as TensorBoard event files, not as ",
                                  FormatName(format)));
      }
      format = MetricsFormat::kTensorBoard;
    } else if (format == MetricsFormat::kTensorBoard && source == "-") {
      return usage("standard input is followed as text; --format tensorboard needs a folder");
    } else if (format == MetricsFormat::kAuto && source != "-" &&
               std::filesystem::path(source).filename() == "trainer_state.json") {
      format = MetricsFormat::kHfTrainerState;
    }
    absl::StatusOr<CheckpointMatcher> matcher =
        CheckpointMatcher::Create(args.Get("checkpoint-pattern"), true);
    if (!matcher.ok()) return usage(matcher.status().message());

    const Connection conn =
        ResolveConnection({args.server, args.token, args.ca_file, args.cert_file, args.key_file});
    if (!conn.error.ok()) return usage(conn.error.message());
    agent::AgentConfig cfg;
    cfg.server_address = conn.server;
    cfg.token = conn.token;
    cfg.ca_file = conn.ca_file;
    cfg.cert_file = conn.cert_file;
    cfg.key_file = conn.key_file;
    cfg.run_id = run;
    cfg.spill_dir = args.Get("spill-dir");
    // The job's own rules, as replay reads them: the run is judged by what
    // the user would replay it with.
    if (!args.Get("config").empty() || !args.Get("vocab").empty()) {
      absl::StatusOr<core::RuleConfig> rules =
          logs::RulesFromFlags(args.Get("config"), args.Get("vocab"));
      if (!rules.ok()) return usage(rules.status().message());
      cfg.rules = *std::move(rules);
    }
    // One follower per job, not thousands of ranks: no herd to spread out.
    cfg.reconnect_max_ms = 2000;
    FollowStream stream(cfg, *window, static_cast<int>(*drain * 1000),
                        [] { return g_stop_signal != 0; });
    if (absl::Status s = stream.Start(); !s.ok()) {
      return usage(absl::StrCat("run ", run, ": ", s.message()));
    }

    g_stop_signal = 0;
    std::signal(SIGINT, OnStopSignal);
    std::signal(SIGTERM, OnStopSignal);
    read.format = format;
    Follower follower(source == "-" ? "<stdin>" : source, std::move(read), *std::move(matcher),
                      &stream);
    const bool events = format == MetricsFormat::kTensorBoard;
    int rc = kOk;
    const absl::Time start = absl::Now();
    // trainer_state.json is rewritten, not appended to: read whole at each
    // version. On standard input its documents come one after another.
    const bool whole_file = format == MetricsFormat::kHfTrainerState && source != "-";
    absl::Status failed = Loop(source, events, whole_file, &follower, &stream, *poll_ms, *interval);
    const absl::Time read_done = absl::Now();
    if (!failed.ok()) {
      std::fprintf(stderr, "twctl follow: %s\n", std::string(failed.message()).c_str());
      rc = follower.unknown_format() ? kUsage : kError;
    }
    const bool all_acked = stream.Close();
    const absl::Time closed = absl::Now();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    const FollowCounts c = stream.Counts();
    *ctx.err += StatusLine(source, follower.progress(), c, events, false);
    absl::StrAppendFormat(ctx.err, "twctl follow: %s, format %s; %s\n",
                          g_stop_signal != 0 ? "stopped by a signal"
                          : failed.ok()      ? "source ended"
                                             : "stopped",
                          follower.unknown_format() ? "unknown" : FormatName(follower.format()),
                          all_acked ? "every record acknowledged"
                                    : absl::StrCat(c.sent - c.acked, " records not acknowledged"));
    const double read_s = absl::ToDoubleSeconds(read_done - start);
    const Progress& p = follower.progress();
    absl::StrAppendFormat(
        ctx.err,
        "twctl follow: read %d %s in %.2f s (%.0f/s), then %.2f s for the "
        "last acks\n",
        events ? p.events : p.lines, events ? "events" : "lines", read_s,
        read_s > 0 ? static_cast<double>(events ? p.events : p.lines) / read_s : 0.0,
        absl::ToDoubleSeconds(closed - read_done));
    if (rc == kOk && !all_acked) rc = kError;
    if (rc == kOk && follower.progress().rejected > 0) rc = kUsage;
    return rc;
  }

 private:
  static absl::Status Loop(const std::string& source, bool events, bool whole_file, Follower* f,
                           FollowStream* stream, int64_t poll_ms, int64_t interval_s) {
    std::unique_ptr<TextTail> tail;
    FileTail* file_tail = nullptr;  // tail, when it is a FileTail
    std::unique_ptr<EventFolder> folder;
    if (events) {
      folder = std::make_unique<EventFolder>(source);
    } else if (source == "-") {
      tail = std::make_unique<StdinTail>();
    } else if (whole_file) {
      tail = std::make_unique<WholeFileTail>(source, "trainer_state.json");
    } else {
      auto file = std::make_unique<FileTail>(source);
      file_tail = file.get();
      tail = std::move(file);
    }
    LineSplitter lines;
    std::string bytes, rest;
    absl::Time next_status = absl::Now() + absl::Seconds(interval_s);
    auto status_if_due = [&] {
      if (interval_s > 0 && absl::Now() >= next_status) {
        std::fputs(StatusLine(source, f->progress(), stream->Counts(), events, true).c_str(),
                   stderr);
        next_status = absl::Now() + absl::Seconds(interval_s);
      }
    };
    stream->SetWhilePaused(status_if_due);
    bool writer_gone = false;
    while (g_stop_signal == 0) {
      bool idle = false;
      if (events) {
        ScalarEvent e;
        absl::StatusOr<bool> got = folder->Next(&e);
        if (!got.ok()) return got.status();
        if (*got) {
          if (absl::Status s = f->Event(e); !s.ok()) return s;
        } else {
          idle = true;
        }
      } else {
        bytes.clear();
        absl::StatusOr<TailEvent> ev = tail->Poll(&bytes, 1 << 16);
        if (!ev.ok()) return ev.status();
        lines.Append(bytes);
        absl::string_view line;
        while (lines.Next(&line)) {
          if (absl::Status s = f->Line(line); !s.ok()) return s;
        }
        if (file_tail != nullptr && f->HeaderFirst()) file_tail->WatchFirstLine();
        if (*ev == TailEvent::kRestart || *ev == TailEvent::kEnd) {
          if (lines.Flush(&rest)) {
            if (absl::Status s = f->Line(rest); !s.ok()) return s;
          }
          if (*ev == TailEvent::kEnd) break;
          std::fprintf(stderr, "twctl follow: %s %s: reading it from the start\n", source.c_str(),
                       tail->RestartReason().c_str());
          if (absl::Status s = f->Restart(tail->RestartReason() == "rewritten"); !s.ok()) {
            return s;
          }
        }
        idle = *ev == TailEvent::kIdle;
        if (idle && lines.pending() == 0) {
          if (absl::Status s = f->Idle(); !s.ok()) return s;
        }
      }
      status_if_due();
      if (idle) {
        // What was there is read: the next step read is the log's next
        // write (its interval is the log's pace); and a writer gone is the
        // job's end, not a stall.
        stream->CaughtUp();
        if (tail != nullptr && tail->WriterGone() != writer_gone) {
          writer_gone = !writer_gone;
          stream->SourceEnded(writer_gone);
          if (writer_gone) {
            std::fprintf(stderr,
                         "twctl follow: %s: no process has it open for writing: the job "
                         "ended (no stall is judged until it is written again)\n",
                         source.c_str());
          }
        }
        if (tail != nullptr) {
          tail->WaitForData(poll_ms);
        } else {
          absl::SleepFor(absl::Milliseconds(poll_ms));
        }
      }
    }
    // Stopped or ended: what was read becomes records, then Close() waits
    // for their acks.
    if (absl::Status s = f->EndOfStream(); !s.ok()) return s;
    return f->SendPending();
  }
};

}  // namespace

std::unique_ptr<Command> MakeFollowCommand() { return std::make_unique<FollowCommand>(); }

}  // namespace trainwatch::cli
