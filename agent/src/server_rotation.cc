#include "server_rotation.h"

#include <utility>

namespace trainwatch::agent::internal {

ServerRotation::ServerRotation(std::vector<std::string> addresses)
    : addresses_(std::move(addresses)) {}

ServerRotation::Next ServerRotation::StreamEnded(grpc::StatusCode code) {
  Next next;
  if (code == grpc::StatusCode::FAILED_PRECONDITION) {
    if (++refused_in_row_ >= addresses_.size()) {
      next.replaced = true;
      return next;
    }
  } else {
    refused_in_row_ = 0;
  }
  index_ = (index_ + 1) % addresses_.size();
  if (++ends_in_round_ >= addresses_.size()) {
    ends_in_round_ = 0;
    next.back_off = true;
  }
  return next;
}

}  // namespace trainwatch::agent::internal
