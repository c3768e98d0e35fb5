#pragma once
// The header every call of the gloo backend opens with (See Note [Gloo sums
// like the local backend], comms/gloo.hpp): each rank sends it to every
// other before any payload moves. It is the call's barrier, and it finds
// ranks that called different operations or sizes while nothing else is in
// flight (a payload larger than the receiver posted would stop Gloo's event
// loop); all_reduce_tree's carries the step header too (See Note [One call
// a step], comms/collective.hpp). Pure data and checks: no Gloo, tested
// alone.
//
// Layout, in 64-bit words: magic, operation, size, root, extra count, then
// the extras (all_gather's buffer sizes, reduce_scatter_tree's nodes).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dpactor::gloo_header {

enum class op : std::uint64_t {
  all_reduce = 1,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier,
  reduce_scatter_tree,
  all_reduce_int8,
  reduce_scatter_tree_bf16,
  all_gather_bf16,
  all_reduce_tree,  // extras: the step header's length, its floats (one a word), then the tree nodes
  all_reduce_header,  // extras: the step header's length and its floats
};

// "all_reduce", ..., or "unknown operation".
const char* op_name(std::uint64_t o);
inline const char* op_name(op o) { return op_name(static_cast<std::uint64_t>(o)); }

inline constexpr std::uint64_t magic = 0x64706163746f7231;  // "dpactor1"
inline constexpr std::size_t fixed_words = 5;
// The most extras a call may carry: a rank's tree parts or gather buffers.
inline constexpr std::size_t max_extras = 4096;
// Words a receiver posts for any header.
inline constexpr std::size_t capacity = fixed_words + max_extras;

// A received header's fields.
inline std::uint64_t extra_count(const std::uint64_t* h) { return h[4]; }
inline std::uint64_t extra(const std::uint64_t* h, std::size_t i) { return h[fixed_words + i]; }

// Writes a call's header into `out` (capacity words); returns the bytes it
// takes on the wire. Extras beyond max_extras are the caller's to refuse.
std::size_t write(std::span<std::uint64_t> out, op o, std::uint64_t size, std::uint64_t root,
                  std::span<const std::uint64_t> extras);

// "" when rank `peer`'s header `theirs` called what this rank's `mine` did;
// else a message naming both calls. reduce_scatter_tree's extras differ per
// rank (each its own tree nodes) and are not compared; of all_reduce_tree's,
// the step header's length is.
std::string mismatch(const std::uint64_t* mine, const std::uint64_t* theirs, int peer, int rank);

// "all_gather with 12 floats (root 0), buffer sizes 5 7", or what a header
// that is not dpactor's is.
std::string describe(const std::uint64_t* h);

}  // namespace dpactor::gloo_header
