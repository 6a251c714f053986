// The transient: a short loss excursion (tier 0, recorded, never paged),
// measured against the local level (the median of the records before the
// short window) rather than the EMA, which early in a run lags a falling
// loss by more than a real excursion's height.

#include <cmath>

#include "absl/strings/str_format.h"
#include "engine_state.h"

namespace trainwatch::core {

void FeedTransient(EngineState& s, const StepRecord& r, double loss, bool quiet,
                   StepOutcome* out) {
  const RuleConfig& c = s.c;
  const size_t m = s.transient_short.size();
  if (m == 0) return;
  const int64_t idx = s.transient_records++;
  if (s.transient_count == m) {
    // The oldest of the short window moves into the baseline.
    const double y = s.transient_short[s.transient_head].second;
    s.transient_sum -= y;
    s.transient_head = s.transient_head + 1 == m ? 0 : s.transient_head + 1;
    --s.transient_count;
    const double b = s.transient_base.Median();
    if (s.transient_base.size() >= 8) s.transient_dev.Push(idx, std::fabs(y - b));
    s.transient_base.Push(idx, y);
  }
  // Wrapped by a compare, not %: this runs on every record.
  size_t tail = s.transient_head + s.transient_count;
  if (tail >= m) tail -= m;
  s.transient_short[tail] = {r.step, loss};
  ++s.transient_count;
  s.transient_sum += loss;
  const LocalLevel local = ReadLocalLevel(s);
  if (s.transient_count < m || !local.known) return;
  const double b = local.level;
  const double sd = local.noise;
  const double excess = s.transient_sum / static_cast<double>(m) - b;
  const bool cond = excess >= c.spike_delta_nats && excess >= c.transient_z * sd;
  const bool edge = cond && !s.transient_active;
  s.transient_active = cond;
  if (!edge || quiet) return;
  // The onset: the first record of the short window already above the level.
  int64_t onset = r.step;
  for (size_t i = 0; i < m; ++i) {
    const auto& [step, x] = s.transient_short[(s.transient_head + i) % m];
    if (x - b >= c.spike_delta_nats) {
      onset = step;
      break;
    }
  }
  Event& e =
      s.NewEvent(out, r, 0, Action::kRecord, EventKind::kTransient, s.next_episode++, onset);
  e.reason = absl::StrFormat(
      "transient: the last %d loss records average %+.3f nats over the median %.3f of the "
      "%d before them (%.1fx the local noise %.3f); recorded for inspection",
      m, excess, b, c.transient_baseline_records, sd > 0 ? excess / sd : 0.0, sd);
  s.AddEvidence(onset, r.step, RecommendedAction::Kind::kInspectShards, &e);
}

}  // namespace trainwatch::core
