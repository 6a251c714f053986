#include "trainwatch/wire/client_tls.h"

#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainwatch/core/file_system.h"

namespace trainwatch::wire {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The file's PEM text; `what` ("CA file") leads the error.
absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  absl::StatusOr<std::string> text = core::LocalFileSystem().ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  // gRPC would take anything and fail the handshake later, naming nothing.
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " holds no PEM block (-----BEGIN ...)"));
  }
  return text;
}

}  // namespace

ClientTlsFiles TlsFilesFromEnvironment() {
  return {Env("TRAINWATCH_CA_FILE"), Env("TRAINWATCH_CERT_FILE"), Env("TRAINWATCH_KEY_FILE")};
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ClientTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        files.cert_file.empty()
            ? absl::StrCat("a client key (", files.key_file, ") needs its certificate too")
            : absl::StrCat("a client certificate (", files.cert_file, ") needs its key too"));
  }
  if (files.ca_file.empty() && files.cert_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  struct Read {
    const char* what;
    const std::string& path;
    std::string* pem;
  };
  for (const Read& r : {Read{"CA file", files.ca_file, &ssl.pem_root_certs},
                        Read{"client certificate", files.cert_file, &ssl.pem_cert_chain},
                        Read{"client key", files.key_file, &ssl.pem_private_key}}) {
    if (r.path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadPem(r.what, r.path);
    if (!pem.ok()) return pem.status();
    *r.pem = *std::move(pem);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace trainwatch::wire
