#pragma once
// A sample index's 64-bit hash (splitmix64). The sum, mod 2^64, of the hashes
// of a set of indices tells sets apart whatever the order: two sets with the
// same count and sum are, for any practical purpose, the same set. Devices
// report it for what they trained (trained_event); tests add it up.

#include <cstdint>
#include <span>

namespace dpactor {

// A sample is named by its index in a file's training set, or by its
// sequence number in a stream.
constexpr std::uint64_t sample_digest(std::uint64_t index) noexcept {
  std::uint64_t z = index + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t sample_digest(std::span<const std::uint32_t> indices) noexcept {
  std::uint64_t sum = 0;
  for (const auto i : indices) sum += sample_digest(i);
  return sum;
}

// The same over a stream's rows, named by their sequence numbers: `names[i]`
// for each row i of `indices`. Empty `names`: the rows' own indices.
constexpr std::uint64_t sample_digest(std::span<const std::uint32_t> indices, std::span<const std::int64_t> names) noexcept {
  if (names.empty()) return sample_digest(indices);
  std::uint64_t sum = 0;
  for (const auto i : indices) sum += sample_digest(static_cast<std::uint64_t>(names[i]));
  return sum;
}

}  // namespace dpactor
