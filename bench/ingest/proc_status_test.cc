// The procfs readers of the ingest benchmark: the server's written bytes.

#include "proc_status.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "testing/temp_dir.h"

namespace trainwatch::bench {
namespace {

// A file in the test's own temporary folder, removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : dir_("tw-proc-status-"), path_(dir_.path() + "/io") {
    REQUIRE(!dir_.path().empty());
    std::ofstream(path_) << text;
  }
  const std::string& path() const { return path_; }

 private:
  trainwatch::testing::ScopedTempDir dir_;
  std::string path_;
};

TEST_CASE("proc status: the written bytes are wchar of an io file", "[bench][ingest]") {
  TempFile io(
      "rchar: 9123\nwchar: 4567890123\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n"
      "write_bytes: 0\ncancelled_write_bytes: 0\n");
  auto bytes = ReadWrittenBytes(io.path());
  REQUIRE(bytes.ok());
  CHECK(*bytes == 4567890123);

  TempFile damaged("rchar: 1\nwchar: many\n");
  CHECK(ReadWrittenBytes(damaged.path()).status().code() == absl::StatusCode::kDataLoss);
  TempFile without("rchar: 1\n");
  CHECK(ReadWrittenBytes(without.path()).status().code() == absl::StatusCode::kNotFound);
  CHECK(ReadWrittenBytes("/nonexistent/io").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("proc status: a live process's written bytes grow by what it writes", "[bench][ingest]") {
  auto before = ReadWrittenBytesOf(getpid());
  REQUIRE(before.ok());
  TempFile out("");
  const std::string block(1 << 20, 'x');
  {
    std::FILE* f = std::fopen(out.path().c_str(), "w");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(block.data(), 1, block.size(), f) == block.size());
    std::fclose(f);
  }
  auto after = ReadWrittenBytesOf(getpid());
  REQUIRE(after.ok());
  CHECK(*after - *before >= static_cast<int64_t>(block.size()));
}

}  // namespace
}  // namespace trainwatch::bench
