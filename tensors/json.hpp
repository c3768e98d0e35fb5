#pragma once
// JSON through nlohmann-json (Debian nlohmann-json3-dev) for safetensors
// headers, trainer.json and metrics records. Objects keep their members in
// the order written, so written files are stable and diffable; NaN is
// written as null.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace dpactor {

using json = nlohmann::ordered_json;

// A value that must be an integer (JSON readers here are strict: 1.5 is not
// a step count). Throws std::invalid_argument naming `what`.
inline std::int64_t json_int(const json& v, const std::string& what) {
  if (!v.is_number_integer()) throw std::invalid_argument(what + ": expected an integer, found " + v.type_name());
  return v.get<std::int64_t>();
}

}  // namespace dpactor
