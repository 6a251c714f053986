// How a client of trainwatchd (the agent, twctl) sets up its channel's
// security, in one place for both: which files, where they come from in the
// environment, and every check made on them before anything connects.
//
//   ca_file              TLS, trusting the server by these roots;
//   cert_file, key_file  mutual TLS: this client's certificate chain and its
//                        private key, for a trainwatchd started with
//                        --tls_client_ca. Given together or not at all.
// None set: plaintext. cert and key without a CA: TLS trusting the system's
// roots.

#ifndef TRAINWATCH_WIRE_CLIENT_TLS_H_
#define TRAINWATCH_WIRE_CLIENT_TLS_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainwatch::wire {

struct ClientTlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// TRAINWATCH_CA_FILE, TRAINWATCH_CERT_FILE and TRAINWATCH_KEY_FILE; a
// variable unset or empty leaves its field empty. The one reader of them:
// the agent's config and twctl's connection each take what it gives.
ClientTlsFiles TlsFilesFromEnvironment();

// The credentials `files` describe. Every named file is read now, so a
// mistake is an error naming the file before any connection (where it would
// otherwise be only a failed handshake): one that is missing, unreadable, a
// directory or holds no PEM block; a cert without its key or a key without
// its cert is InvalidArgument.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ClientTlsFiles& files);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_CLIENT_TLS_H_
