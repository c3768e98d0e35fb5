#include "service/feature_body.hpp"

#include <charconv>
#include <cmath>
#include <stdexcept>

#include "tensors/json.hpp"

namespace dpactor {
namespace {

void skip_space(std::string_view s, std::size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
}

bool take(std::string_view s, std::size_t& i, std::string_view token) {
  skip_space(s, i);
  if (s.substr(i, token.size()) != token) return false;
  i += token.size();
  return true;
}

// {"features": [numbers]} and nothing else, or nullopt.
std::optional<std::vector<float>> fast_path(std::string_view s) {
  std::size_t i = 0;
  if (!take(s, i, "{") || !take(s, i, "\"features\"") || !take(s, i, ":") || !take(s, i, "[")) return std::nullopt;
  std::vector<float> out;
  skip_space(s, i);
  if (i < s.size() && s[i] == ']') {
    ++i;
  } else {
    for (;;) {
      skip_space(s, i);
      // JSON numbers only: from_chars would also take "inf", "nan" and a leading '+'.
      if (i >= s.size() || !(s[i] == '-' || (s[i] >= '0' && s[i] <= '9'))) return std::nullopt;
      float v = 0;
      const auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
      if (ec != std::errc() || !std::isfinite(v)) return std::nullopt;
      out.push_back(v);
      i = static_cast<std::size_t>(end - s.data());
      if (take(s, i, "]")) break;
      if (!take(s, i, ",")) return std::nullopt;
    }
  }
  if (!take(s, i, "}")) return std::nullopt;
  skip_space(s, i);
  if (i != s.size()) return std::nullopt;
  return out;
}

}  // namespace

std::vector<float> parse_feature_body(std::string_view body) {
  if (auto fast = fast_path(body)) return std::move(*fast);
  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("the body is not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("features") || !doc.at("features").is_array())
    throw std::invalid_argument("expected {\"features\": [numbers]}");
  std::vector<float> out;
  for (const json& v : doc.at("features")) {
    if (!v.is_number()) throw std::invalid_argument("features must be numbers, not " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::abs(d) > 3.4e38) throw std::invalid_argument("feature " + v.dump() + " is not a finite float");
    out.push_back(static_cast<float>(d));
  }
  return out;
}

}  // namespace dpactor
