#pragma once
// PowerSGD steps (sync.mode = "every_step", sync.codec = "powersgd";
// docs/async.md): the gradients travel as rank-r factors, with error
// feedback and a warm start, as PyTorch DDP's powerSGD_hook.
//
// Note [PowerSGD steps]
// PowerSGD (Vogels et al., NeurIPS 2019) sends each weight matrix M (rows x
// cols, a parameter tensor of two or more dimensions, the first one its
// rows) as two thin factors: with Q (cols x r) the basis of the last step,
//   P = sum over units of M_u Q             (all-reduced: rows x r)
//   P = orthogonalize(P)                    (Gram-Schmidt, every member alike)
//   Q' = sum over units of M_u^T P          (all-reduced: cols x r)
//   the step applies P Q'^T in place of sum M_u, and keeps Q' as the next
//   step's basis (the warm start).
// A unit is what contributes one gradient sum: in reproducible mode a slice
// of the step (Note [Summation tree]), so the sums are the fp32 tree's over
// slice index and the bytes are the same on any number of devices; in fast
// mode a member, whose sums are the all-reduce's. Tensors where the factors
// would not send at least half fewer floats (rows x cols < 2 (rows + cols) r,
// DDP's min_compression_rate) and one-dimensional ones (biases) travel
// whole, as fp32 sums next to P. Each unit adds its residual to its gradient
// sum before projecting (M_u = g_u + e_u) and keeps what it did not send of
// itself, e_u = M_u - P (M_u^T P)^T on the compressed matrices, zero
// elsewhere (error feedback). The residuals add up to sum M_u - P Q'^T, and
// P and Q' depend on the units' M_u through their sum only, so the run's
// arithmetic is that of DDP's hook (whose ranks keep M_u - P Q'^T / W); the
// split differs only in rounding. A unit with no rows in a step (an epoch's
// short last step) sends nothing and keeps its residual. The first
// sync.powersgd_start_step steps are plain fp32 steps (DDP's
// start_powerSGD_iter: the early gradients change too fast for the warm
// start); the residuals start at zero and the basis is drawn from
// train.seed (normal values, orthogonalized) at that step.
//
// The products are OpenBLAS GEMMs of fixed shapes, as the forward and
// backward passes' (the same kernel wherever a unit runs, Note [Summation
// tree]), and Gram-Schmidt is written out in a fixed order, so every member
// computes the same bytes from the same inputs. The residuals and the basis live in a store that every device of
// the process shares (logical_worker_store, by step): in reproducible mode a
// slice's residual is wherever the slice is computed, a step that is run
// again reads the state its first run read, and a newcomer reads the basis
// the others wrote. A checkpoint holds every slice's residual and the basis
// at its step (powersgd.safetensors), so a resume continues the run's
// bytes. Across processes, reproducible mode is refused (its slices move
// between processes, their residuals would have to follow); fast mode runs
// there, each member with its own residual and basis, which a checkpoint
// does not hold: a resumed fast run's members start from zero residuals and
// the first basis.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "tensors/replica.hpp"
#include "train/logical_workers.hpp"

namespace dpactor {

class powersgd_plan {
 public:
  // The parameter section of `layout` [0, parameter_size), at rank `rank`.
  powersgd_plan(const state_layout& layout, std::size_t rank);

  std::size_t rank() const noexcept { return rank_; }
  std::size_t parameters() const noexcept { return parameters_; }
  // Floats of a unit's first message (the P factors, then the values sent
  // whole) and of its second (the Q factors).
  std::size_t p_floats() const noexcept { return p_floats_; }
  std::size_t q_floats() const noexcept { return q_floats_; }
  // The compressed matrices: where each starts, and its shape.
  struct matrix {
    std::size_t offset = 0, rows = 0, cols = 0;
    std::size_t p_at = 0, q_at = 0;  // its factors' offsets in the messages
  };
  const std::vector<matrix>& matrices() const noexcept { return matrices_; }

  // The first basis: normal values from (seed, stream), each matrix's
  // columns orthogonalized.
  std::vector<float> initial_basis(std::uint64_t seed) const;
  // The first message of gradient sum `m`: M Q on each matrix, then the
  // values sent whole.
  void project(std::span<const float> m, std::span<const float> q, std::span<float> p_message) const;
  // Gram-Schmidt on each matrix's r columns of P (a zero column stays zero).
  void orthogonalize(std::span<float> p_message) const;
  // The second message of `m`: M^T P on each matrix.
  void back_project(std::span<const float> m, std::span<const float> p_message, std::span<float> q_message) const;
  // What the step applies: P Q^T on each matrix, the summed values
  // elsewhere (`out`: the parameter section).
  void decompress(std::span<const float> p_message, std::span<const float> q_message, std::span<float> out) const;
  // Turns `m` into its residual: m - P Q_u^T on each matrix (q_unit: m's own
  // second message), zero elsewhere.
  void keep_residual(std::span<float> m, std::span<const float> p_message, std::span<const float> q_unit) const;

 private:
  std::size_t rank_;
  std::size_t parameters_;
  std::vector<matrix> matrices_;
  std::vector<std::pair<std::size_t, std::size_t>> whole_;  // ranges sent as they are
  // Where the values sent whole start in the first message: after the P factors.
  std::size_t whole_at() const noexcept { return matrices_.empty() ? 0 : matrices_.back().p_at + matrices_.back().rows * rank_; }
  std::size_t p_floats_ = 0, q_floats_ = 0;
};

// What the devices of one process share (See Note [PowerSGD steps]).
struct powersgd_setup {
  std::size_t rank = 4;
  std::int64_t start_step = 0;  // the first compressed step
  std::uint64_t seed = 0;
  // Reproducible mode: slice k's residual at the start of step s is
  // residuals->read(k, s); the basis is bases->read(0, s). Null in fast
  // mode, where each member keeps its own.
  std::shared_ptr<logical_worker_store> residuals;
  std::shared_ptr<logical_worker_store> bases;
  bool compresses(std::int64_t step) const noexcept { return step >= start_step; }
};

// The setup of a process whose replicas have `layout`: in reproducible mode
// with `slices` slices a step, their stores.
std::shared_ptr<powersgd_setup> make_powersgd_setup(const state_layout& layout, std::size_t rank, std::int64_t start_step,
                                                    std::uint64_t seed, bool reproducible, std::size_t slices);

}  // namespace dpactor
