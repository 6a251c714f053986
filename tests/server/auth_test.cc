// Token file parsing and the role checks, without a network.

#include <string>

#include <catch2/catch.hpp>

#include "admission/auth.h"
#include "core/fake_file_system.h"

namespace trainwatch::server {
namespace {

constexpr char kTokens[] = R"({"tokens": [
  {"name": "trainer-a", "token": "agent-token-run-a-0123", "role": "agent", "runs": ["run-a"]},
  {"name": "ci", "token": "agent-token-all-runs-01", "role": "agent"},
  {"name": "grafana", "token": "reader-token-012345678", "role": "reader"},
  {"name": "oncall", "token": "operator-token-0123456", "role": "operator"}]})";

TEST_CASE("auth: roles allow exactly their methods", "[server][auth]") {
  auto a = Authenticator::FromJson(kTokens, "tokens.json");
  REQUIRE(a.ok());
  CHECK(a->enabled());
  auto code = [&](const std::string& header, Access access) {
    return a->Check(header, access).status().code();
  };
  using absl::StatusCode;
  for (Access acc : {Access::kAgentStream, Access::kRead, Access::kApprove}) {
    CHECK(code("", acc) == StatusCode::kUnauthenticated);
    CHECK(code("Bearer nope-nope-nope-nope", acc) == StatusCode::kUnauthenticated);
    CHECK(code("Basic agent-token-all-runs-01", acc) == StatusCode::kUnauthenticated);
  }
  CHECK(code("Bearer agent-token-all-runs-01", Access::kAgentStream) == StatusCode::kOk);
  CHECK(code("Bearer agent-token-all-runs-01", Access::kRead) == StatusCode::kPermissionDenied);
  CHECK(code("Bearer agent-token-all-runs-01", Access::kApprove) ==
        StatusCode::kPermissionDenied);
  CHECK(code("Bearer reader-token-012345678", Access::kAgentStream) ==
        StatusCode::kPermissionDenied);
  CHECK(code("Bearer reader-token-012345678", Access::kRead) == StatusCode::kOk);
  CHECK(code("Bearer reader-token-012345678", Access::kApprove) == StatusCode::kPermissionDenied);
  CHECK(code("Bearer operator-token-0123456", Access::kAgentStream) ==
        StatusCode::kPermissionDenied);
  CHECK(code("Bearer operator-token-0123456", Access::kRead) == StatusCode::kOk);
  CHECK(code("bearer operator-token-0123456", Access::kApprove) == StatusCode::kOk);

  auto scoped = a->Check("Bearer agent-token-run-a-0123", Access::kAgentStream);
  REQUIRE(scoped.ok());
  CHECK(scoped->MayReport("run-a"));
  CHECK_FALSE(scoped->MayReport("run-b"));
  auto any = a->Check("Bearer agent-token-all-runs-01", Access::kAgentStream);
  REQUIRE(any.ok());
  CHECK(any->MayReport("run-b"));
  // The token never appears in a message.
  CHECK(a->Check("Bearer reader-token-012345678", Access::kApprove).status().message().find(
            "reader-token") == absl::string_view::npos);
}

TEST_CASE("auth: off without a tokens file", "[server][auth]") {
  Authenticator off;
  CHECK_FALSE(off.enabled());
  CHECK(off.Check("", Access::kApprove).ok());
  CHECK(off.Check("", Access::kAgentStream)->MayReport("any"));
}

TEST_CASE("auth: bad token files are clear errors", "[server][auth]") {
  CHECK_FALSE(Authenticator::FromJson("[]", "t").ok());
  CHECK_FALSE(Authenticator::FromJson(R"({"tokens": [{"token": "short", "role": "agent"}]})", "t")
                  .ok());
  auto bad_role = Authenticator::FromJson(
      R"({"tokens": [{"token": "0123456789abcdefgh", "role": "admin"}]})", "t.json");
  REQUIRE_FALSE(bad_role.ok());
  CHECK(std::string(bad_role.status().message()) ==
        "t.json:1:13: role must be agent, reader or operator, not \"admin\"");
  CHECK_FALSE(Authenticator::FromJson(R"({"tokens": [
      {"token": "0123456789abcdefgh", "role": "agent"},
      {"token": "0123456789abcdefgh", "role": "reader"}]})", "t").ok());
  CHECK(Authenticator::FromFile("/nonexistent/tokens.json").status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("auth: reads the tokens file through the file system it is given", "[server][auth]") {
  core::FakeFileSystem fs;
  fs.files["/etc/trainwatch/tokens.json"] = kTokens;
  auto a = Authenticator::FromFile("/etc/trainwatch/tokens.json", fs);
  REQUIRE(a.ok());
  CHECK(a->Check("Bearer reader-token-012345678", Access::kRead)->name == "grafana");
  auto missing = Authenticator::FromFile("/etc/trainwatch/other.json", fs);
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()) ==
        "tokens file: cannot read /etc/trainwatch/other.json");
}

}  // namespace
}  // namespace trainwatch::server
