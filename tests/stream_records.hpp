#pragma once
// The records the stream tests feed: record `s` of a 16-feature, 4-class
// stream, a function of `s` alone (so that a replay gives the same bytes),
// and learnable: the label's features are shifted up.

#include <cstdint>
#include <vector>

#include "data/record_queue.hpp"
#include "train/sample_digest.hpp"

namespace dpactor::testing {

inline constexpr int stream_features = 16;
inline constexpr int stream_classes = 4;

inline record stream_record_at(std::int64_t s) {
  record r;
  r.sequence = s;
  r.label = static_cast<std::int32_t>(sample_digest(static_cast<std::uint64_t>(s)) % stream_classes);
  r.features.resize(stream_features);
  std::uint64_t z = sample_digest(static_cast<std::uint64_t>(s) ^ 0x5bd1e995u);
  for (int f = 0; f < stream_features; ++f) {
    z = sample_digest(z);
    const float noise = static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) - 0.5f;
    r.features[static_cast<std::size_t>(f)] = noise + (f % stream_classes == r.label ? 1.0f : 0.0f);
  }
  return r;
}

inline std::vector<record> stream_records(std::int64_t first, std::int64_t end) {
  std::vector<record> out;
  for (std::int64_t s = first; s < end; ++s) out.push_back(stream_record_at(s));
  return out;
}

// The digest of records [0, n): what the trained events of every record
// trained once add up to.
inline std::uint64_t stream_digest(std::int64_t n) {
  std::uint64_t sum = 0;
  for (std::int64_t s = 0; s < n; ++s) sum += sample_digest(static_cast<std::uint64_t>(s));
  return sum;
}

}  // namespace dpactor::testing
