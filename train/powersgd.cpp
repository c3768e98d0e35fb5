#include "train/powersgd.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "tensors/gemm.hpp"
#include "tensors/rng.hpp"

namespace dpactor {
namespace {

// The stream of train.seed the first basis is drawn from.
constexpr std::uint64_t basis_stream = 0x706f77657273ULL;  // "powers"

}  // namespace

powersgd_plan::powersgd_plan(const state_layout& layout, std::size_t rank)
    : rank_(rank), parameters_(layout.parameter_size) {
  if (rank == 0) throw std::invalid_argument("powersgd_plan: rank 0");
  std::size_t at = 0;  // the parameter section covered so far
  const auto& tensors = layout.layout.tensors();
  for (std::size_t t = 0; t < layout.parameter_tensors && t < tensors.size(); ++t) {
    const tensor_spec& s = tensors[t];
    if (s.offset >= layout.buffer_begin || s.shape.size() < 2) continue;
    const auto rows = static_cast<std::size_t>(s.shape[0]);
    const std::size_t cols = s.numel() / std::max<std::size_t>(rows, 1);
    if (rows == 0 || cols == 0 || rows * cols < 2 * (rows + cols) * rank) continue;  // DDP's min_compression_rate
    if (s.offset > at) whole_.emplace_back(at, s.offset);
    matrices_.push_back({s.offset, rows, cols, p_floats_, q_floats_});
    p_floats_ += rows * rank;
    q_floats_ += cols * rank;
    at = s.offset + rows * cols;
  }
  if (at < parameters_) whole_.emplace_back(at, parameters_);
  for (const auto& [b, e] : whole_) p_floats_ += e - b;
}

std::vector<float> powersgd_plan::initial_basis(std::uint64_t seed) const {
  std::vector<float> q(q_floats_);
  rng gen(seed, basis_stream);
  for (float& v : q) {  // Box-Muller, one value a pair of draws
    const double u1 = 1.0 - gen.uniform(), u2 = gen.uniform();
    v = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
  // The same Gram-Schmidt as P's, on each matrix's Q.
  for (const matrix& m : matrices_) {
    const std::span<float> f(q.data() + m.q_at, m.cols * rank_);
    for (std::size_t k = 0; k < rank_; ++k) {
      double norm = 0.0;
      for (std::size_t j = 0; j < m.cols; ++j) norm += static_cast<double>(f[j * rank_ + k]) * f[j * rank_ + k];
      norm = std::sqrt(norm);
      for (std::size_t j = 0; j < m.cols; ++j)
        f[j * rank_ + k] = norm > 0.0 ? static_cast<float>(f[j * rank_ + k] / norm) : 0.0f;
      for (std::size_t l = k + 1; l < rank_; ++l) {
        double dot = 0.0;
        for (std::size_t j = 0; j < m.cols; ++j) dot += static_cast<double>(f[j * rank_ + k]) * f[j * rank_ + l];
        for (std::size_t j = 0; j < m.cols; ++j)
          f[j * rank_ + l] = static_cast<float>(f[j * rank_ + l] - dot * f[j * rank_ + k]);
      }
    }
  }
  return q;
}

void powersgd_plan::project(std::span<const float> m, std::span<const float> q, std::span<float> p_message) const {
  const auto r = static_cast<int>(rank_);
  for (const matrix& x : matrices_) {  // P (rows x r) = M (rows x cols) Q (cols x r)
    const auto rows = static_cast<int>(x.rows), cols = static_cast<int>(x.cols);
    gemm(false, false, rows, r, cols, 1.0f, m.data() + x.offset, cols, q.data() + x.q_at, r, 0.0f,
         p_message.data() + x.p_at, r);
  }
  std::size_t at = whole_at();
  for (const auto& [b, e] : whole_) {
    std::copy(m.begin() + static_cast<std::ptrdiff_t>(b), m.begin() + static_cast<std::ptrdiff_t>(e),
              p_message.begin() + static_cast<std::ptrdiff_t>(at));
    at += e - b;
  }
}

void powersgd_plan::orthogonalize(std::span<float> p_message) const {
  const std::size_t r = rank_;
  for (const matrix& x : matrices_) {
    float* f = p_message.data() + x.p_at;
    for (std::size_t k = 0; k < r; ++k) {
      double norm = 0.0;
      for (std::size_t i = 0; i < x.rows; ++i) norm += static_cast<double>(f[i * r + k]) * f[i * r + k];
      norm = std::sqrt(norm);
      for (std::size_t i = 0; i < x.rows; ++i) f[i * r + k] = norm > 0.0 ? static_cast<float>(f[i * r + k] / norm) : 0.0f;
      for (std::size_t l = k + 1; l < r; ++l) {
        double dot = 0.0;
        for (std::size_t i = 0; i < x.rows; ++i) dot += static_cast<double>(f[i * r + k]) * f[i * r + l];
        for (std::size_t i = 0; i < x.rows; ++i) f[i * r + l] = static_cast<float>(f[i * r + l] - dot * f[i * r + k]);
      }
    }
  }
}

void powersgd_plan::back_project(std::span<const float> m, std::span<const float> p_message,
                                 std::span<float> q_message) const {
  const auto r = static_cast<int>(rank_);
  for (const matrix& x : matrices_) {  // Q (cols x r) = M^T (cols x rows) P (rows x r)
    const auto rows = static_cast<int>(x.rows), cols = static_cast<int>(x.cols);
    gemm(true, false, cols, r, rows, 1.0f, m.data() + x.offset, cols, p_message.data() + x.p_at, r, 0.0f,
         q_message.data() + x.q_at, r);
  }
}

void powersgd_plan::decompress(std::span<const float> p_message, std::span<const float> q_message,
                               std::span<float> out) const {
  const auto r = static_cast<int>(rank_);
  for (const matrix& x : matrices_) {  // M (rows x cols) = P (rows x r) Q^T (r x cols)
    const auto rows = static_cast<int>(x.rows), cols = static_cast<int>(x.cols);
    gemm(false, true, rows, cols, r, 1.0f, p_message.data() + x.p_at, r, q_message.data() + x.q_at, r, 0.0f,
         out.data() + x.offset, cols);
  }
  std::size_t at = whole_at();
  for (const auto& [b, e] : whole_) {
    std::copy_n(p_message.begin() + static_cast<std::ptrdiff_t>(at), e - b, out.begin() + static_cast<std::ptrdiff_t>(b));
    at += e - b;
  }
}

void powersgd_plan::keep_residual(std::span<float> m, std::span<const float> p_message,
                                  std::span<const float> q_unit) const {
  const auto r = static_cast<int>(rank_);
  for (const matrix& x : matrices_) {  // M -= P Q_u^T
    const auto rows = static_cast<int>(x.rows), cols = static_cast<int>(x.cols);
    gemm(false, true, rows, cols, r, -1.0f, p_message.data() + x.p_at, r, q_unit.data() + x.q_at, r, 1.0f,
         m.data() + x.offset, cols);
  }
  for (const auto& [b, e] : whole_)
    std::fill(m.begin() + static_cast<std::ptrdiff_t>(b), m.begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
}

std::shared_ptr<powersgd_setup> make_powersgd_setup(const state_layout& layout, std::size_t rank, std::int64_t start_step,
                                                    std::uint64_t seed, bool reproducible, std::size_t slices) {
  auto s = std::make_shared<powersgd_setup>();
  s->rank = rank;
  s->start_step = start_step;
  s->seed = seed;
  if (reproducible) {
    const powersgd_plan plan(layout, rank);
    s->residuals = std::make_shared<logical_worker_store>(
        slices, std::vector<float>(slices * layout.parameter_size, 0.0f), start_step);
    s->bases = std::make_shared<logical_worker_store>(1, plan.initial_basis(seed), start_step);
  }
  return s;
}

}  // namespace dpactor
