// The address of trainwatchd as a client names it (AgentConfig::
// server_address, TRAINWATCH_SERVER, Python's Agent(server=...), twctl
// --server): one gRPC target, or several replicas' targets separated by
// commas ("10.0.0.1:7070,10.0.0.2:7070"). Each entry is what a single
// address always was: host:port, [v6-address]:port, a bare host (gRPC's
// default port), or a gRPC URI (unix:/path, unix-abstract:name, ipv4:a:p,
// ipv6:[a]:p, vsock:cid:port, dns:///host:port, any scheme:/...).
//
// A client with several addresses finds the serving replica itself, trying
// them in the order given (the agent: agent/src/server_rotation.h; twctl:
// cli/src/operator_client.cc), rather than through gRPC's round_robin with
// client-side health checks, which Debian's gRPC 1.51 is not known to honour.

#ifndef TRAINWATCH_AGENT_SERVER_ADDRESSES_H_
#define TRAINWATCH_AGENT_SERVER_ADDRESSES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainwatch::agent {

// The addresses of `list`, in its order, each without the blanks around it.
// INVALID_ARGUMENT naming the list, the entry's position and what is wrong
// for an empty list or entry ("a,,b", a trailing comma) or a malformed entry
// (blanks inside it, an empty host, a port that is not 1..65535, an
// unclosed '[', a scheme with nothing after it).
absl::StatusOr<std::vector<std::string>> ParseServerAddresses(absl::string_view list);

// gRPC keepalive for a client's channels (the agent's stream, twctl's
// calls): a ping after this long without reads on a call, and the
// connection closed when its answer takes longer than the timeout, so that
// a server whose machine is gone (no FIN, no RST: writes only fill the
// socket) is noticed in seconds rather than after TCP's retransmission
// timeout. The time is not below trainwatchd's
// GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS (server/daemon/
// server.cc), so the server never counts these pings as abuse and never
// answers GOAWAY too_many_pings, whatever its strike limit. Pings are sent
// only while a call is open (the server permits more).
inline constexpr int kClientKeepaliveTimeMs = 10'000;
inline constexpr int kClientKeepaliveTimeoutMs = 5'000;

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_AGENT_SERVER_ADDRESSES_H_
