#pragma once
// Events and run summaries as JSON records: the metrics file's lines
// (docs/metrics.md) and the service's event feed.

#include <dpactor/events.hpp>
#include "tensors/json.hpp"

namespace dpactor {

json to_json(const event& e);
json to_json(const run_summary& s);

}  // namespace dpactor
