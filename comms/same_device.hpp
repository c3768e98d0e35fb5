#pragma once
// The `same_device` backend: several GPU replicas of one process sharing one
// GPU, where NCCL refuses two ranks on one device (`--gpus 0,0`). Its ranks
// reach each other's device memory directly, so calls are matched across
// the ranks (comms/matched_group.hpp) and carried out on one stream of the
// group's: sums in rank order, copies device to device, the reproducible
// step's tree by the element program (See Note [The tree on a device]).
// Host buffers (the step header) are summed on the host. Bitwise the
// arithmetic of the other backends: every element of a sum is computed
// once, in rank order, and copied to every rank (See Note [Bitwise
// identical replicas]). Built only with the CUDA toolkit.

#include <memory>

#include "comms/collective.hpp"

namespace dpactor {

std::shared_ptr<collective_group> make_same_device_group(int ranks, int device);

}  // namespace dpactor
