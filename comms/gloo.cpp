#include "comms/gloo.hpp"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DPACTOR_CPU_RELAX() _mm_pause()
#else
#define DPACTOR_CPU_RELAX() std::this_thread::yield()
#endif

#include "comms/rank_order.hpp"
#include "comms/shm_segment.hpp"
#include "comms/summation_tree.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;
using gloo_buffer = gloo::transport::UnboundBuffer;

// One tag per kind of message: a pair matches a slot's sends and receives in
// the order they were posted, and every rank posts in the same order.
enum slot : std::uint64_t { header_slot = 0x6470, scatter_slot, gather_slot, broadcast_slot, tree_slot, probe_slot };
// See Note [Gloo waits look up every health_slice]: how late a rank notices an
// abort or a broken connection that Gloo did not report.
constexpr std::chrono::milliseconds health_slice{5};

// A header: magic, operation, size, root, extra count, then the extras
// (all_gather's buffer sizes, reduce_scatter_tree's nodes).
constexpr std::uint64_t header_magic = 0x64706163746f7231;  // "dpactor1"
constexpr std::size_t header_fixed = 5;
// The most extras a call may carry: a rank's tree parts or gather buffers.
constexpr std::size_t max_header_extras = 4096;
constexpr std::size_t header_capacity = header_fixed + max_header_extras;  // words
// After late_at, how long the wait for each remaining peer's header may take
// before that peer counts as missing (its header is in flight or it is late).
constexpr std::chrono::milliseconds late_probe{2};
// How long a rank waiting on shared memory checks its doorbell before it
// sleeps on it: a peer's next message usually lands within microseconds when
// both are in the same phase, and a sleep costs a wake-up (tens of us).
constexpr std::chrono::microseconds shm_spin{20};

enum class op : std::uint64_t { all_reduce = 1, reduce_scatter, all_gather, broadcast, barrier, reduce_scatter_tree };

const char* op_name(std::uint64_t o) {
  switch (static_cast<op>(o)) {
    case op::all_reduce: return "all_reduce";
    case op::reduce_scatter: return "reduce_scatter";
    case op::all_gather: return "all_gather";
    case op::broadcast: return "broadcast";
    case op::barrier: return "barrier";
    case op::reduce_scatter_tree: return "reduce_scatter_tree";
  }
  return "unknown operation";
}

// tcp::Context::signalException is what Gloo runs on its own timeouts: it fails
// every pending operation on every pair and closes the sockets, and it is
// thread-safe, but protected. A pointer to it can be formed in a derived class.
struct tcp_access : gloo::transport::tcp::Context {
  static constexpr auto signal = &tcp_access::signalException;
};

// One tcp device (its event loop thread) per process and address, for every
// generation. Kept to the end of the process: destroying a device at exit,
// after its users, gains nothing.
std::shared_ptr<gloo::transport::Device> tcp_device(const std::string& address) {
  static std::mutex mutex;
  static auto& devices = *new std::map<std::string, std::shared_ptr<gloo::transport::Device>>();
  std::lock_guard lock(mutex);
  auto& device = devices[address];
  if (!device) {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    device = gloo::transport::tcp::CreateDevice(attr);
  }
  return device;
}

// A rank's Gloo context, connected by connect_rank() below instead of
// connectFullMesh, so that an abort reaches the connections while they are
// being made.
class rank_context final : public gloo::Context {
 public:
  rank_context(int rank, int size) : gloo::Context(rank, size) {}
  void attach(std::shared_ptr<gloo::transport::Device> device, std::shared_ptr<gloo::transport::Context> transport) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

struct group_state {
  group_state(std::shared_ptr<rendezvous_store> s, int n, gloo_group_options o)
      : store(std::move(s)), size(n), options(std::move(o)) {}
  const std::shared_ptr<rendezvous_store> store;
  const int size;
  const gloo_group_options options;
  std::atomic<bool> aborted{false};
  std::mutex mutex;  // guards why, transports and segments
  std::string why;
  std::vector<gloo::transport::tcp::Context*> transports;  // the local ranks', for abort
  std::vector<shm_segment*> segments;  // every segment a local rank mapped, for abort

  // Marks the group and fails everything pending on every local rank's
  // connections; peers see their calls fail (See Note [Same-machine ranks
  // share memory] for those waiting on shared memory). Idempotent.
  void abort(const std::string& reason) {
    std::lock_guard lock(mutex);
    if (!aborted.exchange(true)) why = reason;
    for (auto* t : transports) (t->*tcp_access::signal)(why);
    for (auto* s : segments) s->abort();
  }
  // Registers a segment for abort(); aborts it at once if the group is.
  void enlist(shm_segment* s) {
    std::lock_guard lock(mutex);
    segments.push_back(s);
    if (aborted) s->abort();
  }
  void discharge(shm_segment* s) {
    std::lock_guard lock(mutex);
    std::erase(segments, s);
  }
  std::string reason() {
    std::lock_guard lock(mutex);
    return why;
  }
  // Registers a rank's connections for abort(); false if the group is
  // already aborted (then nothing was registered).
  bool enlist(gloo::transport::tcp::Context* t) {
    std::lock_guard lock(mutex);
    if (aborted) return false;
    transports.push_back(t);
    return true;
  }
  void discharge(gloo::transport::tcp::Context* t) {
    std::lock_guard lock(mutex);
    std::erase(transports, t);
  }
};

// Interrupts a wait on a Gloo buffer at a given time (UnboundBuffer's own
// wait timeout would break the connections instead). One thread, started on
// first use, woken by arm() only when the new time is earlier than the one it
// sleeps until: a wait that completes before its alarm costs two lock
// acquisitions, not a thread switch.
class wait_alarm {
 public:
  enum class kind { recv, send };
  ~wait_alarm() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void arm(clock_type::time_point at, gloo_buffer* buffer, kind k) {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      at_ = at;
      buffer_ = buffer;
      kind_ = k;
      fired_ = false;
      wake = at < sleeping_until_;
    }
    if (wake) changed_.notify_all();
  }
  // Whether the alarm went off since arm().
  bool fired() {
    std::lock_guard lock(mutex_);
    return fired_;
  }
  // On return the alarm no longer touches the buffer.
  void disarm() {
    std::lock_guard lock(mutex_);
    buffer_ = nullptr;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (buffer_ == nullptr) {
        sleeping_until_ = clock_type::time_point::max();
        changed_.wait(lock);
        continue;
      }
      if (clock_type::now() < at_) {
        sleeping_until_ = at_;
        changed_.wait_until(lock, at_);
        continue;
      }
      fired_ = true;
      if (kind_ == kind::recv) buffer_->abortWaitRecv();
      else buffer_->abortWaitSend();
      buffer_ = nullptr;
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  clock_type::time_point at_{};
  clock_type::time_point sleeping_until_ = clock_type::time_point::max();
  gloo_buffer* buffer_ = nullptr;
  kind kind_ = kind::recv;
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;
};

std::chrono::milliseconds until(clock_type::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
  return std::max(left, std::chrono::milliseconds(1));
}

class gloo_endpoint final : public collective {
 public:
  gloo_endpoint(std::shared_ptr<group_state> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~gloo_endpoint() override {
    header_in_.clear();
    ops_.clear();
    header_out_.clear();
    probe_.reset();
    if (transport_ != nullptr) group_->discharge(transport_);
    if (inbox_) group_->discharge(inbox_.get());
    for (const auto& p : peers_)
      if (p) group_->discharge(p.get());
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size; }
  int shared_memory_peers() const noexcept {
    return static_cast<int>(std::count_if(peers_.begin(), peers_.end(), [](const auto& p) { return p != nullptr; }));
  }
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

  // See Note [Summation tree] and Note [Gloo sums like the local backend].
  void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                           const collective_options& options) override {
    extras_.clear();
    for (const tree_part& p : parts) {
      if (p.data.size() != out.size())
        fail(collective_errc::mismatch, "reduce_scatter_tree: a part of node " + std::to_string(p.node) + " has " +
                                            std::to_string(p.data.size()) + " floats, not " +
                                            std::to_string(out.size()));
      extras_.push_back(p.node);
    }
    call(op::reduce_scatter_tree, out.size(), slices, extras_, options,
         [&](clock_type::time_point deadline) { tree_sum(slices, parts, out, deadline); });
  }

 private:
  // A whole call: connect on first use, exchange headers, then the payload.
  // Any failure aborts the group (See Note [Gloo sums like the local
  // backend]) and throws collective_error.
  template <class Payload>
  void call(op o, std::uint64_t size, std::uint64_t root, std::span<const std::uint64_t> extras,
            const collective_options& options, Payload payload) {
    if (group_->aborted) fail(collective_errc::aborted, std::string(op_name(static_cast<std::uint64_t>(o))) + ": aborted");
    const auto deadline = clock_type::now() + options.timeout;
    if (extras.size() > max_header_extras)
      fail(collective_errc::mismatch, std::string(op_name(static_cast<std::uint64_t>(o))) + ": " +
                                          std::to_string(extras.size()) + " buffers or parts, more than " +
                                          std::to_string(max_header_extras));
    // A group of one exchanges nothing; its tree sum is still evaluated.
    if (group_->size == 1) {
      if (o == op::reduce_scatter_tree) payload(deadline);
      return;
    }
    try {
      if (transport_ == nullptr) connect();
      exchange_headers(o, size, root, extras, options, deadline);
      payload(deadline);
    } catch (const collective_error&) {
      ops_.clear();  // no Gloo handle on the caller's memory outlives the call
      transfers_.clear();
      throw;
    } catch (const std::exception& e) {  // gloo::Exception, or the store's
      ops_.clear();
      transfers_.clear();
      lost(o, deadline, e.what());
    }
  }

  // A Gloo or store failure during a call: the group ends here.
  [[noreturn]] void lost(op o, clock_type::time_point deadline, const std::string& what) {
    const std::string name = op_name(static_cast<std::uint64_t>(o));
    if (group_->aborted) {
      const std::string why = group_->reason();
      fail(collective_errc::aborted, name + " aborted" + (why.empty() ? "" : ": " + why));
    }
    if (clock_type::now() >= deadline) fail(collective_errc::timeout, name + " timed out waiting for the other ranks");
    fail(collective_errc::aborted, name + " failed: " + what);
  }

  // Aborts the group (every local rank, and through the sockets every peer)
  // and throws.
  [[noreturn]] void fail(collective_errc code, const std::string& what) {
    const std::string message = "gloo collective, rank " + std::to_string(rank_) + ": " + what;
    group_->abort(message);
    throw collective_error(code, message);
  }

  // Connects this rank to every other through the store: publishes one
  // address per peer, reads each peer's address for this rank, connects.
  void connect() {
    const auto& opts = group_->options;
    const int n = group_->size;
    const auto deadline = clock_type::now() + opts.rendezvous_timeout;
    auto context = std::make_unique<rank_context>(rank_, n);
    context->setTimeout(opts.rendezvous_timeout);
    auto device = tcp_device(opts.address);
    auto transport = device->createContext(rank_, n);
    transport->setTimeout(opts.rendezvous_timeout);
    std::vector<char> addresses;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const auto bytes = transport->createPair(peer)->address().bytes();
      addresses.insert(addresses.end(), bytes.begin(), bytes.end());
    }
    auto* tcp = dynamic_cast<gloo::transport::tcp::Context*>(transport.get());
    if (tcp == nullptr || !group_->enlist(tcp))
      fail(collective_errc::aborted, "aborted before it connected");
    // Enlisted: it must live until the destructor discharges it.
    transport_owner_ = transport;
    transport_ = tcp;
    group_->store->set(key(rank_), addresses);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const std::vector<char> theirs = store_get(key(peer), deadline);
      const std::size_t each = theirs.size() / static_cast<std::size_t>(n - 1);
      const std::size_t mine = static_cast<std::size_t>(rank_ > peer ? rank_ - 1 : rank_);
      if (each == 0 || theirs.size() % static_cast<std::size_t>(n - 1) != 0)
        fail(collective_errc::mismatch, "rank " + std::to_string(peer) + " published " + std::to_string(theirs.size()) +
                                            " address bytes, not a multiple of " + std::to_string(n - 1) +
                                            " (a group of another size under the same prefix?)");
      transport->getPair(peer)->connect(std::vector<char>(theirs.begin() + static_cast<std::ptrdiff_t>(mine * each),
                                                          theirs.begin() + static_cast<std::ptrdiff_t>((mine + 1) * each)));
    }
    context->attach(std::move(device), std::move(transport));
    context_ = std::move(context);
    share_memory(opts.shared_memory, deadline);
    probe_ = context_->createUnboundBuffer(&probe_byte_, 1);
    header_out_storage_.resize(header_capacity);
    header_out_.resize(static_cast<std::size_t>(n));
    header_in_storage_.assign(static_cast<std::size_t>(n) * header_capacity, 0);
    header_in_.resize(static_cast<std::size_t>(n));
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank_) {
        header_out_[static_cast<std::size_t>(peer)] =
            context_->createUnboundBuffer(header_out_storage_.data(), header_capacity * sizeof(std::uint64_t));
        header_in_[static_cast<std::size_t>(peer)] = context_->createUnboundBuffer(
            header_in_storage_.data() + static_cast<std::size_t>(peer) * header_capacity,
            header_capacity * sizeof(std::uint64_t));
      }
  }

  std::string key(int rank) const { return group_->options.prefix + "/gloo/" + std::to_string(rank); }

  // See Note [Same-machine ranks share memory]: every rank publishes its
  // inbox (nonce, then name; nothing when it has none or is `enabled` not),
  // opens each peer's, publishes which it opened, and a pair whose both ends
  // opened the other's uses them. Names are unlinked once every peer has
  // tried.
  void share_memory(bool enabled, clock_type::time_point deadline) {
    const int n = group_->size;
    if (enabled) {
      static std::once_flag swept;
      std::call_once(swept, sweep_stale_segments);
      try {
        inbox_ = shm_segment::create(n);
      } catch (const std::system_error&) {
        inbox_.reset();  // no shared memory here: TCP for every pair
      }
    }
    std::vector<char> mine;
    if (inbox_) {
      const std::uint64_t nonce = inbox_->nonce();
      mine.resize(sizeof nonce);
      std::memcpy(mine.data(), &nonce, sizeof nonce);
      mine.insert(mine.end(), inbox_->name().begin(), inbox_->name().end());
    }
    group_->store->set(shm_key("shm", rank_), mine);
    std::vector<char> opened(static_cast<std::size_t>(n), 0);
    peers_.resize(static_cast<std::size_t>(n));
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const std::vector<char> theirs = store_get(shm_key("shm", peer), deadline);
      if (!inbox_ || theirs.size() <= sizeof(std::uint64_t)) continue;
      std::uint64_t nonce = 0;
      std::memcpy(&nonce, theirs.data(), sizeof nonce);
      auto& segment = peers_[static_cast<std::size_t>(peer)];
      segment = shm_segment::open(std::string(theirs.begin() + sizeof nonce, theirs.end()), nonce, n);
      opened[static_cast<std::size_t>(peer)] = segment != nullptr;
    }
    group_->store->set(shm_key("shm_opened", rank_), opened);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const std::vector<char> theirs = store_get(shm_key("shm_opened", peer), deadline);
      if (theirs.size() != static_cast<std::size_t>(n) || theirs[static_cast<std::size_t>(rank_)] == 0)
        peers_[static_cast<std::size_t>(peer)].reset();
    }
    if (inbox_) inbox_->unlink();
    if (shared_memory_peers() == 0) {
      inbox_.reset();
      return;
    }
    group_->enlist(inbox_.get());
    for (const auto& p : peers_)
      if (p) group_->enlist(p.get());
  }
  std::string shm_key(const char* what, int rank) const {
    return group_->options.prefix + "/" + what + "/" + std::to_string(rank);
  }
  bool shares_memory(int peer) const {
    return !peers_.empty() && peers_[static_cast<std::size_t>(peer)] != nullptr;
  }
  // A transfer with `peer` over shared memory, pending until drive() ends it.
  std::size_t post_transfer(std::byte* data, std::size_t bytes, int peer, bool send, bool exact = true) {
    shm_segment& theirs = *peers_[static_cast<std::size_t>(peer)];
    shm_transfer t;
    t.ring = send ? &theirs.ring_from(rank_) : &inbox_->ring_from(peer);
    t.other = &theirs.doorbell();
    t.data = data;
    t.bytes = bytes;
    t.send = send;
    t.exact = exact;
    t.peer = peer;
    transfers_.push_back(t);
    return transfers_.size() - 1;
  }

  // Advances every pending shared-memory transfer, each ring's in the order
  // they were posted, until transfers_[target] has completed (every one,
  // with target = all_transfers): true; false when `wake` comes first.
  // Health checks as wait_for()'s (See Note [Gloo waits look up every
  // health_slice]).
  static constexpr std::size_t all_transfers = ~std::size_t{0};
  bool drive(std::size_t target, clock_type::time_point wake, clock_type::time_point deadline) {
    shm_doorbell& bell = inbox_->doorbell();
    auto check_at = clock_type::now() + health_slice;
    const auto finished = [&] {
      if (target != all_transfers) return transfers_[target].complete();
      return std::all_of(transfers_.begin(), transfers_.end(), [](const shm_transfer& t) { return t.complete(); });
    };
    for (;;) {
      const std::uint32_t seen = bell.seq.load(std::memory_order_seq_cst);
      const bool moved = advance_transfers();
      if (finished()) return true;
      if (inbox_->aborted()) throw std::runtime_error("aborted by a rank on this machine");
      auto now = clock_type::now();
      if (now >= deadline) throw std::runtime_error("timed out");
      if (now >= wake) return false;
      if (now >= check_at) {
        if (group_->aborted) throw std::runtime_error("aborted");
        try {
          for (const shm_transfer& t : transfers_)
            if (!t.complete()) probe(t.peer);
        } catch (const std::exception&) {
          // A peer that wrote its last message and left: it is in the ring.
          advance_transfers();
          if (finished()) return true;
          throw;
        }
        check_at = now + health_slice;
      }
      if (moved) continue;
      const auto spin_until = now + shm_spin;
      while (bell.seq.load(std::memory_order_relaxed) == seen && clock_type::now() < spin_until) DPACTOR_CPU_RELAX();
      if (bell.seq.load(std::memory_order_seq_cst) == seen) bell.wait(seen, std::min({wake, deadline, check_at}));
    }
  }
  // One pass over the pending transfers; whether any bytes moved. A ring's
  // later transfer waits for its earlier ones.
  bool advance_transfers() {
    bool moved = false;
    busy_rings_.clear();
    for (shm_transfer& t : transfers_) {
      if (t.complete()) continue;
      if (std::find(busy_rings_.begin(), busy_rings_.end(), t.ring) != busy_rings_.end()) continue;
      try {
        moved |= t.advance();
      } catch (const std::length_error& e) {
        fail(collective_errc::mismatch, e.what());
      }
      if (!t.complete()) busy_rings_.push_back(t.ring);
    }
    return moved;
  }

  // A store get in slices, so that an abort is seen within store_poll_slice.
  std::vector<char> store_get(const std::string& k, clock_type::time_point deadline) {
    for (;;) {
      if (group_->aborted) fail(collective_errc::aborted, "aborted during rendezvous: " + group_->reason());
      const auto now = clock_type::now();
      if (now >= deadline)
        fail(collective_errc::timeout, "rendezvous timed out waiting for " + k + " in the store");
      if (auto value = group_->store->get(k, std::min(deadline, now + store_poll_slice))) return std::move(*value);
    }
  }

  // Sends this rank's header to every peer, receives each peer's, and checks
  // that they called the same operation on the same sizes.
  void exchange_headers(op o, std::uint64_t size, std::uint64_t root, std::span<const std::uint64_t> extras,
                        const collective_options& options, clock_type::time_point deadline) {
    const int n = group_->size;
    auto& out = header_out_storage_;
    out[0] = header_magic;
    out[1] = static_cast<std::uint64_t>(o);
    out[2] = size;
    out[3] = root;
    out[4] = extras.size();
    std::copy(extras.begin(), extras.end(), out.begin() + header_fixed);
    const std::size_t bytes = (header_fixed + extras.size()) * sizeof(std::uint64_t);
    transfers_.clear();
    header_transfer_.assign(static_cast<std::size_t>(n), all_transfers);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      if (shares_memory(peer)) {
        header_transfer_[static_cast<std::size_t>(peer)] =
            post_transfer(reinterpret_cast<std::byte*>(header_in_storage_.data() + static_cast<std::size_t>(peer) * header_capacity),
                          header_capacity * sizeof(std::uint64_t), peer, false, false);
        continue;
      }
      header_in_[static_cast<std::size_t>(peer)]->recv(peer, header_slot, 0, header_capacity * sizeof(std::uint64_t));
    }
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      if (shares_memory(peer)) post_transfer(reinterpret_cast<std::byte*>(out.data()), bytes, peer, true);
      else header_out_[static_cast<std::size_t>(peer)]->send(peer, header_slot, 0, bytes);
    }
    wait_headers(options, deadline);
    if (!transfers_.empty()) drive(all_transfers, clock_type::time_point::max(), deadline);
    transfers_.clear();
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank_ && !shares_memory(peer))
        wait_for(*header_out_[static_cast<std::size_t>(peer)], wait_alarm::kind::send, peer, deadline);
    const bool per_rank_extras = o == op::reduce_scatter_tree;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank_) continue;
      const std::uint64_t* theirs = header_in_storage_.data() + static_cast<std::size_t>(peer) * header_capacity;
      const std::size_t compared = per_rank_extras ? header_fixed - 1 : header_fixed + extras.size();
      const bool same = theirs[0] == header_magic && theirs[4] <= max_header_extras &&
                        (per_rank_extras || theirs[4] == extras.size()) &&
                        std::equal(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(compared), theirs);
      if (!same)
        fail(collective_errc::mismatch, std::string(op_name(static_cast<std::uint64_t>(o))) + ": rank " +
                                            std::to_string(peer) + " called " + describe(theirs) + ", rank " +
                                            std::to_string(rank_) + " called " + describe(out.data()));
    }
  }

  static std::string describe(const std::uint64_t* h) {
    if (h[0] != header_magic) return "something that is not a dpactor collective";
    std::string s = std::string(op_name(h[1])) + " with " + std::to_string(h[2]) + " floats (root " + std::to_string(h[3]) + ")";
    if (h[1] == static_cast<std::uint64_t>(op::all_gather)) {
      s += ", buffer sizes";
      for (std::uint64_t i = 0; i < std::min<std::uint64_t>(h[4], max_header_extras); ++i) {
        s += ' ';
        s += std::to_string(h[header_fixed + i]);
      }
    }
    return s;
  }

  // Waits for every peer's header. At options.late_at, tells the observer
  // which peers' headers have not arrived (each remaining peer gets
  // late_probe to show that its header is there).
  void wait_headers(const collective_options& options, clock_type::time_point deadline) {
    const int n = group_->size;
    bool tell = options.observer != nullptr && options.late_at != clock_type::time_point{};
    // Whether peer's header arrived by `until` (the deadline when none).
    auto header = [&](int peer, std::optional<clock_type::time_point> until) {
      const std::size_t t = header_transfer_[static_cast<std::size_t>(peer)];
      if (t != all_transfers) return drive(t, until.value_or(clock_type::time_point::max()), deadline);
      return wait_for(*header_in_[static_cast<std::size_t>(peer)], wait_alarm::kind::recv, peer, deadline, until);
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
        if (q != rank_ && !header(q, clock_type::now() + late_probe)) missing.push_back(q);
      options.observer->on_late(missing);
      for (const int q : missing) header(q, std::nullopt);
      return;
    }
  }

  // Note [Gloo waits look up every health_slice]
  // Gloo does not fail a receive whose message was partly read when the
  // peer's connection broke (Pair::signalException fails the pending
  // operations, not the one being read), and an abort, which is also a
  // signalException, misses it the same way. So no wait trusts Gloo to end
  // it: every health_slice the alarm interrupts it, and the rank checks for
  // an abort of its group and probes the connection to the peer it waits
  // for. Only that one: a peer that has finished its part of the call may
  // close its connections, normally, while this rank still waits for
  // another. Hence one Gloo buffer per peer and operation, so that every
  // wait knows its peer.
  //
  // Waits for one receive or send of `buffer`, all with `peer`: true when it
  // completed, false when `late_at` came first (then it is still pending).
  // Throws on an abort, a failure of the connection, or at the deadline.
  bool wait_for(gloo_buffer& buffer, wait_alarm::kind k, int peer, clock_type::time_point deadline,
                std::optional<clock_type::time_point> late_at = std::nullopt) {
    for (;;) {
      auto wake = clock_type::now() + health_slice;
      if (late_at) wake = std::min(wake, *late_at);
      if (interrupted_wait(buffer, k, wake, deadline)) return true;
      if (group_->aborted) throw std::runtime_error("aborted");
      try {
        probe(peer);
      } catch (const std::exception&) {
        // The connection closed. The message may still have arrived just
        // before (a peer that sent its last message and left): it has if
        // the completion is counted, which a short wait shows.
        if (interrupted_wait(buffer, k, clock_type::now() + late_probe, deadline)) return true;
        throw;
      }
      if (late_at && clock_type::now() >= *late_at) return false;
    }
  }

  // One wait on `buffer`, interrupted at `wake`: whether it completed.
  bool interrupted_wait(gloo_buffer& buffer, wait_alarm::kind k, clock_type::time_point wake,
                        clock_type::time_point deadline) {
    for (;;) {
      alarm_.arm(wake, &buffer, k);
      bool done = false;
      try {
        done = k == wait_alarm::kind::recv ? buffer.waitRecv(nullptr, until(deadline))
                                           : buffer.waitSend(nullptr, until(deadline));
      } catch (...) {
        alarm_.disarm();
        throw;
      }
      const bool fired = alarm_.fired();
      alarm_.disarm();
      if (done) return true;
      // Not fired: a stale interruption meant for an earlier wait; wait again.
      if (fired) return false;
    }
  }

  // Throws gloo::IoException when the connection to `peer` has failed.
  void probe(int peer) {
    auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(context_->getPair(peer).get());
    if (pair != nullptr) pair->tryRecv(probe_.get(), probe_slot, 0, 0);
  }

  // Operations posted on Gloo buffers, each with one peer; their handles are
  // destroyed before the call returns (See Note [Posted memory outlives an
  // abort]).
  struct posted {
    std::unique_ptr<gloo_buffer> handle;
    int peer;
    wait_alarm::kind kind;
  };
  void post_recv(std::vector<posted>& ops, float* data, std::size_t floats, int peer, slot s) {
    if (floats == 0) return;
    if (shares_memory(peer)) {
      post_transfer(reinterpret_cast<std::byte*>(data), floats * sizeof(float), peer, false);
      return;
    }
    ops.push_back({context_->createUnboundBuffer(data, floats * sizeof(float)), peer, wait_alarm::kind::recv});
    ops.back().handle->recv(peer, s, 0, floats * sizeof(float));
  }
  void post_send(std::vector<posted>& ops, float* data, std::size_t floats, int peer, slot s) {
    if (floats == 0) return;
    if (shares_memory(peer)) {
      post_transfer(reinterpret_cast<std::byte*>(data), floats * sizeof(float), peer, true);
      return;
    }
    ops.push_back({context_->createUnboundBuffer(data, floats * sizeof(float)), peer, wait_alarm::kind::send});
    ops.back().handle->send(peer, s, 0, floats * sizeof(float));
  }
  // Shared-memory transfers first: Gloo's go on in its event loop meanwhile.
  void finish(std::vector<posted>& ops, clock_type::time_point deadline) {
    if (!transfers_.empty()) drive(all_transfers, clock_type::time_point::max(), deadline);
    transfers_.clear();
    for (posted& p : ops) wait_for(*p.handle, p.kind, p.peer, deadline);
    ops.clear();
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
  // headers).
  void tree_sum(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                clock_type::time_point deadline) {
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
    std::size_t foreign = 0;
    for (int k = 0; k < n; ++k)
      if (k != rank_) foreign += static_cast<std::size_t>(header_in_storage_[static_cast<std::size_t>(k) * header_capacity + 4]);
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
      const std::uint64_t* h = header_in_storage_.data() + static_cast<std::size_t>(k) * header_capacity;
      const std::size_t first = next;
      for (std::uint64_t i = 0; i < h[4]; ++i) {
        nodes_.push_back(static_cast<std::uint32_t>(h[header_fixed + i]));
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

  std::shared_ptr<group_state> group_;
  const int rank_;
  // This rank's connections, enlisted for abort() from the start of connect().
  std::shared_ptr<gloo::transport::Context> transport_owner_;
  gloo::transport::tcp::Context* transport_ = nullptr;
  std::unique_ptr<rank_context> context_;
  std::vector<std::uint64_t> header_out_storage_;
  std::vector<std::uint64_t> header_in_storage_;  // peer p's header at p * header_capacity
  std::vector<std::unique_ptr<gloo_buffer>> header_out_;  // per peer, over header_out_storage_
  char probe_byte_ = 0;
  std::unique_ptr<gloo_buffer> probe_;  // probe()'s, never receives
  std::vector<std::unique_ptr<gloo_buffer>> header_in_;
  wait_alarm alarm_;
  std::vector<std::uint64_t> extras_;
  std::vector<float> staging_;
  std::vector<const float*> parts_;
  std::vector<posted> ops_;  // the call's payload operations
  // See Note [Same-machine ranks share memory]: this rank's inbox and, per
  // peer, the peer's (null: that pair is on TCP); the call's transfers.
  std::unique_ptr<shm_segment> inbox_;
  std::vector<std::unique_ptr<shm_segment>> peers_;
  std::vector<shm_transfer> transfers_;
  std::vector<std::size_t> header_transfer_;  // per peer, its header's index in transfers_
  std::vector<const shm_ring*> busy_rings_;
  tree_plan plan_;
  std::vector<std::uint32_t> nodes_;
  std::vector<const float*> part_data_;
};

class gloo_group final : public collective_group {
 public:
  gloo_group(std::shared_ptr<rendezvous_store> store, int size, gloo_group_options options)
      : state_(std::make_shared<group_state>(std::move(store), size, std::move(options))) {}
  int size() const noexcept override { return state_->size; }
  std::unique_ptr<collective> endpoint(int rank) override { return std::make_unique<gloo_endpoint>(state_, rank); }
  void abort() override { state_->abort("the group was aborted"); }
  bool aborted() const noexcept override { return state_->aborted; }

 private:
  std::shared_ptr<group_state> state_;
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
  // See the header: Gloo writes without MSG_NOSIGNAL.
  static std::once_flag sigpipe;
  std::call_once(sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  return std::make_shared<gloo_group>(std::move(store), size, std::move(options));
}

}  // namespace dpactor
