#include "ingest/batch.h"

#include <algorithm>
#include <string_view>

namespace trainwatch::server {

void Batch::Ack(uint64_t stream, const std::string& run_id, int32_t rank, int64_t step) {
  auto it = acks.find(std::make_tuple(stream, std::string_view(run_id), rank));
  if (it == acks.end()) {
    acks.emplace(std::make_tuple(stream, run_id, rank), step);
  } else {
    it->second = std::max(it->second, step);
  }
}

void Batch::Clear() {
  rows.clear();
  acks.clear();
  records = 0;
  changed_incidents.clear();
  outgoing.clear();
  ending.clear();
  answers.clear();
}

}  // namespace trainwatch::server
