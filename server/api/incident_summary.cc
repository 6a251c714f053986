#include "api/incident_summary.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "trainwatch/core/shard_names.h"
#include "api/convert.h"
#include "ingest/incident_tracker.h"
#include "ingest/rollback.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/wire/event.h"
#include "trainwatch/wire/step_report.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

// Percentile of a sorted vector (nearest rank).
double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(sorted.size() - 1, i)];
}

}  // namespace

int64_t IncidentAttempt(const IncidentRow& inc, int64_t current_attempt) {
  if (inc.state == IncidentState::kRollingBack || inc.state == IncidentState::kResolved) {
    return std::max<int64_t>(0, current_attempt - 1);
  }
  return current_attempt;
}

void BuildSummary(const SummaryInputs& in, v1::DiagnosticSummary* s) {
  const IncidentRow& inc = in.incident;
  std::string explanation;
  for (const EventRow& e : in.events) {
    wire::EventToProto(e.event, s->add_fired());
    absl::StrAppend(&explanation, explanation.empty() ? "" : "\n", "step ", e.event.step, ": ",
                    e.event.reason);
  }
  if (inc.observed) absl::StrAppend(&explanation, explanation.empty() ? "" : "\n", ObservedNote(inc));
  s->set_explanation(explanation);
  s->set_onset_step(inc.onset_step);
  s->set_detection_step(inc.detection_step);
  const size_t n = in.steps.size();
  const size_t stride = std::max<size_t>(1, n / 200);
  std::vector<double> window;
  int64_t window_first = -1;
  for (size_t i = 0; i < n; ++i) {
    const StepRow& st = in.steps[i];
    if (i % stride == 0 && st.Has(core::Signal::kLogZ)) {
      auto* p = s->add_log_z_trend();
      p->set_step(st.step);
      p->set_value(st.Get(core::Signal::kLogZ));
    }
    if (st.step >= inc.onset_step - 200 && st.step <= inc.onset_step + 200) {
      if (st.Has(core::Signal::kLoss)) {
        auto* p = s->add_loss_around_onset();
        p->set_step(st.step);
        p->set_value(st.Get(core::Signal::kLoss));
      }
      if (!std::isnan(st.loss_ema_ratio)) {
        auto* p = s->add_loss_ema_ratio_around_onset();
        p->set_step(st.step);
        p->set_value(st.loss_ema_ratio);
      }
    }
    // Grad-norm percentiles per 1,000-step window before the onset.
    if (st.step < inc.onset_step && st.Has(core::Signal::kGradNorm) &&
        std::isfinite(st.Get(core::Signal::kGradNorm))) {
      if (window_first < 0) window_first = st.step;
      window.push_back(st.Get(core::Signal::kGradNorm));
    }
    const bool window_ends = window_first >= 0 && (st.step - window_first >= 999 ||
                                                   i + 1 == n || st.step + 1 >= inc.onset_step);
    if (window_ends && !window.empty()) {
      std::sort(window.begin(), window.end());
      auto* w = s->add_grad_norm_percentiles();
      w->set_first_step(window_first);
      w->set_last_step(st.step);
      w->set_p50(Percentile(window, 0.50));
      w->set_p90(Percentile(window, 0.90));
      w->set_p99(Percentile(window, 0.99));
      w->set_max(window.back());
      w->set_sample_count(window.size());
      window.clear();
      window_first = -1;
    }
    if (st.step >= inc.onset_step && (!st.shards.empty() || !st.shard_names.empty())) {
      auto* ss = s->add_shards_onset_to_detection();
      ss->set_step(st.step);
      for (uint64_t id : st.shards) ss->add_shard_ids(id);
      for (const std::string& name : st.shard_names) ss->add_names(name);
    }
  }
  if (inc.tier == 3) {
    std::map<std::string, v1::TensorBreakdown> by_name;
    for (const RankStepRow& rk : in.onset_ranks) {
      v1::StepReport proto;
      if (!proto.ParseFromString(rk.report)) continue;
      const wire::ReportedStep rep = wire::StepFromProto(proto);
      if (rep.nonfinite == 0) continue;
      s->add_nonfinite_ranks(rk.rank);
      for (const core::TensorStat& t : rep.tensors) {
        v1::TensorBreakdown& b = by_name[std::string(t.name)];
        b.set_name(std::string(t.name));
        b.set_nonfinite_count(b.nonfinite_count() + static_cast<uint64_t>(t.nonfinite));
        b.set_element_count(b.element_count() + static_cast<uint64_t>(t.elements));
        b.set_first_step(inc.onset_step);
        b.add_ranks(rk.rank);
      }
    }
    for (auto& [name, b] : by_name) *s->add_tensor_breakdown() = std::move(b);
  }
  for (uint64_t id : inc.shards) s->mutable_suspect_shards()->add_shard_ids(id);
  if (!inc.shards.empty()) {
    auto* range = s->mutable_suspect_shards()->add_ranges();
    range->set_first(inc.shards.front());
    range->set_last(inc.shards.back());
  }
  for (const std::string& name : inc.shard_names) s->mutable_suspect_shards()->add_names(name);
  if (inc.recommended_checkpoint_step >= 0) {
    s->mutable_recommended_checkpoint()->set_step(inc.recommended_checkpoint_step);
    s->mutable_recommended_checkpoint()->set_uri(inc.recommended_checkpoint_uri);
  }
  std::string flags;
  for (const core::RecommendedAction& a : inc.actions) {
    wire::ActionToProto(a, s->add_recommended_actions());
    if (a.kind == core::RecommendedAction::Kind::kQuarantineShards) {
      // The list as twctl reads it, quoted for the shell when a name holds
      // more than [A-Za-z0-9._:/=+,-] (' is closed, escaped and reopened).
      std::vector<std::string> entries;
      if (a.has_shard_range) entries.push_back(absl::StrCat(a.shard_first, "..", a.shard_last));
      for (const std::string& name : a.shard_names) entries.push_back(core::ShardListEntry(name));
      const std::string list = absl::StrJoin(entries, ",");
      const bool plain = absl::c_all_of(list, [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
               absl::string_view("._:/=+,-").find(c) != absl::string_view::npos;
      });
      absl::StrAppend(&flags, " --quarantine-shards ",
                      plain ? list
                            : absl::StrCat("'", absl::StrReplaceAll(list, {{"'", "'\\''"}}), "'"));
    } else if (a.kind == core::RecommendedAction::Kind::kSetZLossAlpha) {
      absl::StrAppendFormat(&flags, " --z-loss-alpha %g", a.z_loss_alpha);
    }
  }
  // What an approval does by default besides the shards: every rank skips
  // the batches it served around the spike (the shards above are rank 0's).
  if (auto skip = DefaultSkipSteps(inc, inc.recommended_checkpoint_step,
                                   in.steps_before_onset)) {
    v1::RecommendedAction* ra = s->add_recommended_actions();
    ra->set_kind(v1::ACTION_KIND_SKIP_STEPS);
    ra->mutable_steps()->set_first(skip->first);
    ra->mutable_steps()->set_last(skip->second);
    ra->set_description(absl::StrFormat("skip the batches of steps %d..%d on every rank",
                                        skip->first, skip->second));
  }
  if (inc.tier >= 2 && inc.recommended_checkpoint_step >= 0) {
    s->set_approve_command(absl::StrCat("twctl rollback approve ", inc.public_id(), " --to-step ",
                                        inc.recommended_checkpoint_step, flags,
                                        " --comment \"...\""));
  } else if (inc.tier >= 2) {
    // An approval needs a retained checkpoint: suggesting one would be
    // refused.
    s->set_no_rollback(absl::StrCat(
        "no rollback can be approved: trainwatchd keeps no checkpoint of run ", inc.run_id,
        " from before step ", inc.onset_step,
        ". Checkpoints reach it from the agent (Agent.report_checkpoint), from trainwatch run "
        "(torch.save and torch.distributed.checkpoint), and from twctl follow (Megatron's and "
        "nanoGPT's save lines, a checkpoint column, --checkpoint-pattern). Without one, `twctl "
        "rollback reject ",
        inc.public_id(), " --comment \"...\"` records the decision and dismisses it"));
  }
  wire::SetTime(in.now_ms, s->mutable_generated_at());
}

}  // namespace trainwatch::server
