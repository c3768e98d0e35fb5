#include "comms/gradient_buckets.hpp"

#include <stdexcept>

namespace dpactor {

std::vector<gradient_bucket> plan_gradient_buckets(const flat_layout& layout, std::size_t tensors,
                                                   std::size_t section_size, bucket_limits limits) {
  if (tensors > layout.tensors().size())
    throw std::invalid_argument("plan_gradient_buckets: " + std::to_string(tensors) + " tensors asked, the layout has " +
                                std::to_string(layout.tensors().size()));
  if (limits.first_bytes == 0 || limits.cap_bytes == 0)
    throw std::invalid_argument("plan_gradient_buckets: bucket sizes must be positive");
  std::vector<gradient_bucket> buckets;
  std::size_t end = section_size;  // where the bucket being filled ends
  std::size_t bytes = 0;
  for (std::size_t t = tensors; t-- > 0;) {
    const tensor_spec& spec = layout.tensors()[t];
    bytes += spec.numel() * sizeof(float);
    const std::size_t cap = buckets.empty() ? limits.first_bytes : limits.cap_bytes;
    if (bytes >= cap || t == 0) {
      buckets.push_back({t == 0 ? 0 : spec.offset, end, t});
      end = buckets.back().begin;
      bytes = 0;
    }
  }
  return buckets;
}

}  // namespace dpactor
