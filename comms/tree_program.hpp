#pragma once
// A tree_plan as a program that any processor can run element by element.
//
// Note [The tree on a device]
// In reproducible mode the parts of the summation tree (See Note [Summation
// tree]) may live where the host cannot read them: a GPU replica's slice
// gradients are device memory. A backend that moves device memory (the nccl
// backend, comms/nccl.cpp) therefore evaluates the tree where the parts are:
// the host plans it (tree_plan, which checks that the parts cover the
// slices exactly once), and the device runs the plan's steps for every
// element on its own, one thread an element, registers in the thread's own
// memory. Each element sees the same float additions in the same order as
// tree_plan::run on the host, and float addition on a GPU rounds as on a CPU
// (IEEE 754 round-to-nearest; there is no product to fuse into an FMA), so
// the result is bitwise what the host gives, which a host test checks with
// the very function the kernel calls (evaluate_tree_element, below). Two
// limits, neither of which reaches the bytes of a run: the CPU's training
// threads flush subnormals to zero (tensors/float_env.hpp) and the kernels
// (built without -ftz) keep them, and a NaN's payload may differ; a GPU
// replica adds every node of its tree on the GPU, so its runs agree with
// each other whatever the number of replicas.

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define DPACTOR_HOST_DEVICE __host__ __device__
#else
#define DPACTOR_HOST_DEVICE
#endif

namespace dpactor {

// One step of a plan: load a part into a register, add a part to a register,
// or add register src into register reg.
struct tree_step {
  enum kind_type : std::uint8_t { load, add_part, add_register };
  kind_type kind = load;
  std::uint8_t reg = 0;   // destination register (= recursion depth)
  std::uint32_t src = 0;  // part index, or source register
};

// Registers a plan may use: the tree's depth + 1; 2^40 slices is beyond any step.
inline constexpr std::size_t tree_max_registers = 41;

// The target's value at element i: parts[p][i] for the parts the steps name.
DPACTOR_HOST_DEVICE inline float evaluate_tree_element(const tree_step* steps, std::size_t count,
                                                       const float* const* parts, std::size_t i) {
  float regs[tree_max_registers];
  for (std::size_t k = 0; k < count; ++k) {
    const tree_step s = steps[k];
    switch (s.kind) {
      case tree_step::load: regs[s.reg] = parts[s.src][i]; break;
      case tree_step::add_part: regs[s.reg] = regs[s.reg] + parts[s.src][i]; break;
      case tree_step::add_register: regs[s.reg] = regs[s.reg] + regs[s.src]; break;
    }
  }
  return regs[0];
}

}  // namespace dpactor
