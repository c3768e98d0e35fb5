#include "comms/shm_segment.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>


#include "comms/cpu_relax.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "rings and doorbells in shared memory need lock-free atomics");

// Names are /dev/shm/dpactor-shm-<pid>-<random>: the pid lets a later
// process sweep a dead one's segment.
constexpr const char* name_prefix = "dpactor-shm-";
constexpr std::uint64_t segment_magic = 0x64706163746f7273;  // "dpactors"
// How long a rank waiting on shared memory checks its doorbell before it
// sleeps on it: a peer's next message usually lands within microseconds when
// both are in the same phase, and a sleep costs a wake-up (tens of us).
constexpr std::chrono::microseconds shm_spin{20};

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

std::uint64_t random_word() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

}  // namespace

// The segment: this header, then one ring per rank of the group (its header
// and its data).
struct shm_segment::layout {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint64_t ranks;
  std::atomic<std::uint32_t> aborted;
  alignas(64) shm_doorbell doorbell;

  static std::size_t rings_at() noexcept {
    return (sizeof(layout) + alignof(shm_ring) - 1) / alignof(shm_ring) * alignof(shm_ring);
  }
  static std::size_t stride(int ranks) noexcept { return sizeof(shm_ring) + shm_ring_bytes(ranks); }
  static std::size_t bytes(int ranks) { return rings_at() + static_cast<std::size_t>(ranks) * stride(ranks); }
  shm_ring& ring(int r) noexcept {
    return *reinterpret_cast<shm_ring*>(reinterpret_cast<std::byte*>(this) + rings_at() +
                                        static_cast<std::size_t>(r) * stride(static_cast<int>(ranks)));
  }
};

std::size_t shm_ring_bytes(int ranks) noexcept {
  constexpr std::size_t most = std::size_t{1} << 20, least = std::size_t{64} << 10, inbox = std::size_t{8} << 20;
  std::size_t bytes = most;
  while (bytes > least && bytes * static_cast<std::size_t>(std::max(ranks, 1)) > inbox) bytes /= 2;
  return bytes;
}

void shm_doorbell::ring() noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) futex(&seq, FUTEX_WAKE, INT_MAX, nullptr);
}

void shm_doorbell::wait(std::uint32_t seen, std::chrono::steady_clock::time_point until) noexcept {
  const auto left = until - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  const timespec timeout{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  // seq_cst pairs with ring(): either the ringer sees a sleeper, or this
  // load sees its increment and does not sleep.
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (seq.load(std::memory_order_seq_cst) == seen) futex(&seq, FUTEX_WAIT, seen, &timeout);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

bool shm_transfer::advance() {
  bool moved = false;
  const std::size_t capacity = static_cast<std::size_t>(ring->capacity);
  std::byte* const ring_data = ring->data();
  if (send) {
    const std::uint64_t head = ring->head.load(std::memory_order_relaxed);
    const std::uint64_t tail = ring->tail.load(std::memory_order_acquire);
    std::size_t space = capacity - static_cast<std::size_t>(head - tail);
    std::uint64_t at = head;
    const auto put = [&](const std::byte* from, std::size_t n) {
      const std::size_t offset = static_cast<std::size_t>(at % capacity);
      const std::size_t first = std::min(n, capacity - offset);
      std::memcpy(ring_data + offset, from, first);
      std::memcpy(ring_data, from + first, n - first);
      at += n;
      space -= n;
    };
    if (length_done < sizeof length && space > 0) {
      length = bytes;
      const std::size_t n = std::min(space, sizeof length - length_done);
      put(reinterpret_cast<const std::byte*>(&length) + length_done, n);
      length_done += n;
    }
    if (length_done == sizeof length && done < bytes && space > 0) {
      const std::size_t n = std::min(space, bytes - done);
      put(data + done, n);
      done += n;
    }
    moved = at != head;
    if (moved) ring->head.store(at, std::memory_order_release);
  } else {
    const std::uint64_t tail = ring->tail.load(std::memory_order_relaxed);
    const std::uint64_t head = ring->head.load(std::memory_order_acquire);
    std::size_t avail = static_cast<std::size_t>(head - tail);
    std::uint64_t at = tail;
    const auto take = [&](std::byte* to, std::size_t n) {
      const std::size_t offset = static_cast<std::size_t>(at % capacity);
      const std::size_t first = std::min(n, capacity - offset);
      std::memcpy(to, ring_data + offset, first);
      std::memcpy(to + first, ring_data, n - first);
      at += n;
      avail -= n;
    };
    if (length_done < sizeof length && avail > 0) {
      const std::size_t n = std::min(avail, sizeof length - length_done);
      take(reinterpret_cast<std::byte*>(&length) + length_done, n);
      length_done += n;
      if (length_done == sizeof length && (exact ? length != bytes : length > bytes))
        throw std::length_error("rank " + std::to_string(peer) + " sent a message of " + std::to_string(length) +
                                " bytes where " + std::to_string(bytes) + " were expected");
    }
    if (length_done == sizeof length && done < length && avail > 0) {
      const std::size_t n = std::min<std::size_t>(avail, length - done);
      take(data + done, n);
      done += n;
    }
    moved = at != tail;
    if (moved) ring->tail.store(at, std::memory_order_release);
  }
  if (moved) other->ring();
  return moved;
}

shm_segment::shm_segment(std::string name, void* base, std::size_t bytes, bool owner)
    : name_(std::move(name)), base_(base), bytes_(bytes), linked_(owner) {}

shm_segment::~shm_segment() {
  unlink();
  munmap(base_, bytes_);
}

std::unique_ptr<shm_segment> shm_segment::create(int ranks) {
  const std::size_t bytes = layout::bytes(ranks);
  for (int attempt = 0;; ++attempt) {
    char name[96];
    std::snprintf(name, sizeof name, "/%s%ld-%016llx", name_prefix, static_cast<long>(getpid()),
                  static_cast<unsigned long long>(random_word()));
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 8) continue;
      throw std::system_error(errno, std::generic_category(), std::string("shm_open ") + name);
    }
    // posix_fallocate, not ftruncate: tmpfs would hand out pages on first
    // touch, and a full /dev/shm (64 MiB in a default Docker container)
    // would then kill the process with SIGBUS in the middle of a step.
    if (const int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
      close(fd);
      shm_unlink(name);
      throw std::system_error(e, std::generic_category(), std::string("posix_fallocate ") + name);
    }
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (base == MAP_FAILED) {
      shm_unlink(name);
      throw std::system_error(e, std::generic_category(), std::string("mmap ") + name);
    }
    auto* l = static_cast<layout*>(base);
    l->nonce = random_word();
    l->ranks = static_cast<std::uint64_t>(ranks);
    new (&l->aborted) std::atomic<std::uint32_t>(0);
    new (&l->doorbell) shm_doorbell();
    for (int r = 0; r < ranks; ++r) new (&l->ring(r)) shm_ring{.capacity = shm_ring_bytes(ranks)};
    // The magic last: a peer that maps early sees no segment yet.
    std::atomic_ref<std::uint64_t>(l->magic).store(segment_magic, std::memory_order_release);
    return std::unique_ptr<shm_segment>(new shm_segment(name, base, bytes, true));
  }
}

std::unique_ptr<shm_segment> shm_segment::open(const std::string& name, std::uint64_t nonce, int ranks) {
  const std::size_t bytes = layout::bytes(ranks);
  if (name.rfind(std::string("/") + name_prefix, 0) != 0) return nullptr;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    close(fd);
    return nullptr;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto* l = static_cast<layout*>(base);
  if (std::atomic_ref<std::uint64_t>(l->magic).load(std::memory_order_acquire) != segment_magic ||
      l->nonce != nonce || l->ranks != static_cast<std::uint64_t>(ranks)) {
    munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<shm_segment>(new shm_segment(name, base, bytes, false));
}

std::uint64_t shm_segment::nonce() const noexcept { return static_cast<const layout*>(base_)->nonce; }

void shm_segment::unlink() noexcept {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

shm_ring& shm_segment::ring_from(int sender) noexcept { return static_cast<layout*>(base_)->ring(sender); }

shm_doorbell& shm_segment::doorbell() noexcept { return static_cast<layout*>(base_)->doorbell; }

void shm_segment::abort() noexcept {
  auto* l = static_cast<layout*>(base_);
  l->aborted.store(1, std::memory_order_seq_cst);
  l->doorbell.ring();
}

bool shm_segment::aborted() const noexcept {
  return static_cast<const layout*>(base_)->aborted.load(std::memory_order_acquire) != 0;
}

void sweep_stale_segments() noexcept {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(name_prefix, 0) != 0) continue;
    const long pid = std::strtol(file.c_str() + std::strlen(name_prefix), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) shm_unlink(("/" + file).c_str());
  }
}

shm_exchange::shm_exchange(int rank, std::unique_ptr<shm_segment> inbox, std::vector<std::unique_ptr<shm_segment>> peers)
    : rank_(rank), inbox_(std::move(inbox)), peers_(std::move(peers)) {}

bool shm_exchange::shares_memory(int peer) const noexcept {
  return peer >= 0 && static_cast<std::size_t>(peer) < peers_.size() && peers_[static_cast<std::size_t>(peer)] != nullptr;
}

int shm_exchange::peer_count() const noexcept {
  return static_cast<int>(std::count_if(peers_.begin(), peers_.end(), [](const auto& p) { return p != nullptr; }));
}

std::size_t shm_exchange::post(std::byte* data, std::size_t bytes, int peer, bool send, bool exact) {
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

bool shm_exchange::finished(std::size_t target) const {
  if (target != all) return transfers_[target].complete();
  return std::all_of(transfers_.begin(), transfers_.end(), [](const shm_transfer& t) { return t.complete(); });
}

bool shm_exchange::drive(std::size_t target, clock::time_point wake, clock::time_point deadline,
                         const shm_health& health) {
  shm_doorbell& bell = inbox_->doorbell();
  auto check_at = clock::now() + health.slice;
  for (;;) {
    const std::uint32_t seen = bell.seq.load(std::memory_order_seq_cst);
    const bool moved = advance();
    if (finished(target)) return true;
    if (inbox_->aborted()) throw error(error_kind::internal, "aborted by a rank on this machine");
    auto now = clock::now();
    if (now >= deadline) throw error(error_kind::internal, "timed out");
    if (now >= wake) return false;
    if (now >= check_at) {
      if (health.group_aborted != nullptr && *health.group_aborted) throw error(error_kind::internal, "aborted");
      try {
        for (const shm_transfer& t : transfers_)
          if (!t.complete()) health.probe(t.peer);
      } catch (const std::exception&) {
        // A peer that wrote its last message and left: it is in the ring.
        advance();
        if (finished(target)) return true;
        throw;
      }
      check_at = now + health.slice;
    }
    if (moved) continue;
    const auto spin_until = now + shm_spin;
    while (bell.seq.load(std::memory_order_relaxed) == seen && clock::now() < spin_until) cpu_relax();
    if (bell.seq.load(std::memory_order_seq_cst) == seen) bell.wait(seen, std::min({wake, deadline, check_at}));
  }
}

// One pass over the pending transfers; whether any bytes moved. A ring's
// later transfer waits for its earlier ones.
bool shm_exchange::advance() {
  bool moved = false;
  busy_rings_.clear();
  for (shm_transfer& t : transfers_) {
    if (t.complete()) continue;
    if (std::find(busy_rings_.begin(), busy_rings_.end(), t.ring) != busy_rings_.end()) continue;
    moved |= t.advance();
    if (!t.complete()) busy_rings_.push_back(t.ring);
  }
  return moved;
}

}  // namespace dpactor
