#pragma once
// The dashboard served at GET /: one self-contained page (no outside
// scripts, styles or fonts) that draws the run from GET /status and the
// GET /events stream: loss and accuracy curves, samples/s, each device's
// share and throughput, and a timeline of membership changes, faults,
// recoveries and checkpoints.

#include <string_view>

namespace dpactor {

std::string_view dashboard_page();

}  // namespace dpactor
