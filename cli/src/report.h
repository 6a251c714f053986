// `twctl report RUN`: one self-contained HTML page for a run, to look at
// rather than read, or to attach to a post-mortem: the five health metrics
// as charts with every incident marked (tier colour, onset-to-detection band
// for pages), then the incidents and the quarantined shards as tables. No
// scripts and nothing fetched: it opens from a file anywhere.

#ifndef TRAINWATCH_CLI_SRC_REPORT_H_
#define TRAINWATCH_CLI_SRC_REPORT_H_

#include <string>
#include <vector>

#include "trainwatch/v1/operator.pb.h"

namespace trainwatch::cli {

// The page for `status` (its `recent` the current attempt's history, oldest
// first), `earlier` (the same for each abandoned attempt, drawn faded under
// the current one: where it differs is what a rollback undid), `incidents`
// (the run's, any state) and `shards` (its quarantine).
std::string RenderReportHtml(const trainwatch::v1::GetRunStatusResponse& status,
                             const std::vector<trainwatch::v1::GetRunStatusResponse>& earlier,
                             const trainwatch::v1::ListIncidentsResponse& incidents,
                             const trainwatch::v1::ListQuarantinedShardsResponse& shards);

// One line on the rules the server judges the run by: their source, the
// fields that differ from the defaults (all of them are in `-o json`), and
// the agents' decisions and divergences. Shared by `status` and `report`.
std::string RulesText(const trainwatch::v1::RunInfo& run);

// Text safe inside HTML elements and attribute values.
std::string HtmlEscape(const std::string& text);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_REPORT_H_
