#include "comms/gloo.hpp"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <vector>

#include "comms/gloo_connect.hpp"
#include "comms/gloo_header.hpp"
#include "comms/gloo_process.hpp"
#include "comms/rank_order.hpp"
#include "comms/summation_tree.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;
using gloo_buffer = gloo::transport::UnboundBuffer;
using gloo_header::op;

// One tag per kind of message: a pair matches a slot's sends and receives in
// the order they were posted, and every rank posts in the same order. The
// connection's probes use 0x6475 (comms/gloo_connect.cpp): a message on it
// would land in a probe's empty receive and stop Gloo's event loop.
enum slot : std::uint64_t {
  header_slot = 0x6470,
  scatter_slot,
  gather_slot,
  broadcast_slot,
  tree_slot,
  early_slot = 0x6476,  // See Note [Parts sent with the header]
};

// The longest step header all_reduce_tree folds into its call header, with
// its length word: a quarter of the extras, the rest for the tree nodes.
constexpr std::size_t max_folded_header = gloo_header::max_extras / 4;

// One rank of a gloo group: the operations, each a header exchange then its
// payload, over the rank's connections (comms/gloo_connect.hpp).
class gloo_endpoint final : public collective {
 public:
  gloo_endpoint(std::shared_ptr<gloo_group_state> group, int rank)
      : group_(std::move(group)), rank_(rank), connection_(group_, rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size; }
  int shared_memory_peers() const noexcept { return connection_.shared_memory_peers(); }
  // Momentum and the like would double what crosses the network.
  bool gathers_gradients() const noexcept override { return true; }
  std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept override {
    return rank_chunk(size, group_->size, rank);
  }

  void all_reduce_sum(std::span<float> data, const collective_options& options) override {
    call(op::all_reduce, data.size(), 0, {}, options, [&](clock_type::time_point deadline) {
      scatter(data, deadline);
      const std::span<float> one[] = {data};
      gather(one, deadline);
    });
  }

  void reduce_scatter_sum(std::span<float> data, const collective_options& options) override {
    call(op::reduce_scatter, data.size(), 0, {}, options,
         [&](clock_type::time_point deadline) { scatter(data, deadline); });
  }

  void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) override {
    extras_.clear();
    for (const auto& b : buffers) extras_.push_back(b.size());
    call(op::all_gather, buffers.size(), 0, extras_, options,
         [&](clock_type::time_point deadline) { gather(buffers, deadline); });
  }

  void broadcast(std::span<float> data, int root, const collective_options& options) override {
    if (root < 0 || root >= group_->size) {
      fail(collective_errc::mismatch, "broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                                          std::to_string(group_->size));
    }
    call(op::broadcast, data.size(), static_cast<std::uint64_t>(root), {}, options,
         [&](clock_type::time_point deadline) { spread(data, root, deadline); });
  }

  void barrier(const collective_options& options) override {
    call(op::barrier, 0, 0, {}, options, [](clock_type::time_point) {});
  }

  // As all_reduce_sum, one byte a value: chunk c of every rank's buffer goes
  // to rank c, which sums it and sends the sum back to every rank.
  void all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options) override {
    call(op::all_reduce_int8, data.size(), 0, {}, options, [&](clock_type::time_point deadline) {
      scatter_int8(data, deadline);
      gather_values(reinterpret_cast<std::byte*>(data.data()), data.size(), 1, deadline);
    });
  }
  bool moves_int8() const noexcept override { return true; }

  // As reduce_scatter_tree, two bytes a value: each part's chunk c goes to
  // rank c as bf16, which widens and evaluates the tree there.
  void reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                                const collective_options& options) override {
    part_nodes(parts, out.size(), op::reduce_scatter_tree_bf16);
    call(op::reduce_scatter_tree_bf16, out.size(), slices, extras_, options,
         [&](clock_type::time_point deadline) { bf16_tree_sum(slices, parts, out, deadline); });
  }

  void all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options) override {
    call(op::all_gather_bf16, data.size(), 0, {}, options, [&](clock_type::time_point deadline) {
      gather_values(reinterpret_cast<std::byte*>(data.data()), data.size(), sizeof(std::uint16_t), deadline);
    });
  }
  bool moves_bf16() const noexcept override { return true; }

  // See Note [Summation tree] and Note [Gloo sums like the local backend].
  void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                           const collective_options& options) override {
    part_nodes(parts, out.size(), op::reduce_scatter_tree);
    call(op::reduce_scatter_tree, out.size(), slices, extras_, options,
         [&](clock_type::time_point deadline) { tree_sum(slices, parts, out, deadline, 0); });
  }

  // See Note [One call a step]: as all_reduce_tree, `data` summed in rank
  // order (all_reduce_sum's bytes); between two ranks its whole buffer goes
  // with the header (See Note [Parts sent with the header]) and each rank
  // adds the two.
  bool all_reduce_with_header(std::span<float> data, std::span<float> header,
                              const std::function<bool(std::span<const float>)>& proceed,
                              const collective_options& header_options, const collective_options& options) override {
    // header_options' timeout, the same as options', bounds the whole call.
    if (group_->size == 1 || header.size() + 1 > max_folded_header)
      return collective::all_reduce_with_header(data, header, proceed, header_options, options);
    fold_header(header, 0);
    bool proceeded = false;
    bool early = false;
    call(
        op::all_reduce_header, data.size(), 0, extras_, header_options,
        [&] { early = send_early(data.data(), data.size()); },
        [&](clock_type::time_point deadline) {
          const std::size_t verified = verified_size_;
          verified_size_ = std::max(verified_size_, data.size());  // the headers agreed on it
          if (early) finish(ops_, deadline);
          sum_headers(header);
          if (!proceed(header)) return;
          proceeded = true;
          if (early && data.size() <= verified) {
            const float* in_rank_order[] = {rank_ == 0 ? data.data() : early_in_.data(),
                                            rank_ == 0 ? early_in_.data() : data.data()};
            float* const sum[] = {data.data()};
            sum_in_rank_order(in_rank_order, data.size(), sum);
            return;
          }
          scatter(data, deadline);
          const std::span<float> whole[] = {data};
          gather(whole, deadline);
        });
    return proceeded;
  }

  // See Note [One call a step]: the step header travels in the call's own
  // header, one float a word after its length, and every rank sums all of
  // them in rank order (sum_in_rank_order is element-wise, so the bytes are
  // all_reduce_sum's); the tree nodes follow it. A header too long to share
  // the extras with the nodes (over a thousand words: some 340 members)
  // takes the three calls; every rank decides alike, on its length alone.
  bool all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                       std::span<float> header, const std::function<bool(std::span<const float>)>& proceed,
                       const collective_options& header_options, const collective_options& options) override {
    // header_options' timeout, the same as options', bounds the whole call.
    if (group_->size == 1 || header.size() + 1 > max_folded_header)
      return collective::all_reduce_tree(slices, parts, out, header, proceed, header_options, options);
    part_nodes(parts, out.size(), op::all_reduce_tree);
    fold_header(header, extras_.size());
    bool proceeded = false;
    bool early_parts = false;
    const std::size_t first_node = 1 + header.size();
    call(
        op::all_reduce_tree, out.size(), slices, extras_, header_options,
        [&] { early_parts = send_part_early(parts, out.size()); },
        [&](clock_type::time_point deadline) {
          const std::size_t verified = verified_size_;
          verified_size_ = std::max(verified_size_, out.size());  // the headers agreed on it
          if (early_parts) finish(ops_, deadline);
          sum_headers(header);
          if (!proceed(header)) return;
          proceeded = true;
          if (early_parts && out.size() <= verified && whole_parts_are_cheaper(parts.size(), first_node)) {
            whole_tree_from_early_part(slices, parts, out, first_node);
            return;
          }
          if (whole_parts_are_cheaper(parts.size(), first_node)) {
            whole_tree_sum(slices, parts, out, deadline, first_node);
            return;
          }
          tree_sum(slices, parts, out, deadline, first_node);
          const std::span<float> whole[] = {out};
          gather(whole, deadline);
        });
    return proceeded;
  }

 private:
  // Puts the step header's length and floats (one a word) in front of the
  // `kept` extras already there (See Note [One call a step]).
  void fold_header(std::span<const float> header, std::size_t kept) {
    extras_.resize(kept);
    extras_.resize(1 + header.size() + kept);
    std::copy_backward(extras_.begin(), extras_.begin() + static_cast<std::ptrdiff_t>(kept), extras_.end());
    extras_[0] = header.size();
    for (std::size_t i = 0; i < header.size(); ++i) extras_[1 + i] = std::bit_cast<std::uint32_t>(header[i]);
  }

  // The tree nodes of a reduce-scatter's parts, into extras_ (the header's);
  // a part of another length than the output is a mismatch.
  template <class Part>
  void part_nodes(std::span<const Part> parts, std::size_t size, op o) {
    extras_.clear();
    for (const Part& p : parts) {
      if (p.data.size() != size)
        fail(collective_errc::mismatch, std::string(gloo_header::op_name(o)) + ": a part of node " +
                                            std::to_string(p.node) + " has " + std::to_string(p.data.size()) +
                                            " values, not " + std::to_string(size));
      extras_.push_back(p.node);
    }
  }

  // A whole call: connect on first use, exchange headers, then the payload.
  // Any failure aborts the group (See Note [Gloo sums like the local
  // backend]) and throws collective_error.
  template <class Payload>
  void call(op o, std::uint64_t size, std::uint64_t root, std::span<const std::uint64_t> extras,
            const collective_options& options, Payload payload) {
    call(o, size, root, extras, options, [] {}, payload);
  }
  // The same, `early` run once connected, before the headers move.
  template <class Early, class Payload>
  void call(op o, std::uint64_t size, std::uint64_t root, std::span<const std::uint64_t> extras,
            const collective_options& options, Early early, Payload payload) {
    if (group_->aborted) fail(collective_errc::aborted, std::string(gloo_header::op_name(o)) + ": aborted");
    const auto deadline = clock_type::now() + options.timeout;
    if (extras.size() > gloo_header::max_extras)
      fail(collective_errc::mismatch, std::string(gloo_header::op_name(o)) + ": " + std::to_string(extras.size()) +
                                          " buffers or parts, more than " + std::to_string(gloo_header::max_extras));
    // A group of one exchanges nothing; its tree sum is still evaluated.
    if (group_->size == 1) {
      if (o == op::reduce_scatter_tree || o == op::reduce_scatter_tree_bf16) payload(deadline);
      return;
    }
    // See Note [SIGPIPE without a process-wide disposition].
    const sigpipe_guard no_sigpipe;
    try {
      if (!connection_.started()) connect();
      early();
      exchange_headers(o, size, root, extras, options, deadline);
      payload(deadline);
    } catch (const collective_error&) {
      forget_posted();
      throw;
    } catch (const std::exception& e) {  // gloo::Exception, or the store's
      forget_posted();
      lost(o, deadline, e.what());
    }
  }

  // No Gloo handle on the caller's memory outlives the call.
  void forget_posted() {
    ops_.clear();
    if (auto* shm = connection_.shared_memory()) shm->clear();
  }

  // A Gloo or store failure during a call: the group ends here.
  [[noreturn]] void lost(op o, clock_type::time_point deadline, const std::string& what) {
    const std::string name = gloo_header::op_name(o);
    if (group_->aborted) {
      const std::string why = group_->reason();
      fail(collective_errc::aborted, name + " aborted" + (why.empty() ? "" : ": " + why));
    }
    if (clock_type::now() >= deadline) fail(collective_errc::timeout, name + " timed out waiting for the other ranks");
    fail(collective_errc::aborted, name + " failed: " + what);
  }

  // Aborts the group (every local rank, and through the sockets every peer)
  // and throws.
  [[noreturn]] void fail(collective_errc code, const std::string& what) { group_->fail(rank_, code, what); }

  // Connects to every peer, then posts nothing yet: the headers' buffers,
  // one per peer (See Note [Gloo waits look up every health_slice]).
  void connect() {
    const int n = group_->size;
    connection_.connect(clock_type::now() + group_->options.rendezvous_timeout);
    header_out_storage_.resize(gloo_header::capacity);
    header_out_.resize(static_cast<std::size_t>(n));
    header_in_storage_.assign(static_cast<std::size_t>(n) * gloo_header::capacity, 0);
    header_in_.resize(static_cast<std::size_t>(n));
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank_) {
        header_out_[static_cast<std::size_t>(peer)] =
            connection_.buffer(header_out_storage_.data(), gloo_header::capacity * sizeof(std::uint64_t));
        header_in_[static_cast<std::size_t>(peer)] = connection_.buffer(
            header_in_storage_.data() + static_cast<std::size_t>(peer) * gloo_header::capacity,
            gloo_header::capacity * sizeof(std::uint64_t));
      }
  }

  bool shares_memory(int peer) {
    const auto* shm = connection_.shared_memory();
    return shm != nullptr && shm->shares_memory(peer);
  }
  bool transfers_pending() {
    const auto* shm = connection_.shared_memory();
    return shm != nullptr && !shm->empty();
  }

  // Drives the shared-memory transfers (See shm_exchange::drive); a peer's
  // message of another length is a mismatch.
  bool drive(std::size_t target, clock_type::time_point wake, clock_type::time_point deadline) {
    try {
      return connection_.shared_memory()->drive(target, wake, deadline, connection_.health());
    } catch (const std::length_error& e) {
      fail(collective_errc::mismatch, e.what());
    }
  }

  // Sends this rank's header to every peer, receives each peer's, and checks
  // that they called the same operation on the same sizes.
  void exchange_headers(op o, std::uint64_t size, std::uint64_t root, std::span<const std::uint64_t> extras,
                        const collective_options& options, clock_type::time_point deadline) {
    const int n = group_->size;
    auto& out = header_out_storage_;
    const std::size_t bytes = gloo_header::write(out, o, size, root, extras);
    const std::size_t posted_bytes = gloo_header::capacity * sizeof(std::uint64_t);
    if (auto* shm = connection_.shared_memory()) shm->clear();
    header_transfer_.assign(static_cast<std::size_t>(n), shm_exchange::all);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      std::uint64_t* in = header_in_storage_.data() + static_cast<std::size_t>(peer) * gloo_header::capacity;
      if (shares_memory(peer)) {
        header_transfer_[static_cast<std::size_t>(peer)] =
            connection_.shared_memory()->post(reinterpret_cast<std::byte*>(in), posted_bytes, peer, false, false);
        continue;
      }
      header_in_[static_cast<std::size_t>(peer)]->recv(peer, header_slot, 0, posted_bytes);
    }
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      if (shares_memory(peer)) connection_.shared_memory()->post(reinterpret_cast<std::byte*>(out.data()), bytes, peer, true);
      else header_out_[static_cast<std::size_t>(peer)]->send(peer, header_slot, 0, bytes);
    }
    wait_headers(options, deadline);
    if (transfers_pending()) drive(shm_exchange::all, clock_type::time_point::max(), deadline);
    if (auto* shm = connection_.shared_memory()) shm->clear();
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank_ && !shares_memory(peer))
        connection_.wait(*header_out_[static_cast<std::size_t>(peer)], wait_alarm::kind::send, peer, deadline);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const std::string difference = gloo_header::mismatch(
          out.data(), header_in_storage_.data() + static_cast<std::size_t>(peer) * gloo_header::capacity, peer, rank_);
      if (!difference.empty()) fail(collective_errc::mismatch, difference);
    }
  }

  // Waits for every peer's header. At options.late_at, tells the observer
  // which peers' headers have not arrived (each remaining peer gets
  // gloo_late_probe to show that its header is there).
  void wait_headers(const collective_options& options, clock_type::time_point deadline) {
    const int n = group_->size;
    bool tell = options.observer != nullptr && options.late_at != clock_type::time_point{};
    // Whether peer's header arrived by `until` (the deadline when none).
    auto header = [&](int peer, std::optional<clock_type::time_point> until) {
      const std::size_t t = header_transfer_[static_cast<std::size_t>(peer)];
      if (t != shm_exchange::all) return drive(t, until.value_or(clock_type::time_point::max()), deadline);
      return connection_.wait(*header_in_[static_cast<std::size_t>(peer)], wait_alarm::kind::recv, peer, deadline, until);
    };
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      if (!tell) {
        header(peer, std::nullopt);
        continue;
      }
      if (header(peer, options.late_at)) continue;
      // Late: this peer is missing; probe the rest.
      std::vector<int> missing{peer};
      for (int q = peer + 1; q < n; ++q)
        if (q != rank_ && !header(q, clock_type::now() + gloo_late_probe)) missing.push_back(q);
      options.observer->on_late(missing);
      for (const int q : missing) header(q, std::nullopt);
      return;
    }
  }

  // Operations posted on Gloo buffers, each with one peer; their handles are
  // destroyed before the call returns (See Note [Posted memory outlives an
  // abort]).
  struct posted {
    std::unique_ptr<gloo_buffer> handle;
    int peer;
    wait_alarm::kind kind;
  };
  // A receive into, or a send of, `floats` at `data` with `peer`.
  void post(std::vector<posted>& ops, float* data, std::size_t floats, int peer, slot s, bool send) {
    post_bytes(ops, reinterpret_cast<std::byte*>(data), floats * sizeof(float), peer, s, send);
  }
  void post_bytes(std::vector<posted>& ops, std::byte* data, std::size_t bytes, int peer, slot s, bool send) {
    if (bytes == 0) return;
    if (shares_memory(peer)) {
      connection_.shared_memory()->post(data, bytes, peer, send);
      return;
    }
    ops.push_back({connection_.buffer(data, bytes), peer, send ? wait_alarm::kind::send : wait_alarm::kind::recv});
    if (send) ops.back().handle->send(peer, s, 0, bytes);
    else ops.back().handle->recv(peer, s, 0, bytes);
  }
  void post_recv(std::vector<posted>& ops, float* data, std::size_t floats, int peer, slot s) {
    post(ops, data, floats, peer, s, false);
  }
  void post_send(std::vector<posted>& ops, float* data, std::size_t floats, int peer, slot s) {
    post(ops, data, floats, peer, s, true);
  }
  // Shared-memory transfers first: Gloo's go on in its event loop meanwhile.
  void finish(std::vector<posted>& ops, clock_type::time_point deadline) {
    if (transfers_pending()) drive(shm_exchange::all, clock_type::time_point::max(), deadline);
    if (auto* shm = connection_.shared_memory()) shm->clear();
    for (posted& p : ops) connection_.wait(*p.handle, p.kind, p.peer, deadline);
    ops.clear();
  }

  // all_reduce_tree's step header: every rank's (its header's extras 1 to
  // the length) summed in rank order into `header`, this rank's own in place.
  void sum_headers(std::span<float> header) {
    const int n = group_->size;
    const std::size_t len = header.size();
    header_floats_.resize(static_cast<std::size_t>(n) * len);
    parts_.clear();
    for (int k = 0; k < n; ++k) {
      if (k == rank_) {
        parts_.push_back(header.data());
        continue;
      }
      const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(k) * gloo_header::capacity;
      float* to = header_floats_.data() + static_cast<std::size_t>(k) * len;
      for (std::size_t i = 0; i < len; ++i) to[i] = std::bit_cast<float>(static_cast<std::uint32_t>(gloo_header::extra(h, 1 + i)));
      parts_.push_back(to);
    }
    float* const sum[] = {header.data()};
    sum_in_rank_order(parts_, len, sum);
  }

  // Reduce-scatter (See Note [Gloo sums like the local backend]): chunk c of
  // every buffer goes to rank c, which sums them in rank order into its own.
  void scatter(std::span<float> data, clock_type::time_point deadline) {
    const int n = group_->size;
    const auto [begin, end] = chunk(data.size(), rank_);
    const std::size_t len = end - begin;
    staging_.resize(static_cast<std::size_t>(n) * len);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      post_recv(ops_, staging_.data() + static_cast<std::size_t>(peer) * len, len, peer, scatter_slot);
      const auto [pb, pe] = chunk(data.size(), peer);
      post_send(ops_, data.data() + pb, pe - pb, peer, scatter_slot);
    }
    finish(ops_, deadline);
    parts_.clear();
    for (int k = 0; k < n; ++k)
      parts_.push_back(k == rank_ ? data.data() + begin : staging_.data() + static_cast<std::size_t>(k) * len);
    float* const sum[] = {data.data() + begin};
    sum_in_rank_order(parts_, len, sum);
  }

  // All-gather: each rank's chunk of each buffer goes to every other rank.
  void gather(std::span<const std::span<float>> buffers, clock_type::time_point deadline) {
    const int n = group_->size;
    for (const auto& b : buffers) {
      const auto [begin, end] = chunk(b.size(), rank_);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == rank_) continue;
        const auto [pb, pe] = chunk(b.size(), peer);
        post_recv(ops_, b.data() + pb, pe - pb, peer, gather_slot);
        post_send(ops_, b.data() + begin, end - begin, peer, gather_slot);
      }
    }
    finish(ops_, deadline);
  }

  // all_reduce_sum_int8's first half: scatter() on bytes.
  void scatter_int8(std::span<std::int8_t> data, clock_type::time_point deadline) {
    const int n = group_->size;
    const auto [begin, end] = chunk(data.size(), rank_);
    const std::size_t len = end - begin;
    staging_int8_.resize(static_cast<std::size_t>(n) * len);
    auto* bytes = reinterpret_cast<std::byte*>(data.data());
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      post_bytes(ops_, reinterpret_cast<std::byte*>(staging_int8_.data()) + static_cast<std::size_t>(peer) * len, len,
                 peer, scatter_slot, false);
      const auto [pb, pe] = chunk(data.size(), peer);
      post_bytes(ops_, bytes + pb, pe - pb, peer, scatter_slot, true);
    }
    finish(ops_, deadline);
    int8_parts_.clear();
    for (int k = 0; k < n; ++k)
      int8_parts_.push_back(k == rank_ ? data.data() + begin : staging_int8_.data() + static_cast<std::size_t>(k) * len);
    std::int8_t* const sum[] = {data.data() + begin};
    sum_int8(int8_parts_, len, sum);
  }
  // All-gather of `count` values of `width` bytes at `data`: each rank's
  // chunk goes to every other rank.
  void gather_values(std::byte* data, std::size_t count, std::size_t width, clock_type::time_point deadline) {
    const auto [begin, end] = chunk(count, rank_);
    for (int peer = 0; peer < group_->size; ++peer) {
      if (peer == rank_) continue;
      const auto [pb, pe] = chunk(count, peer);
      post_bytes(ops_, data + width * pb, width * (pe - pb), peer, gather_slot, false);
      post_bytes(ops_, data + width * begin, width * (end - begin), peer, gather_slot, true);
    }
    finish(ops_, deadline);
  }

  // Broadcast: the root sends its buffer to every other rank.
  void spread(std::span<float> data, int root, clock_type::time_point deadline) {
    if (rank_ == root) {
      for (int peer = 0; peer < group_->size; ++peer)
        if (peer != rank_) post_send(ops_, data.data(), data.size(), peer, broadcast_slot);
    } else {
      post_recv(ops_, data.data(), data.size(), root, broadcast_slot);
    }
    finish(ops_, deadline);
  }

  // reduce_scatter_tree: each part's chunk c goes to rank c, which evaluates
  // the tree over its chunk from every rank's parts (the nodes came in the
  // headers, from extra `first_node` on).
  void tree_sum(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                clock_type::time_point deadline, std::size_t first_node) {
    const int n = group_->size;
    const summation_tree tree(slices);
    const auto [begin, end] = chunk(out.size(), rank_);
    const std::size_t len = end - begin;
    nodes_.clear();
    part_data_.clear();
    if (n == 1) {
      for (const tree_part& p : parts) {
        nodes_.push_back(p.node);
        part_data_.push_back(p.data.data());
      }
      evaluate(tree, 0, out.size(), out.data());
      return;
    }
    // Every rank's nodes in rank order; the others' chunks are staged, each
    // peer's parts one after another.
    const std::size_t foreign = foreign_parts(first_node);
    staging_.resize(foreign * len);
    std::size_t next = 0;
    for (int k = 0; k < n; ++k) {
      if (k == rank_) {
        for (const tree_part& p : parts) {
          nodes_.push_back(p.node);
          part_data_.push_back(p.data.data() + begin);
        }
        continue;
      }
      const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(k) * gloo_header::capacity;
      const std::size_t first = next;
      for (std::uint64_t i = first_node; i < gloo_header::extra_count(h); ++i) {
        nodes_.push_back(static_cast<std::uint32_t>(gloo_header::extra(h, i)));
        part_data_.push_back(staging_.data() + next * len);
        ++next;
      }
      // Peer k's parts arrive one message each, in its order.
      for (std::size_t i = first; i < next; ++i) post_recv(ops_, staging_.data() + i * len, len, k, tree_slot);
    }
    for (const tree_part& p : parts)
      for (int peer = 0; peer < n; ++peer) {
        if (peer == rank_) continue;
        const auto [pb, pe] = chunk(out.size(), peer);
        post_send(ops_, p.data.data() + pb, pe - pb, peer, tree_slot);
      }
    finish(ops_, deadline);
    evaluate(tree, 0, len, out.data() + begin);
  }

  // Whether all_reduce_tree sends every part whole to every peer, each rank
  // then evaluating the whole tree: one round trip instead of two (the
  // reduce-scatter, then the gather). A rank holding p parts of s floats
  // sends p * s * (n - 1) that way against p * s * (n - 1) / n + s * (n - 1)
  // / n: no more exactly where n = 2 and no rank holds more than one part.
  // Every rank decides alike, from the headers.
  bool whole_parts_are_cheaper(std::size_t own_parts, std::size_t first_node) const {
    if (group_->size != 2 || own_parts > 1) return false;
    const int peer = 1 - rank_;
    const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(peer) * gloo_header::capacity;
    return gloo_header::extra_count(h) - first_node <= 1;
  }

  // Note [Parts sent with the header]
  // Between two ranks over TCP, all_reduce_tree's part leaves with the call's
  // header, not a round trip after it: each rank posts one receive for the
  // peer's part and sends one message, its part or a one-float placeholder.
  // A receive smaller than the message would stop Gloo's event loop (the
  // reason every call's header goes first), so a part is sent early only if
  // no longer than the largest size the two ranks' headers have agreed on
  // before (verified_size_, the same on both), and the receive takes at
  // least that: whatever a peer sends early fits, even a peer that called
  // with another size, which the headers then name. The first call, and a
  // call larger than any before, send the placeholder; so does a rank
  // holding several parts. The whole tree is evaluated from the early parts
  // where both ranks sent theirs (or hold none); otherwise the call goes on
  // as without them, the early bytes unused.
  // all_reduce_with_header sends its whole buffer the same way.
  bool send_part_early(std::span<const tree_part> parts, std::size_t size) {
    return send_early(parts.size() == 1 ? parts[0].data.data() : nullptr, size);
  }
  // Posts the receive and sends `data` (`size` floats) or the placeholder.
  bool send_early(float* data, std::size_t size) {
    const int peer = 1 - rank_;
    if (group_->size != 2 || shares_memory(peer)) return false;
    early_in_.resize(std::max({size, verified_size_, std::size_t{1}}));
    post_recv(ops_, early_in_.data(), early_in_.size(), peer, early_slot);
    if (data != nullptr && size >= 1 && size <= verified_size_) post_send(ops_, data, size, peer, early_slot);
    else post_send(ops_, &placeholder_, 1, peer, early_slot);
    return true;
  }

  // The whole tree from this rank's part and the peer's early one (See Note
  // [Parts sent with the header]); whole_parts_are_cheaper() holds.
  void whole_tree_from_early_part(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                                  std::size_t first_node) {
    const int peer = 1 - rank_;
    const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(peer) * gloo_header::capacity;
    nodes_.clear();
    part_data_.clear();
    const auto add_own = [&] {
      for (const tree_part& p : parts) {
        nodes_.push_back(p.node);
        part_data_.push_back(p.data.data());
      }
    };
    const auto add_peer = [&] {
      if (gloo_header::extra_count(h) > first_node) {
        nodes_.push_back(static_cast<std::uint32_t>(gloo_header::extra(h, first_node)));
        part_data_.push_back(early_in_.data());
      }
    };
    if (rank_ == 0) {
      add_own();
      add_peer();
    } else {
      add_peer();
      add_own();
    }
    evaluate(summation_tree(slices), 0, out.size(), out.data());
  }

  // all_reduce_tree's payload where whole_parts_are_cheaper: every part
  // whole to every peer, and the tree over all of `out` here; the bytes of
  // tree_sum's chunks, as the plan is evaluated element by element.
  void whole_tree_sum(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                      clock_type::time_point deadline, std::size_t first_node) {
    const int n = group_->size;
    const summation_tree tree(slices);
    const std::size_t size = out.size();
    nodes_.clear();
    part_data_.clear();
    const std::size_t foreign = foreign_parts(first_node);
    staging_.resize(foreign * size);
    // Receives first: a send that finds its receive posted goes out from
    // this thread at once, not later from Gloo's event loop.
    std::size_t next = 0;
    for (int k = 0; k < n; ++k) {
      if (k == rank_) {
        for (const tree_part& p : parts) {
          nodes_.push_back(p.node);
          part_data_.push_back(p.data.data());
        }
        continue;
      }
      const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(k) * gloo_header::capacity;
      for (std::uint64_t i = first_node; i < gloo_header::extra_count(h); ++i, ++next) {
        nodes_.push_back(static_cast<std::uint32_t>(gloo_header::extra(h, i)));
        part_data_.push_back(staging_.data() + next * size);
        post_recv(ops_, staging_.data() + next * size, size, k, tree_slot);
      }
    }
    for (const tree_part& p : parts)
      for (int peer = 0; peer < n; ++peer)
        if (peer != rank_) post_send(ops_, p.data.data(), size, peer, tree_slot);
    finish(ops_, deadline);
    evaluate(tree, 0, size, out.data());
  }

  // reduce_scatter_tree_bf16's payload: as tree_sum, with bf16 chunks
  // widened on arrival.
  void bf16_tree_sum(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                     clock_type::time_point deadline) {
    const int n = group_->size;
    const summation_tree tree(slices);
    const auto [first, last] = chunk(out.size(), rank_);  // a group of one: all of it
    const std::size_t len = last - first;
    nodes_.clear();
    const std::size_t foreign = foreign_parts(0);
    staging_bf16_.resize(foreign * len);
    // Every rank's nodes in rank order; the others' chunks arrive staged.
    std::vector<std::pair<const std::uint16_t*, bool>> sources;  // (chunk, own part)
    std::size_t next = 0;
    for (int k = 0; k < n; ++k) {
      if (k == rank_) {
        for (const tree_part_bf16& p : parts) {
          nodes_.push_back(p.node);
          sources.emplace_back(p.data.data() + first, true);
        }
        continue;
      }
      const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(k) * gloo_header::capacity;
      const std::size_t from = next;
      for (std::uint64_t i = 0; i < gloo_header::extra_count(h); ++i) {
        nodes_.push_back(static_cast<std::uint32_t>(gloo_header::extra(h, i)));
        sources.emplace_back(staging_bf16_.data() + next * len, false);
        ++next;
      }
      for (std::size_t i = from; i < next; ++i)
        post_bytes(ops_, reinterpret_cast<std::byte*>(staging_bf16_.data() + i * len), 2 * len, k, tree_slot, false);
    }
    for (const tree_part_bf16& p : parts)
      for (int peer = 0; peer < n; ++peer) {
        if (peer == rank_) continue;
        const auto [pb, pe] = chunk(out.size(), peer);
        post_bytes(ops_, reinterpret_cast<std::byte*>(const_cast<std::uint16_t*>(p.data.data() + pb)), 2 * (pe - pb), peer,
                   tree_slot, true);
      }
    finish(ops_, deadline);
    widened_.resize(sources.size() * len);
    part_data_.clear();
    for (std::size_t i = 0; i < sources.size(); ++i) {
      float* to = widened_.data() + i * len;
      for (std::size_t j = 0; j < len; ++j) to[j] = std::bit_cast<float>(static_cast<std::uint32_t>(sources[i].first[j]) << 16);
      part_data_.push_back(to);
    }
    evaluate(tree, 0, len, out.data() + first);
  }

  // The tree parts the peers' headers announce, their nodes from extra
  // `first_node` on.
  std::size_t foreign_parts(std::size_t first_node) const {
    std::size_t parts = 0;
    for (int k = 0; k < group_->size; ++k)
      if (k != rank_)
        parts += static_cast<std::size_t>(gloo_header::extra_count(header_in_storage_.data() + static_cast<std::size_t>(k) * gloo_header::capacity)) - first_node;
    return parts;
  }

  // Plans the tree over nodes_ and evaluates [begin, end) of part_data_'s
  // pointers into out.
  void evaluate(const summation_tree& tree, std::size_t begin, std::size_t end, float* out) {
    try {
      plan_.build(tree, nodes_);
    } catch (const std::invalid_argument& e) {
      fail(collective_errc::mismatch, std::string("reduce_scatter_tree: ") + e.what());
    }
    plan_.run(part_data_.data(), begin, end, out);
  }

  std::shared_ptr<gloo_group_state> group_;
  const int rank_;
  // Declared first, destroyed last: every Gloo buffer below is gone before
  // the context it was made on.
  gloo_connection connection_;
  std::vector<std::uint64_t> header_out_storage_;
  std::vector<std::uint64_t> header_in_storage_;  // peer p's header at p * gloo_header::capacity
  std::vector<std::unique_ptr<gloo_buffer>> header_out_;  // per peer, over header_out_storage_
  std::vector<std::unique_ptr<gloo_buffer>> header_in_;
  std::vector<std::uint64_t> extras_;
  std::vector<float> staging_;
  std::vector<float> header_floats_;  // all_reduce_tree's: peer k's step header at k * its length
  // See Note [Parts sent with the header]: the largest size both ranks'
  // all_reduce_tree headers agreed on, the peer's early part, the placeholder.
  std::size_t verified_size_ = 0;
  std::vector<float> early_in_;
  float placeholder_ = 0.0f;
  std::vector<const float*> parts_;
  std::vector<std::uint16_t> staging_bf16_;  // reduce_scatter_tree_bf16's
  std::vector<float> widened_;
  std::vector<std::int8_t> staging_int8_;  // all_reduce_sum_int8's
  std::vector<const std::int8_t*> int8_parts_;
  std::vector<posted> ops_;  // the call's payload operations
  std::vector<std::size_t> header_transfer_;  // per peer, its header's shared-memory transfer (or all)
  tree_plan plan_;
  std::vector<std::uint32_t> nodes_;
  std::vector<const float*> part_data_;
};

class gloo_group final : public collective_group {
 public:
  gloo_group(std::shared_ptr<rendezvous_store> store, int size, gloo_group_options options)
      : state_(std::make_shared<gloo_group_state>(std::move(store), size, std::move(options))) {}
  int size() const noexcept override { return state_->size; }
  std::unique_ptr<collective> endpoint(int rank) override { return std::make_unique<gloo_endpoint>(state_, rank); }
  void abort() override { state_->abort("the group was aborted"); }
  bool aborted() const noexcept override { return state_->aborted; }
  bool spans_processes() const noexcept override { return true; }

 private:
  std::shared_ptr<gloo_group_state> state_;
};

}  // namespace

int gloo_shared_memory_peers(const collective& endpoint) noexcept {
  const auto* e = dynamic_cast<const gloo_endpoint*>(&endpoint);
  return e != nullptr ? e->shared_memory_peers() : 0;
}

std::shared_ptr<collective_group> make_gloo_group(std::shared_ptr<rendezvous_store> store, int size,
                                                  gloo_group_options options) {
  if (size < 1) throw std::invalid_argument("gloo group: size " + std::to_string(size) + " is not positive");
  if (!store) throw std::invalid_argument("gloo group: no rendezvous store");
  return std::make_shared<gloo_group>(std::move(store), size, std::move(options));
}

}  // namespace dpactor
