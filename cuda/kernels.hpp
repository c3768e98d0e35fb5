#pragma once
// CUDA kernels of the MLP and its optimizers, as host-side launchers on a
// stream. Layouts are those of the CPU kernels (tensors/): row-major
// (rows, cols) blocks, flat parameter buffers. Each is checked against the CPU
// reference by the gpu-labelled tests.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "comms/tree_program.hpp"
#include "tensors/activation.hpp"
#include "tensors/loss.hpp"
#include "tensors/optimizer.hpp"

namespace dpactor::cuda {

// x(n, f) <- features[indices], y(n) <- labels[indices].
void gather_rows(const float* features, const std::int32_t* labels, const std::uint32_t* indices, std::size_t n,
                 std::size_t f, float* x, std::int32_t* y, cudaStream_t stream);

// z(rows, cols) += bias; a = act(z) (a may alias z unless the backward pass
// needs z: gelu).
void bias_activation_forward(activation act, std::size_t rows, std::size_t cols, const float* bias, float* z, float* a,
                             cudaStream_t stream);

// grad <- grad * act'(saved); bias_grad (+)= column sums (overwritten when
// `overwrite`).
void bias_activation_backward(activation act, std::size_t rows, std::size_t cols, const float* saved, float* grad,
                              float* bias_grad, bool overwrite, cudaStream_t stream);

// Adds the loss sum and correct count of the rows to stats[0] (double) and
// correct[0]; writes dL/doutput to grad unless it is null.
void loss(loss_kind kind, std::size_t rows, std::size_t classes, const float* outputs, const std::int32_t* labels,
          float* grad, double* loss_sum, unsigned long long* correct, cudaStream_t stream);

// Adds the number of NaN and infinite values among values[0, n) to count[0].
void count_nonfinite(const float* values, std::size_t n, unsigned long long* count, cudaStream_t stream);

// a[i] += b[i] for i in [0, n): the summation tree's one addition, as on
// the host (See Note [Summation tree]).
void add_into(float* a, const float* b, std::size_t n, cudaStream_t stream);

// out[i] = the tree's value at element i for i in [0, n) (See Note [The tree
// on a device]); `steps` (count of them), `parts` and the parts themselves
// in device memory. `out` may be one of the parts.
void run_tree_program(const tree_step* steps, std::size_t count, const float* const* parts, std::size_t n, float* out,
                      cudaStream_t stream);

// One launch per optimizer step over n elements (torch.optim formulas; see
// tensors/optimizer.hpp), from (params_in, slots_in) to (params_out,
// slots_out); in and out may alias. Unused slots may be null.
struct optimizer_buffers {
  const float* params_in;
  float* params_out;
  const float* grads;
  const float* slot0_in = nullptr;
  float* slot0_out = nullptr;
  const float* slot1_in = nullptr;
  float* slot1_out = nullptr;
};
void optimizer_step(const optimizer_config& cfg, const optimizer_buffers& b, std::size_t n, float grad_scale, double lr,
                    std::int64_t step, cudaStream_t stream);

}  // namespace dpactor::cuda
