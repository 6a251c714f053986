// The Python module `trainwatch._trainwatch`: the agent, with gradients and
// logits read in place through DLPack (no copy, no libtorch), statistics
// computed by the CPU kernels; in a CUDA build also DeviceStats, the CUDA
// kernels for device tensors (device_stats.h). The pure-Python package around it
// (trainwatch/__init__.py, trainwatch/torch.py) is what users import.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "borrowed_tensor.h"
#include "device_stats.h"
#include "trainwatch/core/shard_names.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/version.h"
#ifdef TRAINWATCH_PYTHON_TWCTL
#include "trainwatch/cli/operator_commands.h"
#endif
#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/logit_stats.h"

namespace py = pybind11;

namespace trainwatch::python {
namespace {

// The numbers are the reduced record the engine judged (the same on every
// rank, NaN where the step had none); `tensors` and `rank` are what this
// rank saw on its own: the named gradients holding nonfinite elements.
struct PyVerdict {
  std::string decision;
  int64_t step = 0;
  int tier = 0;
  std::string rule;
  std::string reason;
  double loss = 0;
  double loss_ema_ratio = 0;
  double grad_norm = 0;
  double nan_frac = 0;
  double log_z = 0;
  int rank = 0;
  // (name, nonfinite elements, elements) per named gradient with any.
  std::vector<std::tuple<std::string, int64_t, int64_t>> tensors;
  std::vector<py::dict> events;
};

// Sum of log Z over the counted rows of [..., vocab] logits and the row
// count, by the CPU kernel; the sum is NaN when a counted row's log Z is not
// finite. Sums, not a mean, so that micro-batches and ranks add up.
std::pair<double, int64_t> LogZSum(py::handle logits, py::handle labels, int32_t ignore_index) {
  Borrowed t(logits);
  const kernels::LogitsView v = LogitsViewOf(t);
  kernels::LogitStatsOptions o;
  o.ignore_index = ignore_index;
  std::vector<int32_t> lab;
  if (!labels.is_none()) {
    lab = labels.cast<std::vector<int32_t>>();
    CheckLabelCount(static_cast<int64_t>(lab.size()), v.rows);
    o.labels = lab.data();
  }
  kernels::LogitStats ls;
  kernels::Status s = kernels::ComputeLogitStats(v, o, &ls);
  if (!s.ok()) throw py::value_error(s.ToString());
  return {ls.nonfinite_rows > 0 ? std::nan("") : ls.sum_log_z, ls.rows_counted};
}

py::dict CommandToDict(const agent::Command& c) {
  py::dict d;
  d["kind"] = c.kind == agent::Command::Kind::kRollback ? "rollback"
              : c.kind == agent::Command::Kind::kHalt   ? "halt"
                                                        : "resume";
  d["command_id"] = c.command_id;
  d["incident_id"] = c.incident_id;
  d["target_step"] = c.target_step;
  d["checkpoint_uri"] = c.checkpoint_uri;
  d["quarantine"] = c.quarantine;
  d["quarantine_names"] = c.quarantine_names;
  d["skip_steps"] = c.skip_steps.has_value() ? py::cast(*c.skip_steps) : py::none();
  d["z_loss_alpha"] = c.z_loss_alpha.has_value() ? py::cast(*c.z_loss_alpha) : py::none();
  d["precision"] = c.precision;
  d["lr_scale"] = c.lr_scale.has_value() ? py::cast(*c.lr_scale) : py::none();
  d["reason"] = c.reason;
  return d;
}

// An int in [0, 2^64) as a shard id; nullopt for anything else (a bool is
// an int to Python, but no shard id).
std::optional<uint64_t> ShardId(py::handle h) {
  if (!py::isinstance<py::int_>(h) || py::isinstance<py::bool_>(h)) return std::nullopt;
  try {
    return h.cast<uint64_t>();
  } catch (const py::cast_error&) {
    return std::nullopt;
  }
}

class PyAgent {
 public:
  PyAgent(std::string server, std::string run_id, int rank, int world_size,
          std::optional<std::string> token, std::optional<std::string> spill_dir,
          std::optional<std::string> rules_json, py::object reduce,
          std::optional<std::string> ca_file, std::optional<std::string> cert_file,
          std::optional<std::string> key_file, std::optional<int64_t> resume_step,
          bool observed, std::string attachment) {
    absl::StatusOr<agent::AgentConfig> env = agent::AgentConfig::FromEnvironment();
    if (!env.ok()) throw py::value_error(std::string(env.status().message()));
    agent::AgentConfig cfg = *env;
    if (!server.empty()) cfg.server_address = server;
    if (!run_id.empty()) cfg.run_id = run_id;
    if (token) cfg.token = *token;
    if (spill_dir) cfg.spill_dir = *spill_dir;
    if (ca_file) cfg.ca_file = *ca_file;
    if (cert_file) cfg.cert_file = *cert_file;
    if (key_file) cfg.key_file = *key_file;
    cfg.resume_step = resume_step;
    cfg.observed = observed;
    cfg.attachment = std::move(attachment);
    if (rules_json) {
      auto rules = core::ParseRuleConfigJson(*rules_json, "rules");
      if (!rules.ok()) throw py::value_error(std::string(rules.status().message()));
      cfg.rules = *rules;
    }
    std::unique_ptr<agent::Reducer> reducer;
    if (!reduce.is_none()) {
      // The trainer's collective (torch.distributed): called with the GIL
      // held, from Step(), on the training thread.
      reducer = std::make_unique<agent::CallbackReducer>(
          rank, world_size,
          [reduce](absl::Span<double> sums, absl::Span<double> maxes) -> absl::Status {
            try {
              py::tuple out = reduce(std::vector<double>(sums.begin(), sums.end()),
                                     std::vector<double>(maxes.begin(), maxes.end()));
              auto s = out[0].cast<std::vector<double>>();
              auto m = out[1].cast<std::vector<double>>();
              if (s.size() != sums.size() || m.size() != maxes.size()) {
                return absl::InvalidArgumentError("reduce returned lists of the wrong length");
              }
              std::copy(s.begin(), s.end(), sums.begin());
              std::copy(m.begin(), m.end(), maxes.begin());
              return absl::OkStatus();
            } catch (const std::exception& e) {
              return absl::UnavailableError(e.what());
            }
          });
    } else if (world_size > 1) {
      throw py::value_error("world_size > 1 needs a reduce callable (e.g. torch.distributed)");
    } else {
      reducer = std::make_unique<agent::SingleProcessReducer>();
    }
    world_size_ = world_size;
    rank_ = rank;
    auto a = agent::Agent::Create(cfg, std::move(reducer));
    if (!a.ok()) throw py::value_error(std::string(a.status().message()));
    agent_ = *std::move(a);
  }

  PyVerdict Step(int64_t step, std::optional<double> loss, py::object grads, py::object logits,
                 py::object labels, std::optional<double> log_z,
                 py::object shards, std::optional<double> lr,
                 std::optional<double> z_loss_alpha, py::object grad_stats,
                 py::object grad_tensors, py::object grad_copies,
                 std::optional<std::pair<double, int64_t>> log_z_sum, int32_t ignore_index,
                 std::optional<double> loss_scale, bool loss_scale_overflow) {
    agent::StepInput in;
    groups_.clear();
    in.step = step;
    in.loss = loss;
    in.learning_rate = lr;
    in.z_loss_alpha = z_loss_alpha;
    in.loss_scale = loss_scale;
    in.loss_scale_overflow = loss_scale_overflow;
    if (!grads.is_none() && !grad_stats.is_none()) {
      throw py::value_error("give grads or grad_stats, not both");
    }
    if (!grad_stats.is_none()) {
      // Statistics the caller computed (e.g. with torch on the GPU):
      // (sum of squares over finite elements, nonfinite count, elements),
      // or a list of (..., copies) groups for a layout other than sharded.
      if (py::isinstance<py::tuple>(grad_stats)) {
        const auto t = grad_stats.cast<std::tuple<double, int64_t, int64_t>>();
        if (std::get<1>(t) < 0 || std::get<2>(t) < 0 || std::get<1>(t) > std::get<2>(t)) {
          throw py::value_error("grad_stats: 0 <= nonfinite <= elements");
        }
        in.grad_sum_squares = std::get<0>(t);
        in.grad_nonfinite = std::get<1>(t);
        in.grad_elements = std::get<2>(t);
      } else {
        for (const auto& [ss, nf, n, copies] :
             grad_stats.cast<std::vector<std::tuple<double, int64_t, int64_t, int>>>()) {
          groups_.push_back({ss, nf, n, copies});
          in.grad_nonfinite += nf;  // this rank's own, for the tensor report below
        }
      }
      if (!grad_tensors.is_none() && in.grad_nonfinite > 0) {
        // Per tensor: (name, sum of squares, nonfinite, elements).
        names_.clear();
        tensors_.clear();
        const auto rows =
            grad_tensors.cast<std::vector<std::tuple<std::string, double, int64_t, int64_t>>>();
        names_.reserve(rows.size());  // the views below point into names_
        for (const auto& [name, ss, nf, n] : rows) names_.push_back(name);
        for (size_t i = 0; i < rows.size(); ++i) {
          tensors_.push_back({names_[i], std::get<1>(rows[i]), std::get<2>(rows[i]),
                              std::get<3>(rows[i])});
        }
        in.tensors = tensors_;
      }
    }
    if (!grads.is_none()) {
      std::vector<Borrowed> held;
      views_.clear();
      names_.clear();
      // A dict {name: tensor} also gives per-tensor statistics, which name
      // the source of a NaN.
      const bool named = py::isinstance<py::dict>(grads);
      py::iterable items = named ? py::iterable(grads.attr("items")()) : py::iterable(grads);
      for (py::handle item : items) {
        py::handle g = item;
        if (named) {
          py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
          g = kv[1];
          if (g.is_none()) continue;
          names_.push_back(py::str(kv[0]));
        }
        if (g.is_none()) continue;
        held.emplace_back(g);
        views_.push_back({held.back().data(), held.back().dtype(), held.back().numel()});
      }
      // The copies of each tensor's gradient (agent.h, GradGroup): one int
      // for all, or one per tensor given (None gradients left out).
      std::vector<int> copies;
      const bool per_tensor_copies = !grad_copies.is_none() && !py::isinstance<py::int_>(grad_copies);
      if (per_tensor_copies) {
        copies = grad_copies.cast<std::vector<int>>();
        if (copies.size() != views_.size()) {
          throw py::value_error(absl::StrCat("grad_copies has ", copies.size(),
                                             " entries for ", views_.size(), " gradients"));
        }
      }
      kernels::GradStatsOptions opts;
      opts.per_tensor = named || per_tensor_copies;
      kernels::Status s = kernels::ComputeGradStats(views_.data(), views_.size(), opts,
                                                    &grad_stats_);
      if (!s.ok()) throw py::value_error(s.ToString());
      if (per_tensor_copies) {
        for (size_t i = 0; i < views_.size(); ++i) {
          auto g = std::find_if(groups_.begin(), groups_.end(),
                                [&](const agent::GradGroup& g) { return g.copies == copies[i]; });
          if (g == groups_.end()) g = groups_.insert(groups_.end(), {0.0, 0, 0, copies[i]});
          g->sum_squares += grad_stats_.tensor_sum_squares[i];
          g->nonfinite += grad_stats_.tensor_nonfinite[i];
          g->elements += views_[i].numel;
        }
      } else if (!grad_copies.is_none()) {
        groups_.push_back({grad_stats_.sum_squares, grad_stats_.nonfinite, grad_stats_.numel,
                           grad_copies.cast<int>()});
      } else {
        in.grad_sum_squares = grad_stats_.sum_squares;
        in.grad_nonfinite = grad_stats_.nonfinite;
        in.grad_elements = grad_stats_.numel;
      }
      if (named && grad_stats_.nonfinite > 0) {
        tensors_.clear();
        for (size_t i = 0; i < views_.size(); ++i) {
          tensors_.push_back({names_[i], grad_stats_.tensor_sum_squares[i],
                              grad_stats_.tensor_nonfinite[i], views_[i].numel});
        }
        in.tensors = tensors_;
      }
    }
    if (static_cast<int>(!logits.is_none()) + log_z.has_value() + log_z_sum.has_value() > 1) {
      throw py::value_error("give one of logits, log_z and log_z_sum");
    }
    if (!logits.is_none()) {
      std::tie(in.log_z_sum, in.log_z_rows) = LogZSum(logits, labels, ignore_index);
    } else if (log_z_sum) {
      // Sums the caller kept (over micro-batches, or on a GPU).
      if (log_z_sum->second < 0) throw py::value_error("log_z_sum: rows must be >= 0");
      if (log_z_sum->second > 0) {
        in.log_z_sum = log_z_sum->first;
        in.log_z_rows = log_z_sum->second;
      }
    } else if (log_z) {
      in.log_z_sum = *log_z;
      in.log_z_rows = 1;
    }
    // Ints are shard ids, strings shard names; a list may mix them.
    std::vector<uint64_t> shard_ids;
    std::vector<std::string> shard_names;
    if (!shards.is_none()) {
      for (py::handle item : shards) {
        if (py::isinstance<py::str>(item)) {
          shard_names.push_back(item.cast<std::string>());
        } else if (std::optional<uint64_t> id = ShardId(item)) {
          shard_ids.push_back(*id);
        } else {
          throw py::value_error(absl::StrCat(
              "shards: ", py::repr(item).cast<std::string>(),
              " is neither a non-negative int (a shard id) nor a str (a shard name)"));
        }
      }
    }
    // A bad name is the caller's error, not the run's: raised, not a halt.
    if (absl::Status s = core::CheckShardNames("shards", shard_names); !s.ok()) {
      throw py::value_error(std::string(s.message()));
    }
    if (absl::Status s = agent::CheckLossScale(in); !s.ok()) {
      throw py::value_error(std::string(s.message()));
    }
    in.shards = shard_ids;
    in.shard_names = shard_names;
    // As groups, this rank's own nonfinite count above only served the
    // tensor report: StepInput takes one form or the other.
    if (!groups_.empty()) {
      in.grad_groups = groups_;
      in.grad_nonfinite = 0;
    }
    // A bad layout is the caller's error, like a bad shard name: raised.
    if (absl::Status s = agent::CheckGradLayout(in, world_size_); !s.ok()) {
      throw py::value_error(std::string(s.message()));
    }
    const absl::StatusOr<core::Verdict> result = agent_->Step(in);
    // A step the ranks could not agree on halts, with the error as the
    // reason, as a halt verdict rather than an exception: the trainer's loop
    // stops the same way whatever the cause.
    const core::Verdict v = result.ok() ? *result
                                      : core::Verdict{core::Decision::kHalt, 3,
                                                      core::EventKind::kNonfiniteValue};
    PyVerdict out;
    out.decision = std::string(core::DecisionName(v.decision));
    out.step = step;
    out.tier = v.tier;
    out.rule = v.decision == core::Decision::kContinue ? "" : std::string(core::EventKindName(v.rule));
    out.rank = rank_;
    for (const core::TensorStat& t : in.tensors) {
      if (t.nonfinite > 0) out.tensors.emplace_back(std::string(t.name), t.nonfinite, t.elements);
    }
    const core::StepOutcome& o = agent_->last_outcome();
    if (result.ok()) {
      // What the engine judged, reduced across ranks.
      const core::StepValues& r = agent_->last_values();
      out.loss = r.Get(core::Signal::kLoss);
      out.grad_norm = r.Get(core::Signal::kGradNorm);
      out.nan_frac = r.Get(core::Signal::kNanFrac);
      out.log_z = r.Get(core::Signal::kLogZ);
      out.loss_ema_ratio = o.loss_ema_ratio;
    } else {
      // No record was judged (the ranks did not agree): no numbers.
      out.loss = out.grad_norm = out.nan_frac = out.log_z = out.loss_ema_ratio = std::nan("");
    }
    for (const core::Event& e : o.events) {
      py::dict d;
      d["step"] = e.step;
      d["tier"] = e.tier;
      d["action"] = std::string(core::ActionName(e.action));
      d["kind"] = std::string(core::EventKindName(e.kind));
      d["onset_step"] = e.onset_step;
      d["reason"] = e.reason;
      d["shards"] = e.shards;
      d["shard_names"] = e.shard_names;
      d["recommended_checkpoint_step"] = e.recommended_checkpoint_step;
      out.events.push_back(d);
      if (out.reason.empty() && e.action != core::Action::kNone) out.reason = e.reason;
    }
    if (!result.ok()) out.reason = std::string(result.status().message());
    return out;
  }

  void ReportCheckpoint(int64_t step, const std::string& uri) {
    agent_->ReportCheckpoint(step, uri);
  }
  void SetPhase(int phase) { agent_->SetPhase(CheckedPhase(phase)); }
  void SetStack(int64_t finished_step, std::string stack, std::string blocked_at, int phase) {
    agent_->SetStack(finished_step, std::move(stack), std::move(blocked_at), CheckedPhase(phase));
  }
  std::tuple<int64_t, int64_t, int64_t> Liveness() const {
    const agent::LivenessInfo i = agent_->Liveness();
    return {i.finished_step, i.in_step_ms, i.step_ms_median};
  }
  static agent::Phase CheckedPhase(int phase) {
    if (phase < 0 || phase > static_cast<int>(agent::Phase::kData)) {
      throw py::value_error(absl::StrCat("phase ", phase, " is not a trainwatch.v1.Phase"));
    }
    return static_cast<agent::Phase>(phase);
  }
  py::object PollCommand() {
    std::optional<agent::Command> c = agent_->PollCommand();
    return c ? py::object(CommandToDict(*c)) : py::none();
  }
  void OnCommand(py::function fn) {
    agent_->SetCommandCallback([fn](const agent::Command& c) {
      py::gil_scoped_acquire gil;
      try {
        fn(CommandToDict(c));
      } catch (const std::exception&) {
        // A failing handler must not take the agent's thread down.
      }
    });
  }
  void Acknowledge(const std::string& id, const std::string& status, const std::string& message,
                   int64_t resumed_step) {
    agent::AckStatus s = status == "applied"   ? agent::AckStatus::kApplied
                         : status == "failed"  ? agent::AckStatus::kFailed
                         : status == "received" ? agent::AckStatus::kReceived
                                                : throw py::value_error(
                                                      "status must be received, applied or failed");
    agent_->Acknowledge(id, s, message, resumed_step);
  }
  void ResumeFrom(int64_t step) { agent_->ResumeFrom(step); }
  bool WaitForServer(double timeout_s) {
    if (!std::isfinite(timeout_s) || timeout_s < 0) {
      throw py::value_error("timeout_s must be a finite number >= 0");
    }
    py::gil_scoped_release release;  // the command callback takes the GIL
    return agent_->WaitForServer(static_cast<int>(std::min(timeout_s, 86400.0) * 1000));
  }
  std::vector<std::pair<uint64_t, uint64_t>> Quarantined() const {
    return agent_->QuarantinedShards();
  }
  std::vector<std::string> QuarantinedNames() const { return agent_->QuarantinedShardNames(); }
  bool IsQuarantined(py::handle shard) const {
    if (py::isinstance<py::str>(shard)) return agent_->IsQuarantined(shard.cast<std::string>());
    if (std::optional<uint64_t> id = ShardId(shard)) return agent_->IsQuarantined(*id);
    throw py::value_error("is_quarantined takes a shard id (a non-negative int) or a name (a str)");
  }
  py::dict Stats() const {
    const agent::AgentStats s = agent_->Stats();
    py::dict d;
    d["steps"] = s.steps;
    d["records_queued"] = s.records_queued;
    d["records_acked"] = s.records_acked;
    d["records_spilled"] = s.records_spilled;
    d["records_dropped"] = s.records_dropped;
    d["reconnects"] = s.reconnects;
    d["durable_step"] = s.durable_step;
    d["connected"] = s.connected;
    d["streaming"] = s.streaming;
    d["unacked"] = s.unacked;
    d["replaced"] = s.replaced;
    d["run_last_step"] = s.run_last_step;
    return d;
  }
  bool Streaming() const { return agent_->Stats().streaming; }
  std::string RunId() const { return agent_->run_id(); }
  int WorldSize() const { return world_size_; }
  void Close(int timeout_ms) {
    py::gil_scoped_release release;  // the writer may call back into Python
    agent_->Close(timeout_ms);
  }

 private:
  std::unique_ptr<agent::Agent> agent_;
  int rank_ = 0;
  std::vector<kernels::TensorView> views_;
  std::vector<std::string> names_;
  std::vector<core::TensorStat> tensors_;
  std::vector<agent::GradGroup> groups_;
  kernels::GradStats grad_stats_;
  int world_size_ = 1;
};

}  // namespace
}  // namespace trainwatch::python

PYBIND11_MODULE(_trainwatch, m) {
  using trainwatch::python::PyAgent;
  using trainwatch::python::PyVerdict;
  m.doc() = "trainwatch agent (native part)";
  m.attr("__version__") = trainwatch::kVersion;
  trainwatch::python::RegisterDeviceStats(m);
#ifdef TRAINWATCH_PYTHON_TWCTL
  // The `twctl` console script (trainwatch/_twctl.py): the same commands as
  // the twctl binary, without a second native program in the wheel.
  m.def(
      "twctl_main",
      [](const std::vector<std::string>& argv) {
        py::gil_scoped_release release;
        return trainwatch::cli::TwctlMain(argv);
      },
      py::arg("argv"), "Runs twctl with these arguments (no program name); its exit code.");
#endif
  m.def("log_z_sum", &trainwatch::python::LogZSum, py::arg("logits"),
        py::arg("labels") = py::none(), py::arg("ignore_index") = -100,
        "(sum of log Z over counted rows, rows) of [..., vocab] host logits; the sum is NaN "
        "when a counted row's log Z is not finite. Rows whose label is ignore_index are left out.");
  py::class_<PyVerdict>(m, "Verdict")
      // A trainwatch.Decision (a str enum: == "continue" still holds).
      .def_property_readonly("decision",
                             [](const PyVerdict& v) {
                               return py::module_::import("trainwatch").attr("Decision")(v.decision);
                             })
      .def_readonly("step", &PyVerdict::step)
      .def_readonly("tier", &PyVerdict::tier)
      .def_readonly("rule", &PyVerdict::rule)
      .def_readonly("reason", &PyVerdict::reason)
      .def_readonly("loss", &PyVerdict::loss)
      .def_readonly("loss_ema_ratio", &PyVerdict::loss_ema_ratio)
      .def_readonly("grad_norm", &PyVerdict::grad_norm)
      .def_readonly("nan_frac", &PyVerdict::nan_frac)
      .def_readonly("log_z", &PyVerdict::log_z)
      .def_readonly("rank", &PyVerdict::rank)
      .def_readonly("tensors", &PyVerdict::tensors)
      .def_readonly("events", &PyVerdict::events)
      .def_property_readonly("skip", [](const PyVerdict& v) { return v.decision == "skip_update"; })
      .def_property_readonly("halt", [](const PyVerdict& v) { return v.decision == "halt"; })
      .def("__repr__", [](const PyVerdict& v) {
        return "Verdict(" + v.decision + ", tier=" + std::to_string(v.tier) +
               (v.rule.empty() ? "" : ", rule=" + v.rule) + ")";
      });
  py::class_<PyAgent>(m, "Agent")
      .def(py::init<std::string, std::string, int, int, std::optional<std::string>,
                    std::optional<std::string>, std::optional<std::string>, py::object,
                    std::optional<std::string>, std::optional<std::string>,
                    std::optional<std::string>, std::optional<int64_t>, bool, std::string>(),
           py::arg("server") = "", py::arg("run_id") = "", py::arg("rank") = 0,
           py::arg("world_size") = 1, py::arg("token") = py::none(),
           py::arg("spill_dir") = py::none(), py::arg("rules_json") = py::none(),
           py::arg("reduce") = py::none(), py::arg("ca_file") = py::none(),
           py::arg("cert_file") = py::none(), py::arg("key_file") = py::none(),
           py::arg("resume_step") = py::none(), py::arg("observed") = false,
           py::arg("attachment") = "")
      .def("step", &PyAgent::Step, py::arg("step"), py::arg("loss") = py::none(),
           py::arg("grads") = py::none(), py::arg("logits") = py::none(),
           py::arg("labels") = py::none(), py::arg("log_z") = py::none(),
           py::arg("shards") = py::none(), py::arg("lr") = py::none(),
           py::arg("z_loss_alpha") = py::none(), py::arg("grad_stats") = py::none(),
           py::arg("grad_tensors") = py::none(), py::arg("grad_copies") = py::none(),
           py::arg("log_z_sum") = py::none(), py::arg("ignore_index") = -100,
           py::arg("loss_scale") = py::none(), py::arg("loss_scale_overflow") = false)
      .def("report_checkpoint", &PyAgent::ReportCheckpoint)
      .def("set_phase", &PyAgent::SetPhase, py::arg("phase"))
      .def("set_stack", &PyAgent::SetStack, py::arg("finished_step"), py::arg("stack"),
           py::arg("blocked_at"), py::arg("phase") = 0)
      .def("liveness", &PyAgent::Liveness)
      .def("poll_command", &PyAgent::PollCommand)
      .def("on_command", &PyAgent::OnCommand)
      .def("acknowledge", &PyAgent::Acknowledge, py::arg("command_id"), py::arg("status"),
           py::arg("message") = "", py::arg("resumed_step") = -1)
      .def("quarantined_shards", &PyAgent::Quarantined)
      .def("quarantined_shard_names", &PyAgent::QuarantinedNames)
      .def("is_quarantined", &PyAgent::IsQuarantined, py::arg("shard"))
      .def("resume_from", &PyAgent::ResumeFrom, py::arg("step"))
      .def("wait_for_server", &PyAgent::WaitForServer, py::arg("timeout_s") = 10.0)
      .def("stats", &PyAgent::Stats)
      .def_property_readonly("streaming", &PyAgent::Streaming)
      .def_property_readonly("run_id", &PyAgent::RunId)
      .def_property_readonly("world_size", &PyAgent::WorldSize)
      .def("close", &PyAgent::Close, py::arg("timeout_ms") = 5000);
}
