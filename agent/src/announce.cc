#include "announce.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/core/event.h"

namespace trainwatch::agent::internal {

std::string WarmUpLine(const core::RuleConfig& rules, absl::string_view source,
                       int64_t first_step, bool warming_up) {
  if (!warming_up) {
    return absl::StrFormat("trainwatch: rules: %s; warm-up over: every rule decides\n", source);
  }
  return absl::StrFormat(
      "trainwatch: rules: %s; warm-up until step %d (and %d loss and grad-norm records): until "
      "then no update is skipped and the baseline rules do not page; a bad batch is recorded, a "
      "loss %gx its lowest value for %d records pages, a NaN halts (docs/rules.md#warm-up)\n",
      source, first_step + rules.warmup_steps,
      std::max(rules.warmup_min_records, rules.warmup_min_grad_samples),
      rules.warmup_divergence_ratio, rules.warmup_divergence_records);
}

std::string WarmUpOverLine(int64_t step) {
  return absl::StrFormat("trainwatch: warm-up over at step %d; every rule decides from here\n",
                         step);
}

std::string OutcomeLines(int64_t step, const core::StepOutcome& outcome, bool observed) {
  std::string out;
  const char* recommended = observed ? " (observed: recommended, not applied)" : "";
  for (const core::Event& e : outcome.events) {
    const bool skip = outcome.verdict.decision == core::Decision::kSkipUpdate &&
                      e.kind == outcome.verdict.rule && e.tier == outcome.verdict.tier;
    const bool warm_up_record = e.tier == 0 && e.kind == core::EventKind::kDataAnomaly;
    if (skip || warm_up_record) {
      absl::StrAppendFormat(&out, "trainwatch: step %d, tier %d%s: %s\n", step, e.tier,
                            skip ? recommended : "", e.reason);
    } else if (e.action == core::Action::kPage) {
      absl::StrAppendFormat(&out, "trainwatch: step %d, tier %d, paged: %s\n", step, e.tier,
                            e.reason);
    }
  }
  if (out.empty() && outcome.verdict.decision == core::Decision::kSkipUpdate) {
    absl::StrAppendFormat(&out, "trainwatch: step %d, tier %d%s: optimizer update skipped\n", step,
                          outcome.verdict.tier, recommended);
  }
  return out;
}

}  // namespace trainwatch::agent::internal
