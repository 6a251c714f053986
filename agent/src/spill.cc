#include "spill.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::agent {

namespace fs = std::filesystem;

namespace {
// Record: u32 length, i64 step, then the bytes.
bool ReadRecord(FILE* f, int64_t* step, std::string* bytes) {
  uint32_t len;
  if (std::fread(&len, sizeof len, 1, f) != 1) return false;
  if (std::fread(step, sizeof *step, 1, f) != 1) return false;
  bytes->resize(len);
  return len == 0 || std::fread(bytes->data(), 1, len, f) == len;
}
}  // namespace

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::Open(const std::string& dir,
                                                             const std::string& prefix,
                                                             size_t max_bytes,
                                                             size_t segment_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("spill folder ", dir, ": ", ec.message()));
  std::unique_ptr<SpillStore> s(new SpillStore());
  s->dir_ = dir;
  s->prefix_ = prefix;
  s->max_bytes_ = max_bytes;
  s->segment_bytes_ = std::max<size_t>(4096, std::min(segment_bytes, max_bytes / 2 + 1));
  // Segments of an earlier process: index them, oldest first.
  std::vector<std::pair<uint64_t, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string head = prefix + ".";
    if (name.rfind(head, 0) != 0 || name.size() < head.size() + 4 ||
        name.substr(name.size() - 6) != ".spill") {
      continue;
    }
    uint64_t seq;
    if (absl::SimpleAtoi(name.substr(head.size(), name.size() - head.size() - 6), &seq)) {
      found.emplace_back(seq, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& [seq, path] : found) {
    Segment seg;
    seg.path = path;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) continue;
    int64_t step;
    std::string bytes;
    while (ReadRecord(f, &step, &bytes)) {
      ++seg.records;
      seg.bytes += 12 + bytes.size();
      seg.max_step = std::max(seg.max_step, step);
    }
    std::fclose(f);
    s->total_bytes_ += seg.bytes;
    s->segments_.push_back(seg);
    s->next_seq_ = seq + 1;
  }
  return s;
}

SpillStore::~SpillStore() {
  if (current_ != nullptr) std::fclose(current_);
}

size_t SpillStore::records() const {
  size_t n = 0;
  for (const Segment& s : segments_) n += s.records;
  return n;
}

absl::Status SpillStore::Roll() {
  if (current_ != nullptr) {
    std::fclose(current_);
    current_ = nullptr;
  }
  Segment seg;
  seg.path = absl::StrFormat("%s/%s.%08d.spill", dir_, prefix_, next_seq_++);
  current_ = std::fopen(seg.path.c_str(), "ab");
  if (current_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create spill file ", seg.path));
  }
  segments_.push_back(seg);
  return absl::OkStatus();
}

absl::Status SpillStore::Append(int64_t step, const std::string& bytes) {
  const size_t need = 12 + bytes.size();
  if (current_ == nullptr || segments_.empty() || segments_.back().bytes + need > segment_bytes_) {
    if (absl::Status s = Roll(); !s.ok()) return s;
  }
  // Over the bound: the oldest segment goes, and its records are counted.
  while (total_bytes_ + need > max_bytes_ && segments_.size() > 1) {
    dropped_ += static_cast<int64_t>(segments_.front().records);
    total_bytes_ -= segments_.front().bytes;
    std::remove(segments_.front().path.c_str());
    segments_.pop_front();
  }
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  if (std::fwrite(&len, sizeof len, 1, current_) != 1 ||
      std::fwrite(&step, sizeof step, 1, current_) != 1 ||
      std::fwrite(bytes.data(), 1, bytes.size(), current_) != bytes.size() ||
      std::fflush(current_) != 0) {
    return absl::UnavailableError(absl::StrCat("spill write failed: ", segments_.back().path));
  }
  Segment& seg = segments_.back();
  seg.bytes += need;
  seg.records++;
  seg.max_step = std::max(seg.max_step, step);
  total_bytes_ += need;
  return absl::OkStatus();
}

absl::Status SpillStore::ForEach(
    const std::function<void(int64_t step, const std::string& bytes)>& fn) {
  if (current_ != nullptr) std::fflush(current_);
  for (const Segment& seg : segments_) {
    FILE* f = std::fopen(seg.path.c_str(), "rb");
    if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot read ", seg.path));
    int64_t step;
    std::string bytes;
    while (ReadRecord(f, &step, &bytes)) fn(step, bytes);
    std::fclose(f);
  }
  return absl::OkStatus();
}

void SpillStore::DiscardUpTo(int64_t step) {
  while (!segments_.empty() && segments_.front().max_step <= step) {
    if (segments_.size() == 1 && current_ != nullptr) {
      std::fclose(current_);
      current_ = nullptr;
    }
    total_bytes_ -= segments_.front().bytes;
    std::remove(segments_.front().path.c_str());
    segments_.pop_front();
  }
}

}  // namespace trainwatch::agent
