#pragma once
// The `nccl` backend: GPU ranks, one communicator per generation, created
// from a unique id (in-process, the group object carries it; across nodes
// the reducer will distribute it in the group ticket). Communicators are
// non-blocking: set-up and every call are polled with deadlines and aborted
// on failure (See Note [Never block on a GPU collective]). Built only with
// the CUDA toolkit (DPACTOR_WITH_CUDA).

#include <memory>
#include <vector>

#include "comms/collective.hpp"

namespace dpactor {

// `devices[r]` is rank r's CUDA device. NCCL refuses two ranks on one device.
std::shared_ptr<collective_group> make_nccl_group(std::vector<int> devices);

}  // namespace dpactor
