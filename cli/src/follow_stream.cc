#include "follow_stream.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainwatch/agent/reducer.h"

namespace trainwatch::cli {

FollowStream::~FollowStream() {
  if (agent_ != nullptr) agent_->Close(0);
}

absl::Status FollowStream::NewAgent(std::optional<int64_t> resume_step) {
  agent::AgentConfig cfg = base_;
  cfg.observed = true;
  cfg.resume_step = resume_step;
  // Send() checks the window every kWindowCheck records, so up to one
  // check's worth more than the window is unacknowledged: the agent's memory
  // and ring hold that much, or the oldest records would be dropped unsent
  // while the server is slow or away.
  cfg.memory_records = static_cast<size_t>(window_ + kWindowCheck);
  cfg.ring_records = static_cast<size_t>(window_ + kWindowCheck);
  absl::StatusOr<std::unique_ptr<agent::Agent>> a =
      agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  if (!a.ok()) return a.status();
  agent_ = *std::move(a);
  agent_->SourceEnded(source_ended_);
  ++attempts_;
  return absl::OkStatus();
}

void FollowStream::CaughtUp() { agent_->SourceCaughtUp(); }

void FollowStream::SourceEnded(bool ended) {
  source_ended_ = ended;
  agent_->SourceEnded(ended);
}

absl::Status FollowStream::Start() { return NewAgent(std::nullopt); }

void FollowStream::Retire() {
  agent_->Close(drain_timeout_ms_);
  const agent::AgentStats s = agent_->Stats();
  retired_.sent += s.records_queued;
  retired_.acked += s.records_acked;
  retired_.spilled += s.records_spilled;
  // What the closed agent never got acknowledged is lost to this follow.
  retired_.dropped += s.records_queued - s.records_acked;
  agent_.reset();
}

absl::Status FollowStream::Send(const core::StepRecord& record) {
  if (last_step_ >= 0 && record.step <= last_step_) {
    // The job restarted from a checkpoint: the old launch's records first
    // (the new incarnation replaces its stream on the server), then a new
    // launch resuming after the step before this one.
    Retire();
    if (absl::Status s = NewAgent(record.step - 1); !s.ok()) return s;
  }
  // The window is checked every kWindowCheck records, not on each: Stats()
  // takes the sender's lock, which at tens of thousands of lines a second
  // costs more than the parsing. The agent's memory and ring have room for
  // the window plus one check's worth (see follow.cc).
  if (++since_check_ >= kWindowCheck) {
    since_check_ = 0;
    while (!stop_requested_()) {
      const agent::AgentStats s = agent_->Stats();
      if (s.records_queued - s.records_acked - s.records_dropped < window_) break;
      if (while_paused_) while_paused_();
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  last_step_ = record.step;
  return agent_->StepObserved(record);
}

void FollowStream::Checkpoint(int64_t step, const std::string& uri) {
  agent_->ReportCheckpoint(step, uri);
  ++checkpoints_;
}

FollowCounts FollowStream::Counts() const {
  FollowCounts c = retired_;
  c.attempts = attempts_;
  c.checkpoints = checkpoints_;
  if (agent_ != nullptr) {
    const agent::AgentStats s = agent_->Stats();
    c.sent += s.records_queued;
    c.acked += s.records_acked;
    c.spilled += s.records_spilled;
    c.dropped += s.records_dropped;
    c.connected = s.connected;
  }
  c.in_flight = c.sent - c.acked - c.dropped;
  return c;
}

bool FollowStream::Close() {
  if (agent_ == nullptr) return true;
  Retire();
  return retired_.sent == retired_.acked;
}

absl::StatusOr<CheckpointMatcher> CheckpointMatcher::Create(const std::string& pattern,
                                                            bool megatron) {
  CheckpointMatcher m;
  m.megatron_ = megatron;
  if (pattern.empty()) return m;
  absl::StatusOr<logs::NamedRegex> re = logs::NamedRegex::Compile(pattern, "--checkpoint-pattern");
  if (!re.ok()) return re.status();
  for (const auto& [name, group] : re->named()) {
    if (name != "path") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint-pattern: unknown group name \"", name, "\" (only path is read)"));
    }
    m.path_group_ = group;
  }
  // The step: the first group without a name.
  for (int g = 1; g <= re->groups() && m.step_group_ == 0; ++g) {
    if (g != m.path_group_) m.step_group_ = g;
  }
  if (m.step_group_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint-pattern \"", pattern,
        "\" has no capture group for the step, e.g. 'saved checkpoint at step (\\d+)'"));
  }
  m.regex_ = std::make_shared<const logs::NamedRegex>(*std::move(re));
  return m;
}

bool CheckpointMatcher::Match(absl::string_view line, int64_t* step, std::string* uri) const {
  if (megatron_) {
    static constexpr absl::string_view kSaving = "saving checkpoint at iteration";
    if (const size_t at = line.find(kSaving); at != absl::string_view::npos) {
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(at + kSaving.size()));
      const size_t digits = std::min(
          rest.size(), static_cast<size_t>(std::find_if_not(rest.begin(), rest.end(),
                                                            [](char c) {
                                                              return absl::ascii_isdigit(
                                                                  static_cast<unsigned char>(c));
                                                            }) -
                                           rest.begin()));
      if (digits > 0 && absl::SimpleAtoi(rest.substr(0, digits), step)) {
        rest = absl::StripLeadingAsciiWhitespace(rest.substr(digits));
        if (absl::ConsumePrefix(&rest, "to ")) {
          rest = absl::StripLeadingAsciiWhitespace(rest);
          *uri = std::string(rest.substr(0, rest.find_first_of(" \t")));
        } else {
          *uri = absl::StrFormat("iter_%07d", *step);  // Megatron's folder name
        }
        return true;
      }
    }
  }
  if (regex_ == nullptr) return false;
  std::vector<absl::string_view> match;
  if (!regex_->Search(line, &match)) return false;
  if (!absl::SimpleAtoi(match[static_cast<size_t>(step_group_)], step) || *step < 0) return false;
  const absl::string_view path = path_group_ > 0 ? match[static_cast<size_t>(path_group_)]
                                                 : absl::string_view();
  *uri = std::string(path.data() != nullptr ? path : match[0]);
  return true;
}

}  // namespace trainwatch::cli
