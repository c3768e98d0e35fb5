#pragma once
// Events and run summaries as JSON records: the metrics file's lines
// (docs/metrics.md) and the service's event feed.

#include <dpactor/events.hpp>
#include "tensors/json.hpp"

namespace dpactor {

json to_json(const event& e);
json to_json(const run_summary& s);
// A "round_decision" record back (a replay reads them: docs/async.md);
// throws json's exceptions on a missing or mistyped field.
round_decision_event round_decision_from_json(const json& j);

}  // namespace dpactor
