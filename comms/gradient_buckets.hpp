#pragma once
// Gradient buckets for backends that reduce while backward still runs.
//
// Note [Gradient buckets]
// On an asynchronous backend (NCCL) the gradients are reduced in buckets, as
// PyTorch DDP does: backward produces the gradients of the last layer first,
// so the buckets take the parameter tensors from last to first, and a bucket's
// reduce-scatter is started as soon as backward of the step's last
// micro-batch has produced its lowest tensor. The communication stream then
// reduces it while the compute stream works on the layers below. The first
// bucket is small (1 MiB) so that communication starts early; the others are
// capped at 25 MiB (DDP's bucket_cap_mb); a bucket closes once its tensors
// reach the cap, so a single tensor larger than the cap is a bucket of its
// own. Buckets hold whole tensors and are contiguous ranges of the flat
// parameter layout, padding included, and together tile it exactly.
//
// Every member starts the same buckets in the same order (the ones that did
// not start during backward, because the shard was cut or empty, start right
// after it), then the step's header, then the all-gather of the optimizer
// step: the collective sequence is identical on every rank, as NCCL requires.
// Each member updates its chunk of every bucket (See Note [Sharded optimizer
// step]); the all-gather hands the bucket chunks to the others.

#include <cstddef>
#include <vector>

#include <dpactor/flat_layout.hpp>

namespace dpactor {

// DDP's defaults: torch.distributed's first-bucket size and bucket_cap_mb.
inline constexpr std::size_t default_first_bucket_bytes = std::size_t{1} << 20;
inline constexpr std::size_t default_bucket_cap_bytes = std::size_t{25} << 20;

struct bucket_limits {
  std::size_t first_bytes = default_first_bucket_bytes;
  std::size_t cap_bytes = default_bucket_cap_bytes;
};

struct gradient_bucket {
  std::size_t begin = 0;         // floats of the parameter section, [begin, end)
  std::size_t end = 0;
  std::size_t lowest_tensor = 0; // complete once backward has produced this tensor (and all after it)
  std::size_t size() const noexcept { return end - begin; }
};

// Buckets over the first `tensors` tensors of `layout` (the parameters), in
// the order backward completes them; the last bucket ends at `section_size`.
// No tensors: no buckets.
std::vector<gradient_bucket> plan_gradient_buckets(const flat_layout& layout, std::size_t tensors,
                                                   std::size_t section_size, bucket_limits limits);

}  // namespace dpactor
