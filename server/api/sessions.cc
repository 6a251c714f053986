#include "api/sessions.h"

namespace trainwatch::server {

uint64_t SessionRegistry::Register(std::shared_ptr<Session> s) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  sessions_[id] = std::move(s);
  return id;
}

void SessionRegistry::Unregister(uint64_t id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(id);
}

std::shared_ptr<Session> SessionRegistry::Find(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

bool SessionRegistry::IsOpen(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return sessions_.count(id) > 0;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Sessions(uint64_t id) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [sid, s] : sessions_) {
    if (id == 0 || sid == id) out.push_back(s);
  }
  return out;
}

std::map<std::string, std::set<int32_t>> SessionRegistry::ConnectedRanks() {
  std::map<std::string, std::set<int32_t>> out;
  for (const auto& s : Sessions()) {
    absl::MutexLock lock(&s->mu);
    if (!s->run_id.empty() && !s->done) out[s->run_id].insert(s->rank);
  }
  return out;
}

}  // namespace trainwatch::server
