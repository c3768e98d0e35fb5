#pragma once
// Seeded random numbers: xoshiro256** seeded through splitmix64. The whole
// state is four words, so checkpoints store it and a resumed run draws the
// same numbers as one that never stopped.

#include <array>
#include <cstdint>
#include <span>

namespace dpactor {

class rng {
 public:
  using state_type = std::array<std::uint64_t, 4>;

  explicit rng(std::uint64_t seed);
  // A generator for a derived stream, e.g. (seed, epoch): independent of the
  // order in which streams are created.
  rng(std::uint64_t seed, std::uint64_t stream);

  std::uint64_t next() noexcept;
  // Uniform in [0, 1) with 24 random bits, as a float.
  float uniform_float() noexcept;
  // Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept;
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), without modulo bias (Lemire's method).
  std::uint64_t below(std::uint64_t n) noexcept;
  // Fisher-Yates shuffle.
  void shuffle(std::span<std::uint32_t> values) noexcept;

  const state_type& state() const noexcept { return s_; }
  void set_state(const state_type& s) noexcept { s_ = s; }

 private:
  state_type s_{};
};

}  // namespace dpactor
