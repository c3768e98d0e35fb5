#pragma once
// The collective interface every backend implements: in-place sum all-reduce
// over floats, reduce-scatter and all-gather, the summation tree's
// reduce-scatter, broadcast from a rank, barrier; and the round modes'
// codecs' exchanges (int8 sums, bf16 leaves), which a backend may leave to
// the defaults that widen to floats. Every call takes options with a
// timeout; abort() may be called from any thread and makes every pending and
// future call of the group fail fast with collective_error.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include <dpactor/error.hpp>

namespace dpactor {

enum class collective_errc {
  aborted,   // abort() was called on the group, or a member failed
  timeout,   // the call did not complete within its timeout; the group is broken
  mismatch,  // ranks called with different sizes or roots; the group is broken
};

// An error of code error_kind::collective; reason() (and, seen as a
// collective_error, code()) says which.
class collective_error : public error {
 public:
  collective_error(collective_errc code, const std::string& what) : error(error_kind::collective, what), code_(code) {}
  collective_errc reason() const noexcept { return code_; }
  collective_errc code() const noexcept { return code_; }

 private:
  collective_errc code_;
};

// A call's timeout is a backstop for a member that never arrives; the reducer
// normally ends a hung generation sooner by aborting the group.
inline constexpr std::chrono::milliseconds default_collective_timeout{std::chrono::minutes(10)};

// Told, once per call, which ranks have not arrived by options.late_at.
// Backends that cannot tell (NCCL) pass an empty list; the reducer then counts
// as missing the members that have not said they are waiting themselves.
class late_observer {
 public:
  virtual ~late_observer() = default;
  virtual void on_late(std::span<const int> missing_ranks) = 0;
};

// A node of a step's summation tree held by one rank, and its values.
struct tree_part {
  std::uint32_t node = 0;
  std::span<float> data;
};

// The same in bf16 (the upper 16 bits of a float): the bf16 codec's leaves
// (See Note [Bf16 pseudo-gradients], train/bf16_codec.hpp).
struct tree_part_bf16 {
  std::uint32_t node = 0;
  std::span<const std::uint16_t> data;
};

struct collective_options {
  std::chrono::milliseconds timeout = default_collective_timeout;
  // If set: when the call is still waiting for other ranks at late_at, the
  // observer learns which ones (backends that cannot tell pass an empty list).
  late_observer* observer = nullptr;
  std::chrono::steady_clock::time_point late_at{};
};

// Note [Posted memory outlives an abort]
// A call may let the other ranks read and write the memory it was given (the
// local backend sums and copies straight between the ranks' buffers; NCCL
// reads peers' device memory). So no call returns, normally or by throwing,
// while a peer may still touch that memory, however the group ends: the
// caller frees it as soon as the call returns (a device actor that leaves a
// failed generation destroys its step runner). An abort therefore still
// waits, briefly, for every peer that has begun touching this rank's memory
// to stop: the local backend's closing barrier drains (comms/spin_barrier),
// the driver group aborts every rank's driver before any returns. A peer
// that cannot be waited for (a thread that is never scheduled again) makes
// the group poisoned: the rank's thread never returns into memory that a peer
// would corrupt; it stays in the call, says so on stderr, and the engine's
// teardown reports it as a stuck thread (the host ends the process; the
// library never aborts it). tests/collective_abort_test is the abort storm
// that checks this under AddressSanitizer.

// One rank's endpoint of a group; used by that rank's thread only.
class collective {
 public:
  virtual ~collective() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Every rank passes a buffer of the same length; on return each holds the
  // element-wise sum, bitwise identical on every rank.
  virtual void all_reduce_sum(std::span<float> data, const collective_options& options) = 0;
  // The part [begin, end) of a buffer of `size` floats that `rank` owns in
  // reduce_scatter_sum and all_gather; the parts tile the buffer in rank order.
  virtual std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept = 0;
  // On return this rank's chunk of `data` holds the element-wise sum over the
  // ranks (bitwise what all_reduce_sum would give there); the rest of `data` is
  // unspecified.
  virtual void reduce_scatter_sum(std::span<float> data, const collective_options& options) = 0;
  // For each buffer, copies every rank's chunk to the other ranks; each rank
  // passes the same number of buffers with the same lengths.
  virtual void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) = 0;
  // Copies root's buffer into every other rank's buffer of the same length.
  virtual void broadcast(std::span<float> data, int root, const collective_options& options) = 0;
  // The reduce-scatter of reproducible mode (See Note [Summation tree]): each
  // rank passes the tree nodes it holds over a step of `slices` slices, all
  // of out.size() floats, which together over the ranks hold every slice
  // exactly once. On return this rank's chunk of `out` holds the root's value
  // there, bitwise what tree_plan computes from all the parts; `out` may be
  // one of the parts. The default exchanges the parts by broadcast and works
  // on host memory only; backends that share memory do better.
  virtual void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                                   const collective_options& options);
  virtual void barrier(const collective_options& options) = 0;

  // Note [One call a step]
  // What a reproducible step does where the members gather the reduced
  // gradients (gathers_gradients(), or the round modes): the step header
  // all-reduced, then, if `proceed` says so on the summed header, the
  // members' tree nodes reduced (as reduce_scatter_tree) and every rank's
  // chunk gathered, so that every rank holds the whole root in `out`. One
  // call, so a backend that pays a round trip per call can fold the header
  // into the exchange it opens with: the gloo backend's header carries the
  // step header, three round trips a step instead of seven. `header` is
  // summed in rank order, bitwise what all_reduce_sum gives; `proceed` sees
  // the same sum on every rank, so every rank makes the same choice, and
  // without it nothing of `out` changes. `header_options` (its observer and
  // late_at: who has not arrived) govern the wait for the header,
  // `options` the rest. Returns whether it proceeded. The default makes the
  // three calls. all_reduce_with_header is the same for fast mode's steps,
  // which are not sliced.
  virtual bool all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                               std::span<float> header, const std::function<bool(std::span<const float>)>& proceed,
                               const collective_options& header_options, const collective_options& options);
  // The same for a step that is not sliced (fast mode): after the header,
  // `data` summed over the ranks in place, bitwise what all_reduce_sum
  // gives. The default makes the two calls.
  virtual bool all_reduce_with_header(std::span<float> data, std::span<float> header,
                                      const std::function<bool(std::span<const float>)>& proceed,
                                      const collective_options& header_options, const collective_options& options);

  // The int8 codec's exchange (See Note [Int8 pseudo-gradients],
  // train/int8_codec.hpp): every rank passes int8 values of the same length
  // whose sum over the ranks, and every partial sum, fits in int8 (the
  // codec's scale guarantees it); on return each rank holds the element-wise
  // sum. Integer addition is exact, so the bytes do not depend on the order
  // or the number of ranks. The default widens to floats (exact for these
  // values), all-reduces them and narrows: four bytes a value on the wire.
  // Backends that move one byte a value say so in moves_int8().
  virtual void all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options);
  virtual bool moves_int8() const noexcept { return false; }

  // The bf16 codec's exchange (See Note [Bf16 pseudo-gradients]):
  // reduce_scatter_tree over parts held in bf16, each value widened to its
  // float exactly, so this rank's chunk of `out` is bitwise what
  // reduce_scatter_tree gives for the widened parts; then all_gather_bf16
  // copies every rank's chunk of a bf16 buffer to the others. The defaults
  // widen to floats and call the float operations: four bytes a value on the
  // wire. Backends that move two say so in moves_bf16().
  virtual void reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                                        const collective_options& options);
  virtual void all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options);
  virtual bool moves_bf16() const noexcept { return false; }

  // Whether the members of a step should gather the reduced gradients and
  // each update the whole state, rather than update their own chunk and
  // gather the state (parameters and every optimizer slot): true where moving
  // a byte costs more than updating it, as between processes. Either way
  // every element is updated by the same arithmetic, so the bytes are the
  // same (See Note [Sharded optimizer step]).
  virtual bool gathers_gradients() const noexcept { return false; }

  // See Note [Gradient buckets]. Whether start_reduce_scatter() returns
  // before the reduction is done, so that it overlaps the caller's compute.
  virtual bool overlaps_compute() const noexcept { return false; }
  // Enqueues reduce_scatter_sum(data) to run once the work enqueued so far on
  // `after` has completed (`after`: the replica's native stream, see
  // replica::native_stream(); null when the data is ready now) and returns
  // without waiting. Started calls run in the order started and before any
  // later call of this endpoint, which returns only after them and reports
  // their errors. Only where overlaps_compute(); the default throws.
  virtual void start_reduce_scatter(std::span<float> data, void* after);
};

inline void collective::start_reduce_scatter(std::span<float>, void*) {
  throw std::logic_error("collective: this backend has no asynchronous reduce-scatter");
}

// A group of ranks for one generation. The reducer keeps it to abort it from
// outside; each member takes its endpoint.
class collective_group {
 public:
  virtual ~collective_group() = default;
  virtual int size() const noexcept = 0;
  virtual std::unique_ptr<collective> endpoint(int rank) = 0;
  // Thread-safe, idempotent; wakes every waiting rank with collective_errc::aborted.
  virtual void abort() = 0;
  virtual bool aborted() const noexcept = 0;
  // Whether its ranks may live in several processes. Such a call can end
  // on some ranks and fail on others (a peer dies between its sends to
  // them), so a step may commit with the samples of a member whose own
  // call failed (See Note [A record before the exchange across processes]).
  virtual bool spans_processes() const noexcept { return false; }
};

}  // namespace dpactor
