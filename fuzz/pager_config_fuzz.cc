// The pager's config file (trainwatchd --pager_config).

#include "fuzz_target.h"
#include "pager/pager.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<trainwatch::server::PagerConfig> config =
      trainwatch::server::ParsePagerConfig(trainwatch::fuzz::Bytes(data, size), "pager.json");
  (void)config;
  return 0;
}
