// The pager's one HTTP operation, behind an interface so that the pager can
// be tested without a network: POST a body, get the status and the answer.
//
// Thread-safety: implementations are called from the pager's sender thread;
// CurlPoster is safe to share between threads.

#ifndef TRAINWATCH_SERVER_HTTP_POSTER_H_
#define TRAINWATCH_SERVER_HTTP_POSTER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainwatch::server {

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpPoster {
 public:
  using Headers = std::vector<std::pair<std::string, std::string>>;
  virtual ~HttpPoster() = default;
  // Any answer, 2xx or not, is a response; only a transport failure (no
  // connection, `timeout` passed) is an error. An error's message never
  // holds the URL: for Slack the URL is the secret.
  virtual absl::StatusOr<HttpResponse> Post(const std::string& url, const Headers& headers,
                                            const std::string& body,
                                            absl::Duration timeout) = 0;
};

// libcurl.
class CurlPoster final : public HttpPoster {
 public:
  CurlPoster();
  absl::StatusOr<HttpResponse> Post(const std::string& url, const Headers& headers,
                                    const std::string& body, absl::Duration timeout) override;
};

// The process's CurlPoster, never destroyed (the pager's default).
HttpPoster* DefaultHttpPoster();

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_HTTP_POSTER_H_
