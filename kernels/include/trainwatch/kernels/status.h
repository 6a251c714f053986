// A small status value for the statistics kernels. The kernels build without
// Abseil (a GPU box may have nothing but CUDA, CMake and PyTorch), so they
// carry their own status; the codes have the same numbers as
// absl::StatusCode, so code that uses Abseil converts by a cast.

#ifndef TRAINWATCH_KERNELS_STATUS_H_
#define TRAINWATCH_KERNELS_STATUS_H_

#include <string>
#include <utility>

namespace trainwatch::kernels {

// Same values as absl::StatusCode (and so as grpc::StatusCode).
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK", or "<CODE_NAME>: <message>".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status FailedPreconditionError(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status UnimplementedError(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status InternalError(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}
inline Status UnavailableError(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}

const char* StatusCodeName(StatusCode code);

}  // namespace trainwatch::kernels

// Returns from the enclosing function when `expr` is not OK.
#define TRAINWATCH_KERNELS_RETURN_IF_ERROR(expr)       \
  do {                                                 \
    ::trainwatch::kernels::Status tw_status_ = (expr); \
    if (!tw_status_.ok()) return tw_status_;           \
  } while (0)

#endif  // TRAINWATCH_KERNELS_STATUS_H_
