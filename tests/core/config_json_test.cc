#include <malloc.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "trainwatch/core/config.h"
#include "trainwatch/core/json.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::core {
namespace {

TEST_CASE("JSON parser reads values and reports line and column", "[core][json]") {
  auto v = ParseJson(R"({"a": 1.5, "b": [1, -2e3, NaN, -Infinity], "c": "x\"\u00e9",
 "d": null, "e": true})", "t");
  REQUIRE(v.ok());
  CHECK(v->Find("a")->number == 1.5);
  CHECK(v->Find("b")->array.size() == 4);
  CHECK(v->Find("b")->array[1].number == -2000);
  CHECK(std::isnan(v->Find("b")->array[2].number));
  CHECK(std::isinf(v->Find("b")->array[3].number));
  CHECK(v->Find("c")->string == "x\"\xc3\xa9");
  CHECK(v->Find("d")->type == JsonValue::Type::kNull);
  CHECK(v->Find("e")->line == 2);
  CHECK(v->Find("e")->column == 18);

  auto bad = ParseJson("{\"a\": 1,\n  \"b\": 2x}", "f.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) == "f.json:2:9: expected ',' or '}' in object");
  auto dup = ParseJson(R"({"a":1,"a":2})", "d");
  REQUIRE_FALSE(dup.ok());
  CHECK(std::string(dup.status().message()).find("duplicate key") != std::string::npos);
  CHECK_FALSE(ParseJson("[1,", "x").ok());
  CHECK_FALSE(ParseJson("01", "x").ok());
  CHECK_FALSE(ParseJson("1.", "x").ok());
  CHECK_FALSE(ParseJson("\"abc", "x").ok());
  CHECK_FALSE(ParseJson("{} {}", "x").ok());
  CHECK_FALSE(ParseJson(std::string(100, '['), "x").ok());
}

TEST_CASE("JSON writer escapes and round-trips numbers", "[core][json]") {
  std::string out;
  AppendJsonString(&out, "a\"b\\c\n\x01");
  CHECK(out == "\"a\\\"b\\\\c\\n\\u0001\"");
  out.clear();
  AppendJsonNumber(&out, 0.1);
  AppendJsonNumber(&out, 42);
  AppendJsonNumber(&out, NAN);
  CHECK(out == "0.142null");
}

TEST_CASE("the default configuration is the chapter's and valid", "[core][config]") {
  RuleConfig c;
  CHECK(Validate(c).ok());
  CHECK(c.ema_span_steps == 1000);
  CHECK(c.median_window_steps == 5000);
  CHECK(c.spike_delta_nats == 0.1);
  CHECK(c.spike_min_steps == 50);
  CHECK(c.tier1_grad_ratio == 3.0);
  CHECK(c.tier1_loss_ratio == 1.5);
  CHECK(c.skip_loss_ratio == 2.0);
  CHECK(c.tier1_confirm_steps == 200);
  CHECK(c.escalate_steps == 500);
  CHECK(c.tier2_loss_ratio == 2.5);
  CHECK(c.logz_rise == 3.0);
  CHECK(c.logz_rise_window_steps == 300);
  CHECK(c.tier3_loss_nats == 10.0);
  CHECK(c.warn_logz_level == 12.0);
  CHECK(c.warn_logz_rising_steps == 5000);
  CHECK(c.checkpoints_retained == 10);
  CHECK(c.z_loss_alpha_recommended == 1e-4);
}

TEST_CASE("configuration files override - round-trip and reject bad keys", "[core][config]") {
  auto c = ParseRuleConfigJson(R"({"tier1_grad_ratio": 4, "warmup_steps": 10,
    "tier1_skip_on_trigger": false})", "cfg.json");
  REQUIRE(c.ok());
  CHECK(c->tier1_grad_ratio == 4);
  CHECK(c->warmup_steps == 10);
  CHECK_FALSE(c->tier1_skip_on_trigger);

  auto again = ParseRuleConfigJson(RuleConfigToJson(*c), "roundtrip");
  REQUIRE(again.ok());
  CHECK(again->tier1_grad_ratio == 4);
  CHECK(again->median_window_steps == 5000);

  auto unknown = ParseRuleConfigJson("{\n \"tier_one\": 3}", "cfg.json");
  REQUIRE_FALSE(unknown.ok());
  CHECK(std::string(unknown.status().message()) == "cfg.json:2:14: unknown setting \"tier_one\"");
  CHECK_FALSE(ParseRuleConfigJson(R"({"warmup_steps": 1.5})", "c").ok());
  CHECK_FALSE(ParseRuleConfigJson(R"({"tier1_grad_ratio": "3"})", "c").ok());
  CHECK_FALSE(ParseRuleConfigJson(R"({"median_window_steps": 0})", "c").ok());
  CHECK_FALSE(ParseRuleConfigJson(R"({"skip_loss_ratio": 3.0})", "c").ok());
  CHECK_FALSE(ParseRuleConfigJson(R"({"spike_delta_nats": -1})", "c").ok());
  CHECK_FALSE(ParseRuleConfigJson("[]", "c").ok());
}

// Bytes the process's heap holds (small blocks and mmapped ones).
size_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

TEST_CASE("rules: the largest valid file fits one run in the memory budget",
          "[core][config][bounds]") {
  // Every field at the bound --print-config shows for it ...
  auto printed = ParseJson(RuleConfigToJson(RuleConfig()), "printed");
  REQUIRE(printed.ok());
  const JsonValue* bounds = printed->Find("bounds");
  REQUIRE(bounds != nullptr);
  std::map<std::string, double> largest;
  for (const auto& [key, v] : printed->object) {
    if (key == "bounds" || v.type != JsonValue::Type::kNumber) continue;
    const JsonValue* b = bounds->Find(key);
    INFO(key);
    REQUIRE(b != nullptr);
    largest[key] = b->number;
  }
  REQUIRE(largest.size() == printed->object.size() - 2);  // all but the bool and "bounds"
  // ... and the two fields bounded together at their costliest pair: the
  // longest history with the slots it leaves per step, and the most buckets.
  largest["max_shards_per_step"] = double(kMaxShardSlots / int64_t(largest["shard_history_steps"]));
  largest["logz_bucket_steps"] = largest["warn_logz_rising_steps"] / double(kMaxLogzBuckets);
  std::string json = "{";
  for (const auto& [key, v] : largest) {
    if (json.size() > 1) json += ",";
    AppendJsonString(&json, key);
    json += ":";
    AppendJsonNumber(&json, v);
  }
  json += "}";
  auto config = ParseRuleConfigJson(json, "largest.json");
  INFO(json);
  REQUIRE(config.ok());
  CHECK(config->median_window_steps == 500'000);

  // Both what the engine counts and what the heap gained.
  const size_t before = HeapInUse();
  auto engine = std::make_unique<RuleEngine>(*config);
  const size_t grown = HeapInUse() - before;
  CHECK(engine->MemoryBytes() <= size_t(kRuleMemoryBudgetBytes));
  CHECK(grown <= size_t(kRuleMemoryBudgetBytes));
  // The count is the real footprint, within 10%: the budget is not met by
  // leaving something out.
  CHECK(double(engine->MemoryBytes()) >= 0.9 * double(grown));
  // The default configuration is far inside it.
  CHECK(RuleEngine(RuleConfig()).MemoryBytes() < size_t(1) << 20);
}

TEST_CASE("rules: a value above its bound is an error naming the field - the value and the bound",
          "[core][config][bounds]") {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : std::initializer_list<Case>{
           // Both passed validation before and aborted with bad_alloc.
           {R"({"max_shards_per_step":1000000000000})",
            "c.json: max_shards_per_step = 1000000000000 is above its bound 65536"},
           {R"({"checkpoints_retained":100000000000})",
            "c.json: checkpoints_retained = 100000000000 is above its bound 1000"},
           {R"({"median_window_steps":500001})",
            "c.json: median_window_steps = 500001 is above its bound 500000"},
           {R"({"ema_span_steps":1e8})", "c.json: ema_span_steps = 100000000 is above its bound 10000000"},
           {R"({"z_loss_alpha_recommended":2})",
            "c.json: z_loss_alpha_recommended = 2 is above its bound 1"},
           {R"({"shard_history_steps":100000,"max_shards_per_step":11})",
            "c.json: shard_history_steps * max_shards_per_step = 1100000 is above its bound "
            "1048576"},
           {R"({"warn_logz_rising_steps":10000000,"logz_bucket_steps":999})",
            "c.json: warn_logz_rising_steps / logz_bucket_steps = 10010 is above its bound 10000"},
       }) {
    CAPTURE(c.json);
    auto parsed = ParseRuleConfigJson(c.json, "c.json");
    REQUIRE_FALSE(parsed.ok());
    CHECK(std::string(parsed.status().message()) == c.message);
  }
}

TEST_CASE("recommended actions: JSON round trip exact beyond 2^53 - refused when not whole",
          "[core][json]") {
  RecommendedAction q;
  q.kind = RecommendedAction::Kind::kInspectShards;
  q.shard_first = 9007199254740993u;  // 2^53 + 1: a double would read 2^53
  q.shard_last = 18446744073709551615u;
  q.text = "inspect";
  RecommendedAction z;
  z.kind = RecommendedAction::Kind::kSetZLossAlpha;
  z.z_loss_alpha = 1e-4;
  z.text = "z";
  std::string json;
  AppendRecommendedActionsJson(&json, {q, z});
  auto back = ParseRecommendedActionsJson(json, "t");
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].kind == RecommendedAction::Kind::kInspectShards);
  CHECK((*back)[0].shard_first == q.shard_first);
  CHECK((*back)[0].shard_last == q.shard_last);
  CHECK((*back)[1].z_loss_alpha == 1e-4);
  for (const char* bad : {R"([{"kind":"quarantine_shards","text":"x","shard_first":1}])",
                          R"([{"kind":"reboot","text":"x"}])",
                          R"([{"kind":"quarantine_shards","text":"x","shard_first":-1,"shard_last":2}])",
                          R"([{"kind":"set_z_loss_alpha","z_loss_alpha":1}])", R"({})"}) {
    CAPTURE(bad);
    CHECK_FALSE(ParseRecommendedActionsJson(bad, "t").ok());
  }
}

}  // namespace
}  // namespace trainwatch::core
