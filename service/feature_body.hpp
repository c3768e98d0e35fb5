#pragma once
// The body of a prediction request, {"features": [x0, x1, ...]}, read fast:
// a general JSON parser takes about 150 us for 784 numbers on this class of
// machine, which at a few hundred requests a second is CPU taken from the
// replicas (See Note [Serving beside training]). Anything the fast path does
// not recognise goes through the general parser, so every valid JSON body is
// read the same.

#include <string>
#include <string_view>
#include <vector>

namespace dpactor {

// Throws std::invalid_argument with what is wrong: not JSON, no "features"
// array of finite numbers.
std::vector<float> parse_feature_body(std::string_view body);

}  // namespace dpactor
