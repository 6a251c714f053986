// Which trainwatchd replica the agent's stream goes to next, among the
// addresses it was given (AgentConfig::server_address). The agent finds the
// serving replica itself instead of through gRPC's round_robin with
// client-side health checks, which Debian's gRPC 1.51 is not known to
// honour: it streams to one address until the stream ends, whatever the
// reason (the server died, its machine is gone and keepalive said so, or it
// refused the stream because it does not own the run), then tries the next.
// Where the stream resumes is the sender's business, the same on every new
// connection: everything after the last acknowledged step is sent again.
//
// One status is not an address's fault: FAILED_PRECONDITION is how a
// serving trainwatchd says a newer launch of the run replaced this one
// (agent.proto), and the agent then stops streaming for good. A non-owning
// replica may answer with it too, so with several addresses it is believed
// only once every address in a row said it: one replica saying it while
// another serves the run moves the agent on. A non-owner should rather
// answer ABORTED (or UNAVAILABLE), which only ever moves the agent on.
//
// Pure policy, no network and no clock. Not thread-safe: the sender's
// writer thread alone uses it.

#ifndef TRAINWATCH_AGENT_SRC_SERVER_ROTATION_H_
#define TRAINWATCH_AGENT_SRC_SERVER_ROTATION_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>
#include <vector>

namespace trainwatch::agent::internal {

class ServerRotation {
 public:
  // What to do after a stream ended.
  struct Next {
    bool replaced = false;  // stop streaming for good
    bool back_off = false;  // wait the sender's backoff before connecting again
  };

  // REQUIRES: `addresses` is not empty.
  explicit ServerRotation(std::vector<std::string> addresses);

  // Where the next stream goes.
  const std::string& address() const { return addresses_[index_]; }
  size_t index() const { return index_; }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // The stream to address() ended with `code`. Moves on to the next
  // address (with one address, stays) and says whether to wait first: with
  // one address always, as a single server's reconnects always did; with
  // several, once per round of addresses, so that a stream lost on one
  // replica goes to the next at once while replicas that all fail are not
  // dialled in a busy loop.
  Next StreamEnded(grpc::StatusCode code);

 private:
  const std::vector<std::string> addresses_;
  size_t index_ = 0;
  size_t refused_in_row_ = 0;  // consecutive FAILED_PRECONDITION ends
  size_t ends_in_round_ = 0;   // ends since the last backoff
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_SERVER_ROTATION_H_
