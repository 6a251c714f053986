#include "report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::bench {
namespace {

double Ms(int64_t nanos) { return nanos / 1e6; }

std::string JsonBytes(int64_t bytes) {
  return bytes < 0 ? "null" : absl::StrCat(bytes);
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 0) return "n/a";
  return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024.0));
}

}  // namespace

bool LoadPassed(const LoadResult& result, const ServerReport& server) {
  return result.complete && result.stream_errors == 0 &&
         server.stop_error.empty();
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

std::string FormatJson(const LoadConfig& config, const LoadResult& r,
                       const ServerReport& server) {
  std::string out = "{";
  absl::StrAppend(&out, "\"ok\":", LoadPassed(r, server) ? "true" : "false");
  absl::StrAppend(&out, ",\"target\":", JsonQuote(r.target));
  absl::StrAppend(&out, ",\"runs\":", config.runs);
  absl::StrAppend(&out, ",\"ranks_per_run\":", config.ranks_per_run);
  absl::StrAppend(&out, ",\"steps\":", config.steps);
  absl::StrAppend(&out, ",\"per_rank\":", config.per_rank ? "true" : "false");
  absl::StrAppend(&out, ",\"rate\":", absl::StrFormat("%.6g", config.rate));
  absl::StrAppend(&out, ",\"streams\":", r.streams);
  absl::StrAppend(&out, ",\"sending_streams\":", r.sending_streams);
  absl::StrAppend(&out, ",\"channels\":", r.channels);
  absl::StrAppend(&out, ",\"records_planned\":", r.records_planned);
  absl::StrAppend(&out, ",\"records_sent\":", r.records_sent);
  absl::StrAppend(&out, ",\"records_acked\":", r.records_acked);
  absl::StrAppend(&out, ",\"heartbeats_sent\":", r.heartbeats_sent);
  absl::StrAppend(&out, ",\"ack_messages\":", r.ack_messages);
  absl::StrAppend(&out, ",\"acks_ahead_of_sends\":", r.acks_ahead_of_sends);
  absl::StrAppend(
      &out, ",\"wall_seconds\":", absl::StrFormat("%.6f", r.wall_seconds));
  absl::StrAppend(&out, ",\"records_per_second\":",
                  absl::StrFormat("%.1f", r.records_per_second));
  absl::StrAppend(&out, ",\"latency_samples\":", r.latency.count);
  absl::StrAppend(
      &out, ",\"latency_ms\":{",
      absl::StrFormat("\"p50\":%.4f,\"p90\":%.4f,\"p99\":%.4f,"
                      "\"max\":%.4f,\"mean\":%.4f",
                      Ms(r.latency.p50), Ms(r.latency.p90), Ms(r.latency.p99),
                      Ms(r.latency.max), r.latency.mean / 1e6),
      "}");
  absl::StrAppend(&out, ",\"max_schedule_lag_ms\":",
                  absl::StrFormat("%.4f", Ms(r.max_schedule_lag_ns)));
  absl::StrAppend(&out, ",\"complete\":", r.complete ? "true" : "false");
  absl::StrAppend(&out, ",\"timed_out\":", r.timed_out ? "true" : "false");
  absl::StrAppend(&out, ",\"aborted\":", r.aborted ? "true" : "false");
  absl::StrAppend(&out, ",\"stream_errors\":", r.stream_errors);
  absl::StrAppend(&out, ",\"first_error\":",
                  r.first_error.empty() ? "null" : JsonQuote(r.first_error));
  absl::StrAppend(&out, ",\"generator_peak_rss_bytes\":",
                  JsonBytes(r.generator_peak_rss_bytes));
  absl::StrAppend(&out,
                  ",\"server_spawned\":", server.spawned ? "true" : "false");
  absl::StrAppend(
      &out, ",\"server_peak_rss_bytes\":", JsonBytes(server.peak_rss_bytes));
  absl::StrAppend(&out, ",\"server_written_bytes\":", JsonBytes(server.written_bytes));
  absl::StrAppend(
      &out, ",\"server_stop_error\":",
      server.stop_error.empty() ? "null" : JsonQuote(server.stop_error));
  out += "}";
  return out;
}

std::string FormatText(const LoadConfig& config, const LoadResult& r,
                       const ServerReport& server) {
  std::string out;
  absl::StrAppendFormat(&out, "%-18s %s%s\n", "target", r.target,
                        server.spawned ? " (spawned)" : "");
  absl::StrAppendFormat(
      &out, "%-18s %d runs x %d ranks, %d steps, %s, rate %s\n", "load",
      config.runs, config.ranks_per_run, config.steps,
      config.per_rank ? "per-rank records" : "global records from rank 0",
      config.rate > 0 ? absl::StrFormat("%.0f records/s", config.rate)
                      : std::string("unpaced"));
  absl::StrAppendFormat(&out, "%-18s %d (%d sending) over %d connections\n",
                        "streams", r.streams, r.sending_streams, r.channels);
  absl::StrAppendFormat(&out, "%-18s %d planned, %d sent, %d acknowledged\n",
                        "records", r.records_planned, r.records_sent,
                        r.records_acked);
  absl::StrAppendFormat(&out, "%-18s %.3f s\n", "wall", r.wall_seconds);
  absl::StrAppendFormat(&out, "%-18s %.0f records/s acknowledged\n",
                        "throughput", r.records_per_second);
  absl::StrAppendFormat(
      &out, "%-18s p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  (%d samples)\n",
      "ack latency (ms)", Ms(r.latency.p50), Ms(r.latency.p90),
      Ms(r.latency.p99), Ms(r.latency.max), r.latency.count);
  if (config.rate > 0) {
    absl::StrAppendFormat(&out, "%-18s %.3f ms\n", "max schedule lag",
                          Ms(r.max_schedule_lag_ns));
  }
  absl::StrAppendFormat(&out, "%-18s server %s, generator %s\n", "peak RSS",
                        HumanBytes(server.peak_rss_bytes),
                        HumanBytes(r.generator_peak_rss_bytes));
  if (server.written_bytes >= 0) {
    absl::StrAppendFormat(&out, "%-18s %s, %.0f bytes a record acknowledged\n", "server writes",
                          HumanBytes(server.written_bytes),
                          r.records_acked > 0
                              ? static_cast<double>(server.written_bytes) / r.records_acked
                              : 0.0);
  }
  if (r.acks_ahead_of_sends > 0) {
    absl::StrAppendFormat(&out, "%-18s %d acks named unsent steps\n", "warning",
                          r.acks_ahead_of_sends);
  }
  std::string verdict = LoadPassed(r, server) ? "PASS" : "FAIL";
  if (r.timed_out) absl::StrAppend(&verdict, " (duration limit reached)");
  if (r.aborted) absl::StrAppend(&verdict, " (interrupted)");
  if (r.stream_errors > 0) {
    absl::StrAppend(&verdict, " (", r.stream_errors,
                    " stream errors; first: ", r.first_error, ")");
  }
  if (!server.stop_error.empty()) {
    absl::StrAppend(&verdict, " (server: ", server.stop_error, ")");
  }
  absl::StrAppendFormat(&out, "%-18s %s\n", "result", verdict);
  return out;
}

}  // namespace trainwatch::bench
