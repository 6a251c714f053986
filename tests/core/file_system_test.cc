#include "trainwatch/core/file_system.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "core/fake_file_system.h"
#include "testing/temp_dir.h"

namespace trainwatch::core {
namespace {

// A fresh folder, removed with what the test put in it.
class ScratchDir {
 public:
  ScratchDir() : dir_("file_system_test_") { REQUIRE(!dir_.path().empty()); }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }

 private:
  testing::ScopedTempDir dir_;
};

// The read failed with `code` and a message naming `path`.
void CheckFailed(const absl::StatusOr<std::string>& got, absl::StatusCode code,
                 const std::string& path) {
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == code);
  CHECK(std::string(got.status().message()).find(path) != std::string::npos);
}

TEST_CASE("local file system: reads a whole file", "[core][file_system]") {
  ScratchDir dir;
  const std::string text("{\"a\": 1}\n\0binary\xff", 17);
  const std::string path = dir.Write("f.json", text);
  absl::StatusOr<std::string> got = LocalFileSystem().ReadFile(path);
  REQUIRE(got.ok());
  CHECK(*got == text);
  absl::StatusOr<std::string> empty = LocalFileSystem().ReadFile(dir.Write("empty", ""));
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("local file system: a missing path is NOT_FOUND naming it", "[core][file_system]") {
  ScratchDir dir;
  const std::string path = dir.Path("missing.json");
  CheckFailed(LocalFileSystem().ReadFile(path), absl::StatusCode::kNotFound, path);
}

TEST_CASE("local file system: a directory is FAILED_PRECONDITION naming it",
          "[core][file_system]") {
  ScratchDir dir;
  ::mkdir(dir.Path("sub").c_str(), 0755);
  absl::StatusOr<std::string> got = LocalFileSystem().ReadFile(dir.Path("sub"));
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(got.status().message()) ==
        "cannot read " + dir.Path("sub") + ": it is a directory");
}

TEST_CASE("local file system: an unreadable file is PERMISSION_DENIED", "[core][file_system]") {
  if (::geteuid() == 0) {
    WARN("running as root, which reads any file: skipped");
    return;
  }
  ScratchDir dir;
  const std::string path = dir.Write("secret", "x");
  ::chmod(path.c_str(), 0);
  CheckFailed(LocalFileSystem().ReadFile(path), absl::StatusCode::kPermissionDenied, path);
}

TEST_CASE("local file system: a file over the limit is RESOURCE_EXHAUSTED",
          "[core][file_system]") {
  ScratchDir dir;
  const std::string path = dir.Write("big", std::string(100, 'x'));
  CHECK(LocalFileSystem(100).ReadFile(path).ok());
  CheckFailed(LocalFileSystem(99).ReadFile(path), absl::StatusCode::kResourceExhausted, path);
}

TEST_CASE("local file system: reads a pipe (no size) to its end",
          "[core][file_system]") {
  ScratchDir dir;
  const std::string fifo = dir.Path("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The writer runs in the background: opening a FIFO blocks until both
  // ends are open.
  REQUIRE(std::system(("printf 'piped' > " + fifo + " &").c_str()) == 0);
  absl::StatusOr<std::string> got = LocalFileSystem().ReadFile(fifo);
  REQUIRE(got.ok());
  CHECK(*got == "piped");
}

TEST_CASE("fake file system: serves its map and NOT_FOUND otherwise", "[core][file_system]") {
  FakeFileSystem fs;
  fs.files["/etc/a"] = "alpha";
  REQUIRE(fs.ReadFile("/etc/a").ok());
  CHECK(*fs.ReadFile("/etc/a") == "alpha");
  CHECK(fs.ReadFile("/etc/b").status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainwatch::core
