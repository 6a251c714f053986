// rollback approve, rollback reject: the operator's approval (or
// rejection) of an incident's rollback.

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "command_output.h"
#include "trainwatch/core/shard_names.h"
#include "commands.h"
#include "operator_client.h"
#include "proto_text.h"

namespace trainwatch::cli {
namespace {

// Both subcommands answer a wrong operand count alike, as the group does.
constexpr char kRollbackMisuse[] = "usage: twctl rollback approve|reject ID ...\n";

// The shard list of --quarantine-shards, as core::ParseShardList reads it
// (ids, A..B ranges and names, comma-separated) into `out`. Empty is an
// error: quarantining nothing is not what an empty value should mean.
absl::Status ParseQuarantineShards(absl::string_view text, v1::ShardSet* out) {
  absl::StatusOr<core::ShardList> list = core::ParseShardList(text);
  if (!list.ok()) return list.status();
  for (const auto& [first, last] : list->ranges) {
    auto* r = out->add_ranges();
    r->set_first(first);
    r->set_last(last);
  }
  for (const std::string& name : list->names) out->add_names(name);
  return absl::OkStatus();
}

// core::ParseShardList's syntax, for --help.
constexpr char kQuarantineShardsNotes[] =
    "--quarantine-shards LIST: comma-separated entries, each an id (digits), a\n"
    "range A..B of ids, or a shard name, e.g. 1..4,9,train-00012-of-01024.parquet.\n"
    "In a name write \\, for a comma and \\\\ for a backslash; a name that reads as\n"
    "an id or a range takes a leading \\ (\\7, \\1..4). Quote LIST for the shell.\n";

class ApproveCommand : public Command {
 public:
  ApproveCommand()
      : Command(
            CommandSpec("rollback approve", "ID",
                        "approve the recommended rollback (a dry run is shown first)",
                        {{"to-step", "N", "roll back to this retained checkpoint instead"},
                         {"quarantine-shards", "LIST", "shards to quarantine (ids, ranges, names)"},
                         {"z-loss-alpha", "X", "turn z-loss on with this alpha (0 to 1)"},
                         {"precision", "MODULE=PREC", "MODULE in fp32, bf16 or fp16 (repeatable)"},
                         {"lr-scale", "X", "multiply every learning rate by X (X > 0)"},
                         {"skip-steps", "A..B|none", "the steps whose batches every rank skips"},
                         {"comment", "TEXT", "why, for the audit log (not for --dry-run)"},
                         {"yes", "", "do not ask for confirmation"},
                         {"dry-run", "", "only show what would happen"}})
                .WithNotes(kQuarantineShardsNotes)
                .Connecting()
                .WithMisuse(kRollbackMisuse)) {}

  int Execute(const Args& args, Context& ctx) const override {
    const std::string& id = args.operands[0];
    const std::string comment = args.Get("comment");
    v1::ApproveRollbackRequest req;
    if (int rc = Request(args, &req, ctx.err); rc != kOk) return rc;
    // The server refuses it too; saying so here spares the dry run. A dry
    // run records nothing and needs none.
    if (comment.empty() && !args.Has("dry-run")) {
      *ctx.err = "twctl rollback approve: --comment is required (it goes in the audit log)\n";
      return kUsage;
    }
    // First a dry run: the human sees exactly what will happen.
    req.set_dry_run(true);
    v1::ApproveRollbackResponse plan;
    if (int rc = FromStatus(ctx.client->ApproveRollback(req, &plan), ctx.err); rc != kOk) {
      return rc;
    }
    const std::string what = Describe(plan.decision());
    if (args.Has("dry-run")) {
      *ctx.out = args.output == "json" ? Json(plan) : absl::StrCat("dry run: would ", what, "\n");
      return kOk;
    }
    if (!args.Has("yes") &&
        (!ctx.prompt || !ctx.prompt(absl::StrCat(id, ": ", what, "? [y/N] ")))) {
      *ctx.err = "twctl: not approved\n";
      return kError;
    }
    req.set_dry_run(false);
    // A retry of this very command must not approve twice.
    req.set_idempotency_key(absl::StrCat("twctl-", id, "-", plan.decision().plan().target_step(),
                                         "-", std::hash<std::string>()(what + comment)));
    v1::ApproveRollbackResponse resp;
    if (int rc = FromStatus(ctx.client->ApproveRollback(req, &resp), ctx.err); rc != kOk) {
      return rc;
    }
    if (args.output == "json") {
      *ctx.out = Json(resp);
    } else if (resp.decision().manual_restart()) {
      *ctx.out = absl::StrFormat("%s approved (%s%s): %s\n%s", id, resp.decision().decision_id(),
                                 resp.replayed() ? ", already" : "", what,
                                 ManualRestart(resp.decision()));
    } else {
      *ctx.out = absl::StrFormat("%s approved (%s%s): %s; command %s sent to every rank\n", id,
                                 resp.decision().decision_id(), resp.replayed() ? ", already" : "",
                                 what, resp.decision().command_id());
    }
    return kOk;
  }

 private:
  // The request the flags ask for; kUsage and a message when one is malformed.
  static int Request(const Args& args, v1::ApproveRollbackRequest* req, std::string* err) {
    req->set_incident_id(args.operands[0]);
    req->set_comment(args.Get("comment"));
    if (args.Has("to-step")) {
      int64_t step;
      if (!absl::SimpleAtoi(args.Get("to-step"), &step)) {
        *err = "twctl rollback approve: --to-step needs a step number\n";
        return kUsage;
      }
      req->set_to_step(step);
    }
    if (args.Has("quarantine-shards")) {
      if (absl::Status s = ParseQuarantineShards(args.Get("quarantine-shards"),
                                                 req->mutable_quarantine_shards());
          !s.ok()) {
        *err = absl::StrCat("twctl rollback approve: --quarantine-shards: ", s.message(),
                            " (it takes shard ids, A..B ranges with A <= B and shard names, "
                            "comma-separated, e.g. 1..4,9,train-00012-of-01024.parquet; in a "
                            "name, write \\, for a comma and \\\\ for a backslash)\n");
        return kUsage;
      }
    }
    if (args.Has("skip-steps")) {
      // A..B, or "none" (sent as the empty range 0..-1).
      const std::string v = args.Get("skip-steps");
      const size_t dots = v.find("..");
      int64_t a = 0, b = -1;
      if (v != "none" && (dots == std::string::npos || !absl::SimpleAtoi(v.substr(0, dots), &a) ||
                          !absl::SimpleAtoi(v.substr(dots + 2), &b) || a < 0 || b < a)) {
        *err = "twctl rollback approve: --skip-steps takes A..B or none\n";
        return kUsage;
      }
      req->mutable_skip_steps()->set_first(a);
      req->mutable_skip_steps()->set_last(b);
    }
    if (args.Has("z-loss-alpha")) {
      double a;
      // SimpleAtod reads 1e400 as inf; the server holds the upper bound.
      if (!absl::SimpleAtod(args.Get("z-loss-alpha"), &a) || !std::isfinite(a) || a < 0) {
        *err = "twctl rollback approve: --z-loss-alpha needs a finite number >= 0\n";
        return kUsage;
      }
      req->set_z_loss_alpha(a);
    }
    for (const std::string& p : args.GetAll("precision")) {
      const size_t eq = p.rfind('=');
      const v1::Precision precision =
          eq == std::string::npos ? v1::PRECISION_UNSPECIFIED : PrecisionOf(p.substr(eq + 1));
      if (eq == 0 || precision == v1::PRECISION_UNSPECIFIED) {
        *err = absl::StrCat("twctl rollback approve: --precision takes MODULE=fp32|bf16|fp16 "
                            "(e.g. blocks.0.norm=fp32), not '", p, "'\n");
        return kUsage;
      }
      auto* lp = req->add_settings()->mutable_layer_precision();
      lp->set_layer(p.substr(0, eq));
      lp->set_precision(precision);
    }
    if (args.Has("lr-scale")) {
      double x;
      if (!absl::SimpleAtod(args.Get("lr-scale"), &x) || !std::isfinite(x) || x <= 0) {
        *err = "twctl rollback approve: --lr-scale needs a finite number > 0 (e.g. 0.5)\n";
        return kUsage;
      }
      req->add_settings()->set_lr_scale(x);
    }
    return kOk;
  }

  // "fp32" -> PRECISION_FP32; anything else (fp8 too: no precision to
  // widen a failing module to) -> PRECISION_UNSPECIFIED.
  static v1::Precision PrecisionOf(const std::string& name) {
    if (name == "fp32") return v1::PRECISION_FP32;
    if (name == "bf16") return v1::PRECISION_BF16;
    if (name == "fp16") return v1::PRECISION_FP16;
    return v1::PRECISION_UNSPECIFIED;
  }

  // What the operator of a followed run must do, since no command could be
  // sent (Decision.manual_restart): the checkpoint and the shards, and when
  // the server counts the rollback done.
  static std::string ManualRestart(const v1::Decision& d) {
    const v1::RollbackPlan& p = d.plan();
    std::vector<std::string> shards;
    for (const auto& r : p.quarantine().ranges()) {
      shards.push_back(absl::StrFormat("%d..%d", r.first(), r.last()));
    }
    for (const std::string& name : p.quarantine().names()) shards.push_back(name);
    return absl::StrFormat(
        "run %s is followed from its log (%s): no command was sent, nothing restarts it.\n"
        "Restart the trainer by hand from checkpoint %s (step %d)%s, and resume it after step %d;\n"
        "the rollback (%s) completes when the restarted job resumes after that step.\n",
        d.run_id(), kObservedText, p.checkpoint_uri(), p.target_step(),
        shards.empty() ? std::string()
                       : absl::StrCat(", leaving out the quarantined shards ",
                                      absl::StrJoin(shards, ",")),
        p.target_step(), d.command_id());
  }

  // "roll back run R to step N (URI), quarantine shards A..B, ...".
  static std::string Describe(const v1::Decision& d) {
    const v1::RollbackPlan& p = d.plan();
    std::string what = absl::StrFormat("roll back run %s to step %d (%s)", d.run_id(),
                                       p.target_step(), p.checkpoint_uri());
    for (const auto& r : p.quarantine().ranges()) {
      absl::StrAppendFormat(&what, ", quarantine shards %d..%d", r.first(), r.last());
    }
    for (const std::string& name : p.quarantine().names()) {
      absl::StrAppend(&what, ", quarantine shard ", name);
    }
    if (p.has_skip_steps()) {
      absl::StrAppendFormat(&what, ", skip the batches of steps %d..%d on every rank",
                            p.skip_steps().first(), p.skip_steps().last());
    }
    if (p.has_cost()) absl::StrAppend(&what, "; ", CostText(p.cost()));
    for (const auto& st : p.settings()) {
      if (st.has_z_loss_alpha()) {
        absl::StrAppendFormat(&what, ", z-loss alpha %g", st.z_loss_alpha());
      } else if (st.has_layer_precision()) {
        absl::StrAppendFormat(&what, ", run %s in %s", st.layer_precision().layer(),
                              absl::AsciiStrToLower(absl::StripPrefix(
                                  v1::Precision_Name(st.layer_precision().precision()),
                                  "PRECISION_")));
      } else if (st.has_lr_scale()) {
        absl::StrAppendFormat(&what, ", learning rate x%g", st.lr_scale());
      }
    }
    return what;
  }
};

class RejectCommand : public Command {
 public:
  RejectCommand()
      : Command(CommandSpec("rollback reject", "ID",
                            "reject the recommended rollback and dismiss the incident",
                            {{"comment", "TEXT", "why, for the audit log", /*required=*/true}})
                    .Connecting()
                    .WithMisuse(kRollbackMisuse)) {}

  int Execute(const Args& args, Context& ctx) const override {
    const std::string& id = args.operands[0];
    const std::string comment = args.Get("comment");
    if (comment.empty()) {
      *ctx.err = "twctl rollback reject: --comment is required (it goes in the audit log)\n";
      return kUsage;
    }
    v1::RejectRollbackRequest req;
    req.set_incident_id(id);
    req.set_comment(comment);
    v1::RejectRollbackResponse resp;
    if (int rc = FromStatus(ctx.client->RejectRollback(req, &resp), ctx.err); rc != kOk) {
      return rc;
    }
    *ctx.out = args.output == "json" ? Json(resp)
                                     : absl::StrFormat("%s rejected (%s): %s\n", id,
                                                       resp.decision().decision_id(), comment);
    return kOk;
  }
};

}  // namespace

std::unique_ptr<Command> MakeRollbackApproveCommand() { return std::make_unique<ApproveCommand>(); }
std::unique_ptr<Command> MakeRollbackRejectCommand() { return std::make_unique<RejectCommand>(); }

}  // namespace trainwatch::cli
