#include "train/int8_codec.hpp"

#include <algorithm>
#include <cmath>

namespace dpactor {

void block_maxima(std::span<const float> v, std::span<float> out) noexcept {
  for (std::size_t b = 0; b < out.size(); ++b) {
    const std::size_t begin = b * int8_block, end = std::min(v.size(), begin + int8_block);
    float m = 0.0f;
    for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
    out[b] = m;
  }
}

void int8_plan::build(std::span<const float> maxima, std::size_t workers) {
  const std::size_t blocks = workers == 0 ? 0 : maxima.size() / workers;
  scales_.assign(blocks, 0.0f);
  limits_.assign(workers * blocks, 0);
  for (std::size_t b = 0; b < blocks; ++b) {
    float total = 0.0f;
    for (std::size_t k = 0; k < workers; ++k) total += maxima[k * blocks + b];
    if (!(total > 0.0f)) continue;  // every worker's block is zero: nothing to send
    scales_[b] = total / 127.0f;
    int sum = 0;
    for (std::size_t k = 0; k < workers; ++k) {
      const double c = std::floor(127.0 * static_cast<double>(maxima[k * blocks + b]) / static_cast<double>(total));
      limits_[k * blocks + b] = static_cast<std::int8_t>(std::clamp(c, 0.0, 127.0));
      sum += limits_[k * blocks + b];
    }
    for (std::size_t k = workers; sum > 127 && k-- > 0;)
      while (sum > 127 && limits_[k * blocks + b] > 0) {
        --limits_[k * blocks + b];
        --sum;
      }
  }
}

void int8_plan::encode(std::size_t worker, std::span<float> v, std::span<std::int8_t> sum) const noexcept {
  const std::size_t blocks = scales_.size();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * int8_block, end = std::min(v.size(), begin + int8_block);
    const float s = scales_[b];
    const float c = static_cast<float>(limits_[worker * blocks + b]);
    if (s == 0.0f) continue;  // q = 0: v stays whole as the residual
    for (std::size_t i = begin; i < end; ++i) {
      const float q = std::clamp(std::nearbyint(v[i] / s), -c, c);
      v[i] -= s * q;
      sum[i] = static_cast<std::int8_t>(sum[i] + static_cast<int>(q));
    }
  }
}

void int8_plan::decode(std::span<const std::int8_t> sum, std::span<float> out) const noexcept {
  for (std::size_t b = 0; b < scales_.size(); ++b) {
    const std::size_t begin = b * int8_block, end = std::min(out.size(), begin + int8_block);
    for (std::size_t i = begin; i < end; ++i) out[i] = scales_[b] * static_cast<float>(sum[i]);
  }
}

}  // namespace dpactor
