#pragma once
// The bf16 codec of the round modes (sync.codec = "bf16"; docs/async.md).
//
// Note [Bf16 pseudo-gradients]
// Each worker's value v_k (its weighted pseudo-gradient plus its residual)
// travels rounded to bf16, the upper 16 bits of its float (round to nearest,
// ties to even), and the worker keeps the residual v_k - bf16(v_k), exactly
// representable, for its next round (error feedback). The rounded values are
// the summation tree's leaves: the members send each leaf's chunks to their
// owners in bf16 (collective::reduce_scatter_tree_bf16), the owners widen
// them (exactly) and add them in the tree's order, so the sum is bitwise
// what the fp32 tree gives for those leaves, on any number of devices. The
// owners then round their chunk of the sum to bf16 and the members gather it
// (collective::all_gather_bf16): the outer step applies the bf16-rounded sum,
// whose rounding (a relative 2^-9 at most, a function of the sum alone) is
// not fed back. Half of fp32's bytes in both halves of the exchange while a
// member runs one worker; a member that runs several sends each one's leaf,
// not their node, so bf16 saves less there (int8's sums are exact and save a
// quarter whatever the split).
//
// Note [Bf16 steps]
// sync.codec = "bf16" in every_step (as PyTorch DDP's bf16_compress_hook):
// the gradients travel in bf16 and the members apply the gathered
// bf16-rounded sum, each updating the whole state (nothing else is
// gathered). In reproducible mode the leaves are the step's slices (their
// gradient sums rounded to bf16), so the sum is the same bytes on any number
// of devices; in fast mode each member's gradient sum is one leaf, of a tree
// over the members, and the step does not overlap backward (no buckets).
// There is no error feedback: a slice is not a state that lives across
// steps (the DDP hook keeps none either), and the rounding of a gradient is
// a relative 2^-9 at most.

#include <bit>
#include <cstdint>

namespace dpactor {

inline std::uint16_t to_bf16(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace dpactor
