#pragma once
// A driver group (comms/driver_group.hpp) whose ranks are threads of one
// process that can all reach each other's memory: calls are matched across
// the ranks by their sequence number, and the last rank to arrive at a call
// hands it, with every rank's buffers, to a carrier that carries it out.
// Completion is polled, as NCCL's is, and an abort stops every call not yet
// carried out.
//
// Two carriers: the `same_device` backend (comms/same_device.hpp), several
// GPU replicas sharing one GPU, where NCCL refuses two ranks on one device;
// and the tests' emulated backend (tests/emulated_backend.hpp), which sums
// on the CPU and lets CPU tests run the GPU path's step logic.

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "comms/driver_group.hpp"

namespace dpactor {

// One call, as every rank posted it. Kinds: 'r' (all-reduce of `data`,
// also a gradient bucket's reduce-scatter), 'b' (broadcast from `root`),
// 'g' (all-gather: `buffers`, `chunks` buffer-major), 't' (the tree of
// reproducible mode: See Note [The tree on a device]).
struct matched_call {
  char kind = 'r';
  std::size_t n = 0;  // floats; for 'g' the buffer count
  int root = 0;
  int arrived = 0;
  bool mismatch = false;
  std::vector<float*> data;                           // per rank ('r', 'b', 't': the out)
  std::vector<void*> after;                           // per rank ('r'): a stream to wait for, or null
  std::vector<std::vector<std::span<float>>> buffers;  // per rank ('g')
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  std::vector<int> roots;                // 't': part i's holder
  std::vector<std::vector<float*>> own;  // 't': per rank, its parts (null where another rank holds it)
  std::vector<tree_step> steps;          // 't'
};

class call_carrier {
 public:
  virtual ~call_carrier() = default;
  // Carries out call number `seq` (counted from 0); may only enqueue the
  // work. Called with the group's lock held, calls in order.
  virtual void carry_out(std::size_t seq, matched_call& call) = 0;
  // Whether the work of call `seq` (carried out) has finished.
  virtual bool finished(std::size_t seq) = 0;
  // After an abort: returns once no work carried out touches the ranks'
  // memory any more.
  virtual void drain() noexcept {}
};

std::shared_ptr<collective_group> make_matched_group(int ranks, std::shared_ptr<call_carrier> carrier);

}  // namespace dpactor
