// RuleEngine::SaveState / FromState: the engine's whole state as a binary
// blob, for the server's engine snapshots (server/ingest/engine_snapshots.cc).
//
// Layout, every integer little-endian:
//   "TWES" | u32 version | u64 checksum of the payload | payload
//   checksum: FNV-1a over the payload's 8-byte little-endian words, then
//   over its last bytes one by one
//   payload: the rule config as RuleConfigToJson prints it, then each field
//   of EngineState in declaration order.
// Why the config travels whole: an engine built under other rules would make
// other decisions from the same windows, so a snapshot is only good for the
// exact config it was built under, and comparing the printed config is exact
// where a hash could collide. Rings whose size the config fixes are checked
// against the fresh engine's, and every index is checked against its ring, so
// a damaged blob that still passes the checksum cannot make the engine read
// out of bounds. Bump kVersion whenever EngineState or a window changes shape.

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

constexpr char kMagic[4] = {'T', 'W', 'E', 'S'};
// 2: windows of up to SlidingMedian::kSortedMaxWindow samples are held
// sorted. 3: each shard step keeps its own ids only, not its whole stride of
// max_shards_per_step (a third of the blob under the default rules, written
// every engine_snapshot_steps per run), and the checksum takes a word at a
// time. 4: the warm-up divergence state. An older blob is refused, and the
// engine is rebuilt by replay.
constexpr uint32_t kVersion = 5;
constexpr size_t kHeaderBytes = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint64_t);

uint64_t LittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

// FNV-1a by words: a byte at a time, the multiply chain was most of the cost
// of saving a few hundred kilobytes. A damaged blob is still caught: every
// step of the chain is a bijection of the word it takes in.
uint64_t Checksum(absl::string_view bytes) {
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) h = (h ^ LittleEndian64(bytes.data() + i)) * kPrime;
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * kPrime;
  return h;
}

class Writer {
 public:
  void U64(uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_.append(b, sizeof b);
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void F64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    U64(bits);
  }
  void Bool(bool v) { out_.push_back(v ? 1 : 0); }
  void Str(absl::string_view s) {
    U64(s.size());
    out_.append(s.data(), s.size());
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Reads what Writer wrote; the first failure sticks, naming the field.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  uint64_t U64(const char* what) {
    if (!Need(8, what)) return 0;
    const uint64_t v = LittleEndian64(in_.data() + pos_);
    pos_ += 8;
    return v;
  }
  int64_t I64(const char* what) { return static_cast<int64_t>(U64(what)); }
  double F64(const char* what) {
    const uint64_t bits = U64(what);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  bool Bool(const char* what) {
    if (!Need(1, what)) return false;
    const char c = in_[pos_++];
    if (c != 0 && c != 1) Fail(what, "is not a boolean");
    return c == 1;
  }
  std::string Str(const char* what) {
    const uint64_t n = U64(what);
    if (!Need(n, what)) return {};
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // A count of elements of at least `min_bytes` each, bounded by what is left.
  size_t Count(const char* what, size_t min_bytes, size_t max) {
    const uint64_t n = U64(what);
    if (ok() && (n > max || n > (in_.size() - pos_) / std::max<size_t>(1, min_bytes))) {
      Fail(what, absl::StrCat("count ", n, " is out of range"));
      return 0;
    }
    return static_cast<size_t>(n);
  }
  // An index into a ring or heap of `size` elements.
  size_t Index(const char* what, size_t size, bool inclusive = false) {
    const uint64_t v = U64(what);
    if (ok() && (inclusive ? v > size : v >= size)) {
      Fail(what, absl::StrCat(v, " is out of range for ", size));
      return 0;
    }
    return static_cast<size_t>(v);
  }
  void Expect(bool cond, const char* what, absl::string_view why) {
    if (ok() && !cond) Fail(what, why);
  }
  void Fail(const char* what, absl::string_view why) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("engine snapshot: ", what, " at byte ", pos_ + kHeaderBytes, " ", why));
    }
  }
  bool ok() const { return status_.ok(); }
  bool done() const { return pos_ == in_.size(); }
  const absl::Status& status() const { return status_; }

 private:
  bool Need(uint64_t n, const char* what) {
    if (!ok()) return false;
    if (n > in_.size() - pos_) {
      Fail(what, "is truncated");
      return false;
    }
    return true;
  }
  absl::string_view in_;
  size_t pos_ = 0;
  absl::Status status_;
};

}  // namespace

// The windows' private state (windows.h makes this a friend).
struct StateCodec {
  static void Save(const DecayingMean& m, Writer& w) {
    w.F64(m.num_);
    w.F64(m.den_);
    w.I64(m.last_step_);
    w.I64(m.count_);
  }
  static void Load(DecayingMean& m, Reader& r) {
    m.num_ = r.F64("decaying mean");
    m.den_ = r.F64("decaying mean");
    m.last_step_ = r.I64("decaying mean");
    m.count_ = r.I64("decaying mean");
  }

  // The ring keeps each sample's step and where it is; the parts keep the
  // values (windows.h), so all are written as they are. The sorted form
  // writes each slot's step and value and the sorted array as it is (equal
  // values of different bits, 0.0 and -0.0, keep their order).
  static void Save(const SlidingMedian& m, Writer& w) {
    w.U64(m.ring_.size());
    if (m.sorted_form_) {
      for (size_t i = 0; i < m.ring_.size(); ++i) {
        w.I64(m.ring_[i].step);
        w.F64(m.values_[i]);
      }
      w.U64(m.head_);
      w.U64(m.count_);
      for (size_t i = 0; i < m.count_; ++i) w.F64(m.sorted_[i]);
      return;
    }
    for (const SlidingMedian::Slot& s : m.ring_) {
      w.I64(s.step);
      w.I64(s.pos);
      w.U64(s.part);
    }
    w.U64(m.head_);
    w.U64(m.count_);
    for (const auto* part : {&m.low_, &m.mid_, &m.high_}) {
      w.U64(part->size());
      for (const SlidingMedian::Entry& e : *part) {
        w.F64(e.value);
        w.I64(e.slot);
      }
    }
  }
  static void Load(SlidingMedian& m, Reader& r) {
    const size_t n = r.Count("median ring", 17, m.ring_.size());
    r.Expect(n == m.ring_.size(), "median ring", "does not match the rules' window");
    if (!r.ok()) return;
    if (m.sorted_form_) {
      LoadSorted(m, r);
      return;
    }
    for (SlidingMedian::Slot& s : m.ring_) {
      s.step = r.I64("median slot");
      s.pos = static_cast<int32_t>(r.Index("median slot position", n));
      s.part = static_cast<uint8_t>(r.Index("median slot part", 3));
    }
    m.head_ = r.Index("median head", n);
    m.count_ = r.Index("median count", n, /*inclusive=*/true);
    using Part = SlidingMedian::Part;
    const std::pair<std::vector<SlidingMedian::Entry>*, Part> parts[] = {
        {&m.low_, Part::kInLow}, {&m.mid_, Part::kInMid}, {&m.high_, Part::kInHigh}};
    size_t held = 0;
    for (const auto& [part, kind] : parts) {
      const size_t cap = kind == Part::kInMid ? SlidingMedian::kMidCapacity : n;
      const size_t k = r.Count("median part", 16, cap);
      part->clear();
      for (size_t i = 0; i < k && r.ok(); ++i) {
        SlidingMedian::Entry e;
        e.value = r.F64("median part value");
        e.slot = static_cast<int32_t>(r.Index("median part slot", n));
        part->push_back(e);
      }
      held += k;
    }
    r.Expect(held == m.count_, "median parts", "do not hold the live samples");
    if (!r.ok()) return;
    // Each live slot must be where its part says, the heaps no larger than
    // their reserve, and the middle ranks inside the sorted run, or a later
    // update would corrupt the parts or read past the run.
    const size_t half = m.ring_.size() / 2 + 2;
    r.Expect(m.low_.size() <= half && m.high_.size() <= half, "median heaps",
             "hold more than half the window");
    bool placed = true;
    for (const auto& [part, kind] : parts) {
      for (size_t i = 0; i < part->size(); ++i) {
        const SlidingMedian::Slot& s = m.ring_[static_cast<size_t>((*part)[i].slot)];
        placed &= s.part == kind && (kind == Part::kInMid || static_cast<size_t>(s.pos) == i);
        if (kind == Part::kInMid && i > 0) placed &= m.mid_[i - 1].value <= m.mid_[i].value;
      }
    }
    r.Expect(placed, "median parts", "disagree with their slots");
    if (m.count_ > 0) {
      r.Expect(m.low_.size() <= (m.count_ - 1) / 2 &&
                   m.count_ / 2 < m.low_.size() + m.mid_.size(),
               "median run", "does not hold the middle ranks");
    }
  }
  static void LoadSorted(SlidingMedian& m, Reader& r) {
    const size_t n = m.ring_.size();
    for (size_t i = 0; i < n; ++i) {
      m.ring_[i].step = r.I64("median slot");
      m.values_[i] = r.F64("median slot value");
    }
    m.head_ = r.Index("median head", n);
    m.count_ = r.Index("median count", n, /*inclusive=*/true);
    if (!r.ok()) return;
    for (size_t i = 0; i < m.count_; ++i) m.sorted_[i] = r.F64("median sorted value");
    if (!r.ok()) return;
    // The array must be the live values in order, or a later replacement
    // would look for a value that is not there.
    std::vector<double> live;
    live.reserve(m.count_);
    for (size_t i = 0; i < m.count_; ++i) live.push_back(m.values_[m.Wrap(m.head_ + i)]);
    std::sort(live.begin(), live.end());
    bool same = true;
    for (size_t i = 0; i < m.count_; ++i) {
      same &= live[i] == m.sorted_[i] && (i == 0 || m.sorted_[i - 1] <= m.sorted_[i]);
    }
    r.Expect(same, "median sorted values", "are not the live values in order");
  }

  static void Save(const SlidingMin& m, Writer& w) {
    w.U64(m.ring_.size());
    for (const SlidingMin::Entry& e : m.ring_) {
      w.I64(e.step);
      w.F64(e.value);
    }
    w.U64(m.head_);
    w.U64(m.count_);
    w.I64(m.first_step_seen_);
  }
  static void Load(SlidingMin& m, Reader& r) {
    const size_t n = r.Count("minimum ring", 16, m.ring_.size());
    r.Expect(n == m.ring_.size(), "minimum ring", "does not match the rules' window");
    if (!r.ok()) return;
    for (SlidingMin::Entry& e : m.ring_) {
      e.step = r.I64("minimum entry");
      e.value = r.F64("minimum entry");
    }
    m.head_ = r.Index("minimum head", n);
    m.count_ = r.Index("minimum count", n, /*inclusive=*/true);
    m.first_step_seen_ = r.I64("minimum first step");
  }

  static void Save(const BucketSeries& b, Writer& w) {
    w.U64(b.ring_.size());
    for (const BucketSeries::Bucket& k : b.ring_) {
      w.I64(k.index);
      w.I64(k.count);
      w.F64(k.sum);
      w.F64(k.min);
      w.F64(k.max);
    }
    w.I64(b.newest_);
  }
  static void Load(BucketSeries& b, Reader& r) {
    const size_t n = r.Count("bucket ring", 40, b.ring_.size());
    r.Expect(n == b.ring_.size(), "bucket ring", "does not match the rules' history");
    if (!r.ok()) return;
    for (BucketSeries::Bucket& k : b.ring_) {
      k.index = r.I64("bucket");
      k.count = r.I64("bucket");
      k.sum = r.F64("bucket");
      k.min = r.F64("bucket");
      k.max = r.F64("bucket");
    }
    b.newest_ = r.I64("newest bucket");
    // Below -1 it would index before the ring; past max / width the fast
    // path's (newest + 1) * width would overflow.
    r.Expect(b.newest_ >= -1 && b.newest_ < std::numeric_limits<int64_t>::max() / b.width_ - 1,
             "newest bucket", "is out of range");
    if (r.ok() && b.newest_ >= 0) {
      b.newest_slot_ = static_cast<size_t>(b.newest_ % static_cast<int64_t>(b.ring_.size()));
    }
  }

  static void Save(const EngineState& s, Writer& w) {
    for (const DecayingMean* m : {&s.ema, &s.dev_mean, &s.dev_sq, &s.smooth_loss, &s.smooth_logz}) {
      Save(*m, w);
    }
    Save(s.grad_median, w);
    Save(s.logz_min_short, w);
    Save(s.logz_min_long, w);
    for (const BucketSeries* b : {&s.logz_buckets, &s.grad_hist, &s.attn_hist, &s.act_hist}) {
      Save(*b, w);
    }
    Save(s.transient_base, w);
    Save(s.transient_dev, w);
    w.U64(s.transient_short.size());
    for (const auto& [step, loss] : s.transient_short) {
      w.I64(step);
      w.F64(loss);
    }
    w.U64(s.transient_head);
    w.U64(s.transient_count);
    w.F64(s.transient_sum);
    w.I64(s.transient_records);
    w.Bool(s.transient_active);

    // Each step's own ids after its entry: the rest of its stride in the
    // ring is never read.
    const size_t per = static_cast<size_t>(s.c.max_shards_per_step);
    w.U64(s.shard_steps.size());
    for (size_t i = 0; i < s.shard_steps.size(); ++i) {
      const ShardEntry& e = s.shard_steps[i];
      w.I64(e.step);
      w.U64(e.count);
      w.Bool(e.truncated);
      for (size_t k = 0; k < e.count; ++k) w.U64(s.shard_ids[i * per + k]);
    }
    w.U64(s.shard_head);
    w.U64(s.shard_count);
    w.U64(s.shard_name_steps.size());
    for (const NamedShardEntry& e : s.shard_name_steps) {
      w.I64(e.step);
      w.Bool(e.truncated);
      w.U64(e.names.size());
      for (const std::string& n : e.names) w.Str(n);
    }
    w.U64(s.shard_name_bytes);
    w.U64(s.checkpoints.size());
    for (const Checkpoint& c : s.checkpoints) {
      w.I64(c.step);
      w.Str(c.uri);
    }

    for (int64_t v : {s.first_step, s.last_step, s.pending_grad_step}) w.I64(v);
    w.F64(s.pending_grad);
    w.U64(s.ever_present);
    w.I64(s.above_start);
    w.F64(s.above_start_level);
    for (int64_t v : {s.above_steps, s.above_records, s.below_records, s.prev_loss_step,
                      s.high_ratio_records, s.high_ratio_start}) {
      w.I64(v);
    }
    w.F64(s.warm_min_loss);
    w.I64(s.warm_high_records);
    w.I64(s.warm_high_start);
    w.Bool(s.warm_paged);
    const Episode& ep = s.ep;
    w.Bool(ep.active);
    w.U64(ep.id);
    w.I64(ep.onset);
    w.F64(ep.pre_level);
    w.I64(ep.tier);
    w.Bool(ep.tier1);
    w.I64(ep.tier1_step);
    for (bool b : {ep.spike, ep.paged, ep.confirmed}) w.Bool(b);
    w.F64(ep.peak_excess);
    w.I64(ep.records);
    w.U64(s.next_episode);
    w.Bool(s.t3_active);
    w.I64(s.t3_clean);
    w.I64(s.overflow_run);
    for (bool b : s.warn_active) w.Bool(b);
  }

  static void Load(EngineState& s, Reader& r) {
    for (DecayingMean* m : {&s.ema, &s.dev_mean, &s.dev_sq, &s.smooth_loss, &s.smooth_logz}) {
      Load(*m, r);
    }
    Load(s.grad_median, r);
    Load(s.logz_min_short, r);
    Load(s.logz_min_long, r);
    for (BucketSeries* b : {&s.logz_buckets, &s.grad_hist, &s.attn_hist, &s.act_hist}) {
      Load(*b, r);
    }
    Load(s.transient_base, r);
    Load(s.transient_dev, r);
    const size_t tn = r.Count("transient ring", 16, s.transient_short.size());
    r.Expect(tn == s.transient_short.size(), "transient ring", "does not match the rules");
    if (!r.ok()) return;
    for (auto& [step, loss] : s.transient_short) {
      step = r.I64("transient sample");
      loss = r.F64("transient sample");
    }
    s.transient_head = r.Index("transient head", std::max<size_t>(1, tn));
    s.transient_count = r.Index("transient count", tn, /*inclusive=*/true);
    s.transient_sum = r.F64("transient sum");
    s.transient_records = r.I64("transient records");
    s.transient_active = r.Bool("transient state");

    const size_t steps = r.Count("shard steps", 17, s.shard_steps.size());
    r.Expect(steps == s.shard_steps.size(), "shard steps", "do not match the rules");
    if (!r.ok()) return;
    const size_t per = static_cast<size_t>(s.c.max_shards_per_step);
    for (size_t i = 0; i < steps && r.ok(); ++i) {
      ShardEntry& e = s.shard_steps[i];
      e.step = r.I64("shard step");
      e.count = static_cast<uint32_t>(r.Index("shard step count", per, /*inclusive=*/true));
      e.truncated = r.Bool("shard step");
      for (size_t k = 0; k < e.count; ++k) s.shard_ids[i * per + k] = r.U64("shard id");
    }
    s.shard_head = r.Index("shard head", std::max<size_t>(1, steps));
    s.shard_count = r.Index("shard count", steps, /*inclusive=*/true);
    const size_t named =
        r.Count("named shard steps", 17, static_cast<size_t>(s.c.shard_history_steps));
    s.shard_name_steps.clear();
    for (size_t i = 0; i < named && r.ok(); ++i) {
      NamedShardEntry e;
      e.step = r.I64("named shard step");
      e.truncated = r.Bool("named shard step");
      const size_t k = r.Count("shard names", 8, per);
      for (size_t j = 0; j < k && r.ok(); ++j) e.names.push_back(r.Str("shard name"));
      s.shard_name_steps.push_back(std::move(e));
    }
    s.shard_name_bytes = r.U64("shard name bytes");
    r.Expect(s.shard_name_bytes <= static_cast<uint64_t>(s.c.shard_name_history_bytes),
             "shard name bytes", "exceed the rules' budget");
    const size_t cks =
        r.Count("checkpoints", 16, static_cast<size_t>(s.c.checkpoints_retained));
    s.checkpoints.clear();
    for (size_t i = 0; i < cks && r.ok(); ++i) {
      Checkpoint c;
      c.step = r.I64("checkpoint");
      c.uri = r.Str("checkpoint uri");
      s.checkpoints.push_back(std::move(c));
    }

    s.first_step = r.I64("first step");
    s.last_step = r.I64("last step");
    s.pending_grad_step = r.I64("pending grad step");
    s.pending_grad = r.F64("pending grad");
    s.ever_present = static_cast<uint32_t>(r.U64("signals seen"));
    s.above_start = r.I64("spike start");
    s.above_start_level = r.F64("spike level");
    s.above_steps = r.I64("spike steps");
    s.above_records = r.I64("spike records");
    s.below_records = r.I64("spike gap");
    s.prev_loss_step = r.I64("previous loss step");
    s.high_ratio_records = r.I64("high ratio records");
    s.high_ratio_start = r.I64("high ratio start");
    s.warm_min_loss = r.F64("warm-up minimum loss");
    s.warm_high_records = r.I64("warm-up high records");
    s.warm_high_start = r.I64("warm-up high start");
    s.warm_paged = r.Bool("warm-up paged");
    Episode& ep = s.ep;
    ep.active = r.Bool("episode");
    ep.id = r.U64("episode id");
    ep.onset = r.I64("episode onset");
    ep.pre_level = r.F64("episode level");
    ep.tier = static_cast<int>(r.I64("episode tier"));
    ep.tier1 = r.Bool("episode tier 1");
    ep.tier1_step = r.I64("episode tier 1 step");
    ep.spike = r.Bool("episode spike");
    ep.paged = r.Bool("episode paged");
    ep.confirmed = r.Bool("episode confirmed");
    ep.peak_excess = r.F64("episode peak");
    ep.records = r.I64("episode records");
    s.next_episode = r.U64("next episode");
    s.t3_active = r.Bool("tier 3 state");
    s.t3_clean = r.I64("tier 3 clean records");
    s.overflow_run = r.I64("overflow run");
    for (bool& b : s.warn_active) b = r.Bool("warning state");
  }
};

std::string RuleEngine::SaveState() const {
  // The payload is written after room for the header, whose checksum is
  // filled in last: no second copy of a few hundred kilobytes.
  Writer out;
  out.bytes().append(kMagic, sizeof kMagic);
  for (int i = 0; i < 4; ++i) out.bytes().push_back(static_cast<char>(kVersion >> (8 * i)));
  out.U64(0);
  out.Str(RuleConfigToJson(s_->c));
  StateCodec::Save(*s_, out);
  std::string& blob = out.bytes();
  const uint64_t sum = Checksum(absl::string_view(blob).substr(kHeaderBytes));
  for (int i = 0; i < 8; ++i) blob[8 + i] = static_cast<char>(sum >> (8 * i));
  return std::move(blob);
}

absl::StatusOr<std::unique_ptr<RuleEngine>> RuleEngine::FromState(const RuleConfig& config,
                                                                  absl::string_view blob) {
  if (blob.size() < kHeaderBytes || std::memcmp(blob.data(), kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine snapshot: not an engine state (", blob.size(), " bytes, no TWES header)"));
  }
  uint32_t version = 0;
  for (int i = 0; i < 4; ++i) {
    version |= static_cast<uint32_t>(static_cast<unsigned char>(blob[4 + i])) << (8 * i);
  }
  if (version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine snapshot: format version ", version, ", this build reads ", kVersion));
  }
  Reader header(blob.substr(8, 8));
  const uint64_t sum = header.U64("checksum");
  const absl::string_view payload = blob.substr(kHeaderBytes);
  if (Checksum(payload) != sum) {
    return absl::InvalidArgumentError("engine snapshot: checksum mismatch (damaged blob)");
  }
  Reader r(payload);
  const std::string rules = r.Str("rule config");
  if (!r.ok()) return r.status();
  if (rules != RuleConfigToJson(config)) {
    return absl::FailedPreconditionError(
        "engine snapshot: built under other rules than the run's (rule config differs)");
  }
  auto engine = std::make_unique<RuleEngine>(config);
  StateCodec::Load(*engine->s_, r);
  if (r.ok() && !r.done()) r.Fail("end of state", "has trailing bytes");
  if (!r.ok()) return r.status();
  return engine;
}

}  // namespace trainwatch::core
