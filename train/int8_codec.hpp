#pragma once
// The int8 codec of the round modes (sync.codec = "int8"; docs/async.md).
//
// Note [Int8 pseudo-gradients]
// What the workers of a round exchange travels as one byte a value, and the
// result is the same bytes however the workers are spread over devices.
// The values are cut in blocks of int8_block. Worker k's value v_k (its
// sample-weighted pseudo-gradient plus its residual, below) has in block b
// the largest magnitude m_kb. Every member learns every worker's m_kb (a
// small float all-reduce in which each worker's row is non-zero on one member
// only, so exact) and computes, in worker order, the block's scale
// s_b = (m_0b + ... + m_(K-1)b) / 127 and each worker's limit
// c_kb = floor(127 m_kb / (m_0b + ... + m_(K-1)b)), lowered from the last
// worker on while the limits add up to more than 127 after rounding. Worker
// k sends q_k = clamp(round(v_k / s_b), -c_kb, c_kb): the limits add up to at
// most 127, so any sum of the workers' q, in any order, fits in int8 and is
// exact. A member adds the q of the workers it ran, the members all-reduce
// these int8 sums (collective::all_reduce_sum_int8: a quarter of fp32's
// bytes in both halves of the exchange), and the round's pseudo-gradient sum
// is s_b x Q. Integer sums have no order, so no summation tree is needed.
//
// Error feedback: worker k keeps r_k = v_k - s_b q_k, what the codec dropped
// (the rounding, and what its limit clipped), in its state (checkpointed,
// and moved with the worker) and adds it to its next round's value: nothing
// is lost, only late.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dpactor {

// Values per block: one scale each.
inline constexpr std::size_t int8_block = 4096;

inline std::size_t int8_blocks(std::size_t values) noexcept { return (values + int8_block - 1) / int8_block; }

// out[b] = the largest |v[i]| in block b (out: int8_blocks(v.size()) floats).
void block_maxima(std::span<const float> v, std::span<float> out) noexcept;

// A round's scales and limits, from every worker's block maxima.
class int8_plan {
 public:
  // `maxima`: workers x blocks, worker after worker.
  void build(std::span<const float> maxima, std::size_t workers);

  std::size_t blocks() const noexcept { return scales_.size(); }
  std::span<const float> scales() const noexcept { return scales_; }
  int limit(std::size_t worker, std::size_t block) const noexcept {
    return limits_[worker * scales_.size() + block];
  }

  // Worker `worker`'s q is added into `sum`, and `v` becomes its residual
  // v - s q.
  void encode(std::size_t worker, std::span<float> v, std::span<std::int8_t> sum) const noexcept;
  // out = s x sum, block by block.
  void decode(std::span<const std::int8_t> sum, std::span<float> out) const noexcept;

 private:
  std::vector<float> scales_;
  std::vector<std::int8_t> limits_;  // workers x blocks
};

}  // namespace dpactor
