#include "tensors/rng.hpp"

#include <utility>

namespace dpactor {
namespace {

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

}  // namespace

rng::rng(std::uint64_t seed) {
  for (auto& word : s_) word = splitmix64(seed);
}

rng::rng(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t mixed = seed;
  std::uint64_t a = splitmix64(mixed);
  std::uint64_t x = a ^ (stream * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
  for (auto& word : s_) word = splitmix64(x);
}

std::uint64_t rng::next() noexcept {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float rng::uniform_float() noexcept { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

double rng::uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::uint64_t rng::below(std::uint64_t n) noexcept {
  if (n == 0) return 0;
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next()) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

void rng::shuffle(std::span<std::uint32_t> values) noexcept {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::size_t j = below(i);
    std::swap(values[i - 1], values[j]);
  }
}

}  // namespace dpactor
