#include "comms/gloo_header.hpp"

#include <algorithm>

namespace dpactor::gloo_header {

const char* op_name(std::uint64_t o) {
  switch (static_cast<op>(o)) {
    case op::all_reduce: return "all_reduce";
    case op::reduce_scatter: return "reduce_scatter";
    case op::all_gather: return "all_gather";
    case op::broadcast: return "broadcast";
    case op::barrier: return "barrier";
    case op::reduce_scatter_tree: return "reduce_scatter_tree";
    case op::all_reduce_int8: return "all_reduce_int8";
    case op::reduce_scatter_tree_bf16: return "reduce_scatter_tree_bf16";
    case op::all_gather_bf16: return "all_gather_bf16";
    case op::all_reduce_tree: return "all_reduce_tree";
    case op::all_reduce_header: return "all_reduce_header";
  }
  return "unknown operation";
}

std::size_t write(std::span<std::uint64_t> out, op o, std::uint64_t size, std::uint64_t root,
                  std::span<const std::uint64_t> extras) {
  out[0] = magic;
  out[1] = static_cast<std::uint64_t>(o);
  out[2] = size;
  out[3] = root;
  out[4] = extras.size();
  std::copy(extras.begin(), extras.end(), out.begin() + fixed_words);
  return (fixed_words + extras.size()) * sizeof(std::uint64_t);
}

std::string mismatch(const std::uint64_t* mine, const std::uint64_t* theirs, int peer, int rank) {
  const bool with_header = mine[1] == static_cast<std::uint64_t>(op::all_reduce_tree) ||
                           mine[1] == static_cast<std::uint64_t>(op::all_reduce_header);
  const bool per_rank_extras = with_header || mine[1] == static_cast<std::uint64_t>(op::reduce_scatter_tree) ||
                               mine[1] == static_cast<std::uint64_t>(op::reduce_scatter_tree_bf16);
  // The tree's root count sits in `root`; its extras are each rank's own,
  // but for the step header's length.
  const std::size_t compared = per_rank_extras ? fixed_words - 1 : fixed_words + extra_count(mine);
  const bool same = theirs[0] == magic && extra_count(theirs) <= max_extras &&
                    (per_rank_extras || extra_count(theirs) == extra_count(mine)) &&
                    std::equal(mine, mine + compared, theirs) &&
                    (!with_header || (extra_count(theirs) >= 1 && extra(theirs, 0) + 1 <= extra_count(theirs) &&
                                      extra(theirs, 0) == extra(mine, 0)));
  if (same) return "";
  return std::string(op_name(mine[1])) + ": rank " + std::to_string(peer) + " called " + describe(theirs) +
         ", rank " + std::to_string(rank) + " called " + describe(mine);
}

std::string describe(const std::uint64_t* h) {
  if (h[0] != magic) return "something that is not a dpactor collective";
  const char* unit = h[1] == static_cast<std::uint64_t>(op::all_reduce_int8)            ? " int8 values"
                     : h[1] == static_cast<std::uint64_t>(op::reduce_scatter_tree_bf16) ||
                               h[1] == static_cast<std::uint64_t>(op::all_gather_bf16)
                         ? " bf16 values"
                         : " floats";
  std::string s = std::string(op_name(h[1])) + " with " + std::to_string(h[2]) + unit + " (root " + std::to_string(h[3]) + ")";
  if ((h[1] == static_cast<std::uint64_t>(op::all_reduce_tree) || h[1] == static_cast<std::uint64_t>(op::all_reduce_header)) &&
      extra_count(h) >= 1)
    s += ", a step header of " + std::to_string(extra(h, 0)) + " floats";
  if (h[1] == static_cast<std::uint64_t>(op::all_gather)) {
    s += ", buffer sizes";
    for (std::uint64_t i = 0; i < std::min<std::uint64_t>(extra_count(h), max_extras); ++i) {
      s += ' ';
      s += std::to_string(extra(h, i));
    }
  }
  return s;
}

}  // namespace dpactor::gloo_header
