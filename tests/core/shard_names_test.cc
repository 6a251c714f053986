// Shard names: the bounds every side checks, the operator's shard list
// (ids, ranges, names and their escapes), and the engine keeping names for
// its events within shard_name_history_bytes.

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine_state.h"
#include "trainwatch/core/json.h"
#include "trainwatch/core/shard_names.h"

namespace trainwatch::core {
namespace {

TEST_CASE("shard names are bounded in length and count - with the bound in the error",
          "[core][shards]") {
  CHECK(CheckShardName("step", std::string(256, 'a')).ok());
  const absl::Status long_name = CheckShardName("step", std::string(257, 'a'));
  CHECK(long_name.code() == absl::StatusCode::kInvalidArgument);
  CHECK(long_name.message().find("257 bytes, above the 256 a shard name may have") !=
        absl::string_view::npos);
  CHECK(CheckShardName("step", "").message() == "step: a shard name is empty");
  CHECK(CheckShardNameCount("step", 1024).ok());
  CHECK(CheckShardNameCount("step", 1025).message() ==
        "step: 1025 shard names, above the 1024 a record may carry");
  const std::vector<std::string> names(1025, "x");
  CHECK(CheckShardNames("step", names).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a shard list reads ids - ranges and names", "[core][shards]") {
  absl::StatusOr<ShardList> l = ParseShardList("1..4,9,train-00012-of-01024.parquet,a..b");
  REQUIRE(l.ok());
  CHECK(l->ranges == std::vector<std::pair<uint64_t, uint64_t>>{{1, 4}, {9, 9}});
  CHECK(l->names == std::vector<std::string>{"train-00012-of-01024.parquet", "a..b"});
  // Escapes: a comma and a backslash inside a name, an id-looking name.
  l = ParseShardList(R"(s3://b/x\,y,\7,\1..4,back\\slash)");
  REQUIRE(l.ok());
  CHECK(l->ranges.empty());
  CHECK(l->names == std::vector<std::string>{"s3://b/x,y", "7", "1..4", "back\\slash"});
  l = ParseShardList(R"(1..4,a\,b,\7)");
  REQUIRE(l.ok());
  CHECK(l->names == std::vector<std::string>{"a,b", "7"});
}

TEST_CASE("a shard list refuses empty entries - reversed ranges - a lone backslash",
          "[core][shards]") {
  CHECK(ParseShardList("").status().message() == "the shard list is empty");
  CHECK(ParseShardList("1,,2").status().message() == "shard list entry \"\": is empty");
  CHECK(ParseShardList("3..1").status().message() ==
        "shard list entry \"3..1\": a range A..B needs A <= B");
  CHECK(ParseShardList("99999999999999999999").status().message() ==
        "shard list entry \"99999999999999999999\": the id does not fit in 64 bits");
  CHECK(ParseShardList("x\\").status().message() == "shard list \"x\\\" ends in a lone '\\'");
  CHECK(ParseShardList(std::string(257, 'n')).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ShardListEntry escapes a name so that it reads back the same", "[core][shards]") {
  for (const std::string name : {"plain-name.tar", "7", "1..4", "a,b", "c\\d", "x..y"}) {
    absl::StatusOr<ShardList> l = ParseShardList(ShardListEntry(name));
    INFO(name << " as " << ShardListEntry(name));
    REQUIRE(l.ok());
    CHECK(l->ranges.empty());
    CHECK(l->names == std::vector<std::string>{name});
  }
  CHECK(ShardListEntry("plain-name.tar") == "plain-name.tar");
}

TEST_CASE("the engine puts the steps' shard names on events - sorted and unique",
          "[core][shards]") {
  EngineState s{RuleConfig()};
  const std::vector<std::string> a = {"shard-b", "shard-a"}, b = {"shard-a", "shard-c"};
  StepRecord r;
  r.step = 10;
  r.shard_names = a;
  s.RecordShards(r);
  r.step = 11;
  r.shard_names = b;
  s.RecordShards(r);
  Event e;
  s.CollectShards(10, 11, &e);
  CHECK(e.shard_names == std::vector<std::string>{"shard-a", "shard-b", "shard-c"});
  CHECK(e.shards.empty());
  CHECK_FALSE(e.shards_truncated);
  s.AddShardAction(RecommendedAction::Kind::kQuarantineShards, &e);
  REQUIRE(e.recommended_actions.size() == 1);
  const RecommendedAction& q = e.recommended_actions[0];
  CHECK_FALSE(q.has_shard_range);
  CHECK(q.shard_names == e.shard_names);
  CHECK(q.text == "quarantine shards shard-a, shard-b, shard-c");
  // The action reads back from the JSON the store keeps.
  std::string json;
  AppendRecommendedActionsJson(&json, e.recommended_actions);
  absl::StatusOr<std::vector<RecommendedAction>> back = ParseRecommendedActionsJson(json, "t");
  REQUIRE(back.ok());
  REQUIRE(back->size() == 1);
  CHECK_FALSE((*back)[0].has_shard_range);
  CHECK((*back)[0].shard_names == q.shard_names);
  // A row from before names still reads as a range.
  back = ParseRecommendedActionsJson(
      R"([{"kind":"quarantine_shards","shard_first":3,"shard_last":5,"text":"t"}])", "old");
  REQUIRE(back.ok());
  CHECK((*back)[0].has_shard_range);
  CHECK((*back)[0].shard_last == 5);
  CHECK((*back)[0].shard_names.empty());
}

TEST_CASE("the engine keeps shard names within shard_name_history_bytes - oldest dropped",
          "[core][shards]") {
  RuleConfig c;
  // Each step: one 100-byte name, 100 + 32 + 40 = 172 bytes; three fit in 600.
  c.shard_name_history_bytes = 600;
  EngineState s{c};
  std::vector<std::vector<std::string>> names;
  for (int i = 0; i < 5; ++i) names.push_back({std::string(99, 'a') + std::to_string(i)});
  for (int i = 0; i < 5; ++i) {
    StepRecord r;
    r.step = i;
    r.shard_names = names[static_cast<size_t>(i)];
    s.RecordShards(r);
  }
  CHECK(s.shard_name_steps.size() == 3);
  CHECK(s.shard_name_bytes <= 600);
  Event e;
  s.CollectShards(0, 4, &e);
  REQUIRE(e.shard_names.size() == 3);
  CHECK(e.shard_names.front() == names[2][0]);
  // The memory the engine reports counts them.
  EngineState empty{c};
  CHECK(s.MemoryBytes() >= empty.MemoryBytes() + s.shard_name_bytes);
}

}  // namespace
}  // namespace trainwatch::core
