// The tokens file (trainwatchd --tokens). A file it accepts is then asked
// about a bearer token taken from the same input, for each kind of access.

#include "admission/auth.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input = trainwatch::fuzz::Bytes(data, size);
  absl::StatusOr<trainwatch::server::Authenticator> auth =
      trainwatch::server::Authenticator::FromJson(input, "tokens.json");
  if (!auth.ok()) return 0;
  // Headers a client may send: none, malformed, the seed corpus's tokens,
  // and the input's last 16 bytes (often a prefix or tail of a real token,
  // the comparisons a constant-time check must get right).
  const std::string headers[] = {
      "", "Bearer", "Bearer ", "bearer tok-ci", "Bearer tok-agent-a", "Bearer tok-oncall",
      "Bearer " + std::string(input.substr(input.size() > 16 ? input.size() - 16 : 0))};
  for (const std::string& header : headers) {
    for (auto access : {trainwatch::server::Access::kAgentStream,
                        trainwatch::server::Access::kRead, trainwatch::server::Access::kApprove}) {
      absl::StatusOr<trainwatch::server::Principal> p = auth->Check(header, access);
      if (p.ok()) (void)p->MayReport("run-a");
    }
  }
  return 0;
}
