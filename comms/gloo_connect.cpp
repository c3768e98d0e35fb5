#include "comms/gloo_connect.hpp"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "comms/gloo_process.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// One tag of probe messages: a pair matches a slot's sends and receives in
// the order they were posted; nobody ever sends on this one.
constexpr std::uint64_t probe_slot = 0x6475;

// tcp::Context::signalException is what Gloo runs on its own timeouts: it fails
// every pending operation on every pair and closes the sockets, and it is
// thread-safe, but protected. A pointer to it can be formed in a derived class.
struct tcp_access : gloo::transport::tcp::Context {
  static constexpr auto signal = &tcp_access::signalException;
};

// A rank's Gloo context, connected by gloo_connection::connect instead of
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

}  // namespace

void gloo_group_state::abort(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (!aborted.exchange(true)) why_ = reason;
  for (auto* t : transports_) (t->*tcp_access::signal)(why_);
  for (auto* s : segments_) s->abort();
}

std::string gloo_group_state::reason() {
  std::lock_guard lock(mutex_);
  return why_;
}

void gloo_group_state::fail(int rank, collective_errc code, const std::string& what) {
  const std::string message = "gloo collective, rank " + std::to_string(rank) + ": " + what;
  abort(message);
  throw collective_error(code, message);
}

bool gloo_group_state::enlist(gloo::transport::tcp::Context* transport) {
  std::lock_guard lock(mutex_);
  if (aborted) return false;
  transports_.push_back(transport);
  return true;
}

void gloo_group_state::discharge(gloo::transport::tcp::Context* transport) {
  std::lock_guard lock(mutex_);
  std::erase(transports_, transport);
}

void gloo_group_state::enlist(shm_segment* segment) {
  std::lock_guard lock(mutex_);
  segments_.push_back(segment);
  if (aborted) segment->abort();
}

void gloo_group_state::discharge(shm_segment* segment) {
  std::lock_guard lock(mutex_);
  std::erase(segments_, segment);
}

std::vector<char> gloo_group_state::store_get(const std::string& key, clock::time_point deadline, int rank) {
  for (;;) {
    if (aborted) fail(rank, collective_errc::aborted, "aborted during rendezvous: " + reason());
    const auto now = clock::now();
    if (now >= deadline) fail(rank, collective_errc::timeout, "rendezvous timed out waiting for " + key + " in the store");
    if (auto value = store->get(key, std::min(deadline, now + store_poll_slice))) return std::move(*value);
  }
}

gloo_connection::gloo_connection(std::shared_ptr<gloo_group_state> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  health_.group_aborted = &group_->aborted;
  health_.probe = [this](int peer) { probe(peer); };
  health_.slice = gloo_health_slice;
}

gloo_connection::~gloo_connection() {
  probe_.reset();
  if (transport_ != nullptr) group_->discharge(transport_);
  if (shm_) {
    group_->discharge(&shm_->inbox());
    for (const auto& p : shm_->peers())
      if (p) group_->discharge(p.get());
  }
}

gloo::Context& gloo_connection::context() noexcept { return *context_; }

std::unique_ptr<gloo::transport::UnboundBuffer> gloo_connection::buffer(void* data, std::size_t bytes) {
  return context_->createUnboundBuffer(data, bytes);
}

void gloo_connection::probe(int peer) {
  auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(context_->getPair(peer).get());
  if (pair != nullptr) pair->tryRecv(probe_.get(), probe_slot, 0, 0);
}

// Note [Gloo waits look up every health_slice]
// Gloo does not fail a receive whose message was partly read when the
// peer's connection broke (Pair::signalException fails the pending
// operations, not the one being read), and an abort, which is also a
// signalException, misses it the same way. So no wait trusts Gloo to end
// it: every gloo_health_slice the alarm interrupts it, and the rank checks
// for an abort of its group and probes the connection to the peer it waits
// for. Only that one: a peer that has finished its part of the call may
// close its connections, normally, while this rank still waits for
// another. Hence one Gloo buffer per peer and operation (comms/gloo.cpp),
// so that every wait knows its peer. Waits on shared memory check the same
// way (shm_health).
bool gloo_connection::wait(gloo::transport::UnboundBuffer& buffer, wait_alarm::kind k, int peer,
                           clock::time_point deadline, std::optional<clock::time_point> late_at) {
  for (;;) {
    auto wake = clock::now() + gloo_health_slice;
    if (late_at) wake = std::min(wake, *late_at);
    if (interrupted_wait(buffer, k, wake, deadline)) return true;
    if (group_->aborted) throw error(error_kind::internal, "aborted");
    try {
      probe(peer);
    } catch (const std::exception&) {
      // The connection closed. The message may still have arrived just
      // before (a peer that sent its last message and left): it has if the
      // completion is counted, which a short wait shows.
      if (interrupted_wait(buffer, k, clock::now() + gloo_late_probe, deadline)) return true;
      throw;
    }
    if (late_at && clock::now() >= *late_at) return false;
  }
}

// One wait on `buffer`, interrupted at `wake`: whether it completed.
bool gloo_connection::interrupted_wait(gloo::transport::UnboundBuffer& buffer, wait_alarm::kind k,
                                       clock::time_point wake, clock::time_point deadline) {
  for (;;) {
    // Gloo's own timeout, at least 1 ms: past it the wait throws.
    const auto left = std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()),
                               std::chrono::milliseconds(1));
    alarm_.arm(wake, &buffer, k);
    bool done = false;
    try {
      done = k == wait_alarm::kind::recv ? buffer.waitRecv(nullptr, left) : buffer.waitSend(nullptr, left);
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

std::string gloo_connection::key(const char* what, int rank) const {
  return group_->options.prefix + "/" + what + "/" + std::to_string(rank);
}

// Every peer's key of `what`, asked for at once (rendezvous_store::prefetch).
void gloo_connection::prefetch(const char* what) {
  std::vector<std::string> keys;
  for (int peer = 0; peer < group_->size; ++peer)
    if (peer != rank_) keys.push_back(key(what, peer));
  group_->store->prefetch(keys);
}

void gloo_connection::connect(clock::time_point deadline) {
  const auto& opts = group_->options;
  const int n = group_->size;
  auto context = std::make_unique<rank_context>(rank_, n);
  context->setTimeout(opts.rendezvous_timeout);
  auto device = gloo_tcp_device(opts.address);
  auto transport = device->createContext(rank_, n);
  transport->setTimeout(opts.rendezvous_timeout);
  std::vector<char> addresses;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank_) continue;
    const auto bytes = transport->createPair(peer)->address().bytes();
    addresses.insert(addresses.end(), bytes.begin(), bytes.end());
  }
  auto* tcp = dynamic_cast<gloo::transport::tcp::Context*>(transport.get());
  if (tcp == nullptr || !group_->enlist(tcp)) group_->fail(rank_, collective_errc::aborted, "aborted before it connected");
  // Enlisted: it must live until the destructor discharges it.
  transport_owner_ = transport;
  transport_ = tcp;
  group_->store->set(key("gloo", rank_), addresses);
  prefetch("gloo");
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank_) continue;
    const std::vector<char> theirs = group_->store_get(key("gloo", peer), deadline, rank_);
    const std::size_t each = theirs.size() / static_cast<std::size_t>(n - 1);
    const std::size_t mine = static_cast<std::size_t>(rank_ > peer ? rank_ - 1 : rank_);
    if (each == 0 || theirs.size() % static_cast<std::size_t>(n - 1) != 0)
      group_->fail(rank_, collective_errc::mismatch,
                   "rank " + std::to_string(peer) + " published " + std::to_string(theirs.size()) +
                       " address bytes, not a multiple of " + std::to_string(n - 1) +
                       " (a group of another size under the same prefix?)");
    transport->getPair(peer)->connect(std::vector<char>(theirs.begin() + static_cast<std::ptrdiff_t>(mine * each),
                                                        theirs.begin() + static_cast<std::ptrdiff_t>((mine + 1) * each)));
  }
  context->attach(std::move(device), std::move(transport));
  context_ = std::move(context);
  share_memory(opts.shared_memory, deadline);
  probe_ = context_->createUnboundBuffer(&probe_byte_, 1);
}

// See Note [Same-machine ranks share memory]: every rank publishes its inbox
// (nonce, then name; nothing when it has none or is `enabled` not), opens
// each peer's, publishes which it opened, and a pair whose both ends opened
// the other's uses them. Names are unlinked once every peer has tried.
void gloo_connection::share_memory(bool enabled, clock::time_point deadline) {
  const int n = group_->size;
  std::unique_ptr<shm_segment> inbox;
  if (enabled) {
    sweep_shared_memory_once();
    try {
      inbox = shm_segment::create(n);
    } catch (const std::system_error&) {
      inbox.reset();  // no shared memory here: TCP for every pair
    }
  }
  std::vector<char> mine;
  if (inbox) {
    const std::uint64_t nonce = inbox->nonce();
    mine.resize(sizeof nonce);
    std::memcpy(mine.data(), &nonce, sizeof nonce);
    mine.insert(mine.end(), inbox->name().begin(), inbox->name().end());
  }
  group_->store->set(key("shm", rank_), mine);
  prefetch("shm");
  std::vector<char> opened(static_cast<std::size_t>(n), 0);
  std::vector<std::unique_ptr<shm_segment>> peers(static_cast<std::size_t>(n));
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank_) continue;
    const std::vector<char> theirs = group_->store_get(key("shm", peer), deadline, rank_);
    if (!inbox || theirs.size() <= sizeof(std::uint64_t)) continue;
    std::uint64_t nonce = 0;
    std::memcpy(&nonce, theirs.data(), sizeof nonce);
    auto& segment = peers[static_cast<std::size_t>(peer)];
    segment = shm_segment::open(std::string(theirs.begin() + sizeof nonce, theirs.end()), nonce, n);
    opened[static_cast<std::size_t>(peer)] = segment != nullptr;
  }
  group_->store->set(key("shm_opened", rank_), opened);
  prefetch("shm_opened");
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank_) continue;
    const std::vector<char> theirs = group_->store_get(key("shm_opened", peer), deadline, rank_);
    if (theirs.size() != static_cast<std::size_t>(n) || theirs[static_cast<std::size_t>(rank_)] == 0)
      peers[static_cast<std::size_t>(peer)].reset();
  }
  if (inbox) inbox->unlink();
  if (std::none_of(peers.begin(), peers.end(), [](const auto& p) { return p != nullptr; })) return;
  shm_ = std::make_unique<shm_exchange>(rank_, std::move(inbox), std::move(peers));
  group_->enlist(&shm_->inbox());
  for (const auto& p : shm_->peers())
    if (p) group_->enlist(p.get());
}

}  // namespace dpactor
