#include "cuda/kernels.hpp"

#include <algorithm>
#include <cmath>

#include "cuda/check.hpp"

namespace dpactor::cuda {
namespace {

constexpr int block = 256;

unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + block - 1) / block); }

__device__ float act_value(activation act, float z) {
  switch (act) {
    case activation::relu: return z > 0.0f ? z : 0.0f;
    case activation::gelu: return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    case activation::tanh: return tanhf(z);
    case activation::sigmoid: return 1.0f / (1.0f + expf(-z));
    default: return z;
  }
}

// Derivative from what the forward pass kept: z for gelu, act(z) otherwise.
__device__ float act_derivative(activation act, float saved) {
  switch (act) {
    case activation::relu: return saved > 0.0f ? 1.0f : 0.0f;
    case activation::gelu:
      return 0.5f * (1.0f + erff(saved * 0.70710678118654752f)) +
             saved * 0.39894228040143268f * expf(-0.5f * saved * saved);
    case activation::tanh: return 1.0f - saved * saved;
    case activation::sigmoid: return saved * (1.0f - saved);
    default: return 1.0f;
  }
}

__global__ void gather_kernel(const float* features, const std::int32_t* labels, const std::uint32_t* indices,
                              std::size_t n, std::size_t f, float* x, std::int32_t* y) {
  const std::size_t row = blockIdx.y;
  if (row >= n) return;
  const std::size_t src = static_cast<std::size_t>(indices[row]);
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < f; c += gridDim.x * blockDim.x)
    x[row * f + c] = features[src * f + c];
  if (blockIdx.x == 0 && threadIdx.x == 0) y[row] = labels[src];
}

__global__ void bias_act_forward_kernel(activation act, std::size_t rows, std::size_t cols, const float* bias, float* z,
                                        float* a) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = z[i] + bias[i % cols];
  z[i] = v;
  a[i] = act_value(act, v);
}

__global__ void act_backward_kernel(activation act, std::size_t n, const float* saved, float* grad) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) grad[i] *= act_derivative(act, saved[i]);
}

// One thread per column, rows summed in order: deterministic.
__global__ void column_sum_kernel(std::size_t rows, std::size_t cols, const float* grad, float* bias_grad, bool overwrite) {
  const std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = overwrite ? 0.0f : bias_grad[c];
  for (std::size_t r = 0; r < rows; ++r) s += grad[r * cols + c];
  bias_grad[c] = s;
}

// One thread per row (classes are few).
__global__ void loss_kernel(loss_kind kind, std::size_t rows, std::size_t classes, const float* out,
                            const std::int32_t* labels, float* grad, double* loss_sum, unsigned long long* correct) {
  const std::size_t r = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* z = out + r * classes;
  const auto label = static_cast<std::size_t>(labels[r]);
  std::size_t best = 0;
  for (std::size_t c = 1; c < classes; ++c)
    if (z[c] > z[best]) best = c;
  double l = 0.0;
  if (kind == loss_kind::cross_entropy) {
    const float max = z[best];
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) sum += exp(static_cast<double>(z[c] - max));
    l = log(sum) - static_cast<double>(z[label] - max);
    if (grad != nullptr) {
      const float inv = static_cast<float>(1.0 / sum);
      for (std::size_t c = 0; c < classes; ++c) grad[r * classes + c] = expf(z[c] - max) * inv - (c == label ? 1.0f : 0.0f);
    }
  } else {
    const float scale = 2.0f / static_cast<float>(classes);
    for (std::size_t c = 0; c < classes; ++c) {
      const float d = z[c] - (c == label ? 1.0f : 0.0f);
      l += static_cast<double>(d) * d;
      if (grad != nullptr) grad[r * classes + c] = scale * d;
    }
    l /= static_cast<double>(classes);
  }
  atomicAdd(loss_sum, l);
  if (best == label) atomicAdd(correct, 1ull);
}

__global__ void sgd_kernel(optimizer_buffers b, std::size_t n, float scale, float lr, float momentum, float keep,
                           float wd, bool nesterov, bool first) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float p = b.params_in[i];
  float d = b.grads[i] * scale + wd * p;
  if (b.slot0_out != nullptr) {
    const float m = first ? d : momentum * b.slot0_in[i] + keep * d;
    b.slot0_out[i] = m;
    d = nesterov ? d + momentum * m : m;
  }
  b.params_out[i] = p - lr * d;
}

__global__ void adamw_kernel(optimizer_buffers b, std::size_t n, float scale, float decay, float b1, float b2,
                             float step_size, float sqrt_bc2, float eps) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float gi = b.grads[i] * scale;
  const float pi = b.params_in[i] * decay;
  const float mi = b1 * b.slot0_in[i] + (1.0f - b1) * gi;
  const float vi = b2 * b.slot1_in[i] + (1.0f - b2) * gi * gi;
  b.slot0_out[i] = mi;
  b.slot1_out[i] = vi;
  b.params_out[i] = pi - step_size * mi / (sqrtf(vi) / sqrt_bc2 + eps);
}

}  // namespace

void gather_rows(const float* features, const std::int32_t* labels, const std::uint32_t* indices, std::size_t n,
                 std::size_t f, float* x, std::int32_t* y, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>((f + block - 1) / block), static_cast<unsigned>(n));
  gather_kernel<<<grid, block, 0, stream>>>(features, labels, indices, n, f, x, y);
  CUDA_CHECK(cudaGetLastError());
}

void bias_activation_forward(activation act, std::size_t rows, std::size_t cols, const float* bias, float* z, float* a,
                             cudaStream_t stream) {
  if (rows * cols == 0) return;
  bias_act_forward_kernel<<<blocks_for(rows * cols), block, 0, stream>>>(act, rows, cols, bias, z, a);
  CUDA_CHECK(cudaGetLastError());
}

void bias_activation_backward(activation act, std::size_t rows, std::size_t cols, const float* saved, float* grad,
                              float* bias_grad, bool overwrite, cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (act != activation::identity) {
    act_backward_kernel<<<blocks_for(rows * cols), block, 0, stream>>>(act, rows * cols, saved, grad);
    CUDA_CHECK(cudaGetLastError());
  }
  column_sum_kernel<<<blocks_for(cols), block, 0, stream>>>(rows, cols, grad, bias_grad, overwrite);
  CUDA_CHECK(cudaGetLastError());
}

void loss(loss_kind kind, std::size_t rows, std::size_t classes, const float* outputs, const std::int32_t* labels,
          float* grad, double* loss_sum, unsigned long long* correct, cudaStream_t stream) {
  if (rows == 0) return;
  loss_kernel<<<blocks_for(rows), block, 0, stream>>>(kind, rows, classes, outputs, labels, grad, loss_sum, correct);
  CUDA_CHECK(cudaGetLastError());
}

// Grid-stride, one atomic per thread that found any.
__global__ void count_nonfinite_kernel(const float* values, std::size_t n, unsigned long long* count) {
  unsigned long long found = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    found += isfinite(values[i]) ? 0 : 1;
  if (found != 0) atomicAdd(count, found);
}

void count_nonfinite(const float* values, std::size_t n, unsigned long long* count, cudaStream_t stream) {
  if (n == 0) return;
  constexpr std::size_t max_blocks = 1024;  // enough to fill an H200's 132 SMs
  const auto blocks = static_cast<unsigned>(std::min<std::size_t>(blocks_for(n), max_blocks));
  count_nonfinite_kernel<<<blocks, block, 0, stream>>>(values, n, count);
  CUDA_CHECK(cudaGetLastError());
}

__global__ void add_into_kernel(float* a, const float* b, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) a[i] = a[i] + b[i];
}

void add_into(float* a, const float* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_into_kernel<<<blocks_for(n), block, 0, stream>>>(a, b, n);
  CUDA_CHECK(cudaGetLastError());
}

// See Note [The tree on a device]: one thread an element, the host's function.
__global__ void tree_program_kernel(const tree_step* steps, std::size_t count, const float* const* parts, std::size_t n,
                                    float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = evaluate_tree_element(steps, count, parts, i);
}

void run_tree_program(const tree_step* steps, std::size_t count, const float* const* parts, std::size_t n, float* out,
                      cudaStream_t stream) {
  if (n == 0) return;
  tree_program_kernel<<<blocks_for(n), block, 0, stream>>>(steps, count, parts, n, out);
  CUDA_CHECK(cudaGetLastError());
}

void optimizer_step(const optimizer_config& cfg, const optimizer_buffers& b, std::size_t n, float grad_scale, double lr,
                    std::int64_t step, cudaStream_t stream) {
  if (n == 0) return;
  if (cfg.kind == optimizer_kind::sgd) {
    optimizer_buffers sgd = b;
    if (cfg.momentum == 0.0) sgd.slot0_out = nullptr;
    sgd_kernel<<<blocks_for(n), block, 0, stream>>>(sgd, n, grad_scale, static_cast<float>(lr),
                                                    static_cast<float>(cfg.momentum),
                                                    static_cast<float>(1.0 - cfg.dampening),
                                                    static_cast<float>(cfg.weight_decay), cfg.nesterov, step == 0);
  } else {
    const double t = static_cast<double>(step + 1);
    adamw_kernel<<<blocks_for(n), block, 0, stream>>>(
        b, n, grad_scale, static_cast<float>(1.0 - lr * cfg.weight_decay), static_cast<float>(cfg.beta1),
        static_cast<float>(cfg.beta2), static_cast<float>(lr / (1.0 - std::pow(cfg.beta1, t))),
        static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t))), static_cast<float>(cfg.eps));
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace dpactor::cuda
