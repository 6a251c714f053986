// The rules file (trainwatchd --rules, twctl replay --rules): core's JSON
// config reader. A file it accepts must print (--print-config) as JSON that
// reads back to the same rules.

#include "fuzz_target.h"
#include "trainwatch/core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<trainwatch::core::RuleConfig> config =
      trainwatch::core::ParseRuleConfigJson(trainwatch::fuzz::Bytes(data, size), "rules.json");
  if (!config.ok()) return 0;
  FUZZ_CHECK(trainwatch::core::Validate(*config).ok());
  const std::string printed = trainwatch::core::RuleConfigToJson(*config);
  absl::StatusOr<trainwatch::core::RuleConfig> again =
      trainwatch::core::ParseRuleConfigJson(printed, "printed");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(trainwatch::core::RuleConfigToJson(*again) == printed);
  return 0;
}
