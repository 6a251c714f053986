// CurlPoster alone, against a local HTTP receiver: what it sends, that a
// non-2xx answer is a response and not an error, and that a dead or silent
// peer is an error that does not repeat the URL (a Slack URL is a secret).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "pager/http_poster.h"
#include "test_util.h"

namespace trainwatch::server {
namespace {

using testing::HttpReceiver;

std::string Url(int port, const std::string& path) {
  return "http://127.0.0.1:" + std::to_string(port) + path;
}

TEST_CASE("http poster: posts the body and headers - a non-2xx answer is a response",
          "[server][pager][http]") {
  HttpReceiver rx;
  rx.FailNext("/down", 1, 503);
  CurlPoster poster;
  const HttpPoster::Headers headers = {{"Content-Type", "application/json"},
                                       {"X-Trainwatch", "yes"}};
  auto ok = poster.Post(Url(rx.port(), "/pages"), headers, "{\"a\":1}", absl::Seconds(10));
  REQUIRE(ok.ok());
  CHECK(ok->status == 200);
  auto down = poster.Post(Url(rx.port(), "/down"), headers, "{}", absl::Seconds(10));
  REQUIRE(down.ok());
  CHECK(down->status == 503);
  auto reqs = rx.requests();  // the receiver records only what it answered 200
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0].path == "/pages");
  CHECK(reqs[0].head.rfind("POST /pages ", 0) == 0);
  CHECK(reqs[0].head.find("Content-Type: application/json") != std::string::npos);
  CHECK(reqs[0].head.find("X-Trainwatch: yes") != std::string::npos);
  CHECK(reqs[0].body == "{\"a\":1}");
  CHECK(DefaultHttpPoster() == DefaultHttpPoster());
}

TEST_CASE("http poster: no listener is an error without the URL", "[server][pager][http]") {
  CurlPoster poster;
  auto r = poster.Post(Url(testing::FreePort(), "/services/T0/B0/secret-token"), {}, "{}",
                       absl::Seconds(10));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(r.status().message()).find("secret-token") == std::string::npos);
  CHECK(std::string(r.status().message()).find("127.0.0.1") == std::string::npos);
}

TEST_CASE("http poster: a peer that never answers times out", "[server][pager][http]") {
  // Listening but never accepting: the kernel completes the connection and
  // takes the request, and no answer ever comes.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  CurlPoster poster;
  const auto start = std::chrono::steady_clock::now();
  auto r = poster.Post(Url(ntohs(addr.sin_port), "/slow"), {}, "{}", absl::Milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - start;
  close(fd);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took >= std::chrono::milliseconds(250));
  CHECK(took < std::chrono::seconds(5));
}

}  // namespace
}  // namespace trainwatch::server
