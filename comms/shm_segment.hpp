#pragma once
// Note [Same-machine ranks share memory]
// Ranks of a Gloo group that run in processes of one machine (a coordinator
// and a worker side by side, or torchrun's several processes per node) need
// not push their payloads through TCP on loopback: there every message is
// copied into the kernel and out again by Gloo's event-loop thread, which
// then wakes the waiting thread, and on a small machine those two wake-ups
// per message cost more than the copies (docs/PERFORMANCE.md).
// Instead each such rank owns an inbox: a shared-memory segment with one ring
// per sending rank and one doorbell. A sender copies straight into the
// receiver's ring and rings its doorbell; the receiver, which sleeps on the
// doorbell (a futex), copies out and rings the sender's doorbell when it
// frees space. One copy in, one out, one wake-up; no third thread.
//
// A ring is a byte stream in which the sender writes each message as its
// length (8 bytes) followed by its bytes, in the order both sides posted
// them, so messages of any size stream through a ring of fixed size; a
// receiver that finds a length other than the one it expects has a peer that
// called something else.
//
// An abort marks every segment a rank has mapped and rings their doorbells,
// so a peer waiting on shared memory wakes at once, as a Gloo wait does when
// its sockets close. What shared memory cannot tell, the TCP connection
// between two ranks still does: it stays open, and a wait probes it (See
// Note [Gloo waits look up every health_slice]), so a killed peer ends the
// wait as it would over TCP.
//
// Finding each other: a rank creates its segment under a random name and
// publishes the name and a random nonce through the group's store; a peer
// that can open the name and finds the nonce in it shares the machine (and
// the /dev/shm). Both must succeed for a pair to use it, else the pair stays
// on TCP. Names are unlinked once the group is formed, so a killed process
// leaves nothing behind unless it dies during the rendezvous (sweep_stale_segments).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dpactor {

// Bytes of each ring of a group of `ranks`: a message larger than this
// streams through it. 1 MiB for groups of up to 8 ranks, then an inbox of
// about 8 MiB shared by the rings (down to 64 KiB each): a segment is
// reserved whole when it is made (shm_segment::create), and 65 ranks with
// rings of 1 MiB reserved 4.2 GB a generation, which took seconds of a
// recovery on 2 cores (docs/scale.md).
std::size_t shm_ring_bytes(int ranks) noexcept;

// A rank's doorbell: a counter that every event meant for the rank
// increments, and that the rank sleeps on.
struct shm_doorbell {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint32_t> sleepers{0};
  // Wakes the owner if it sleeps.
  void ring() noexcept;
  // Sleeps until seq differs from `seen` or `until` passes.
  void wait(std::uint32_t seen, std::chrono::steady_clock::time_point until) noexcept;
};

// One direction between two ranks, in the receiver's segment: this header,
// then `capacity` bytes of data.
struct shm_ring {
  alignas(64) std::atomic<std::uint64_t> head{0};  // bytes written, by the sender
  std::uint64_t capacity = 0;                      // set when the segment is made
  alignas(64) std::atomic<std::uint64_t> tail{0};  // bytes read, by the receiver
  std::byte* data() noexcept { return reinterpret_cast<std::byte*>(this) + sizeof(shm_ring); }
};

// One message being sent or received over a ring, advanced by calls to
// advance() (never blocks).
struct shm_transfer {
  shm_ring* ring = nullptr;
  shm_doorbell* other = nullptr;  // the receiver's doorbell for a send, the sender's for a receive
  std::byte* data = nullptr;
  std::size_t bytes = 0;  // a send's length; a receive's capacity
  bool send = false;
  bool exact = true;  // a receive's message must be `bytes` long (else up to `bytes`)
  int peer = -1;
  // Progress: the length word, then the bytes.
  std::uint64_t length = 0;
  std::size_t length_done = 0;
  std::size_t done = 0;
  bool complete() const noexcept { return length_done == sizeof length && done == length; }
  // Moves as many bytes as the ring allows; whether any moved. Throws
  // std::length_error on a receive whose message has another length than
  // expected (exceeds its capacity, when not exact).
  bool advance();
};

// A rank's inbox, mapped by its owner (created) or by a peer (opened).
class shm_segment {
 public:
  ~shm_segment();
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;

  // A new segment with one ring per rank of a group of `ranks`, its memory
  // reserved (a full /dev/shm fails here, not with SIGBUS on a later write).
  // Throws std::system_error when shared memory cannot be made (then the
  // group stays on TCP).
  static std::unique_ptr<shm_segment> create(int ranks);
  // The segment published as `name` with `nonce`, or nullptr when this
  // process cannot see it (another machine, another /dev/shm).
  static std::unique_ptr<shm_segment> open(const std::string& name, std::uint64_t nonce, int ranks);

  const std::string& name() const noexcept { return name_; }
  std::uint64_t nonce() const noexcept;
  // Removes the name; the mappings stay valid.
  void unlink() noexcept;
  shm_ring& ring_from(int sender) noexcept;
  shm_doorbell& doorbell() noexcept;
  // Marks the group aborted in this segment and wakes its owner.
  void abort() noexcept;
  bool aborted() const noexcept;

 private:
  struct layout;
  shm_segment(std::string name, void* base, std::size_t bytes, bool owner);
  std::string name_;
  void* base_;
  std::size_t bytes_;
  bool linked_;
};

// Removes /dev/shm segments of this scheme left by processes that no longer
// exist (killed during a rendezvous).
void sweep_stale_segments() noexcept;

// What a waiting exchange checks every `slice`, since shared memory cannot
// tell that a peer died: the group's abort flag, and the connection to each
// peer it still waits for (`probe` throws when that connection failed). See
// Note [Gloo waits look up every health_slice], comms/gloo_connect.cpp.
struct shm_health {
  const std::atomic<bool>* group_aborted = nullptr;
  std::function<void(int peer)> probe;
  std::chrono::milliseconds slice{5};
};

// One rank's transfers of a call with the peers that share its machine:
// its inbox, and per peer the peer's inbox (null: that pair is not on shared
// memory). Transfers are posted in the order both sides post them and
// driven until done; a ring's later transfer waits for its earlier ones.
// Used by the rank's thread only.
class shm_exchange {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t all = ~std::size_t{0};

  shm_exchange(int rank, std::unique_ptr<shm_segment> inbox, std::vector<std::unique_ptr<shm_segment>> peers);

  bool shares_memory(int peer) const noexcept;
  // How many peers share memory with this rank.
  int peer_count() const noexcept;
  shm_segment& inbox() noexcept { return *inbox_; }
  // The peers' segments (null where a pair is on TCP).
  const std::vector<std::unique_ptr<shm_segment>>& peers() const noexcept { return peers_; }

  // A transfer of `bytes` at `data` with `peer`, pending until drive() ends
  // it; its index. A receive that is not `exact` takes a message of up to
  // `bytes`.
  std::size_t post(std::byte* data, std::size_t bytes, int peer, bool send, bool exact = true);
  bool empty() const noexcept { return transfers_.empty(); }
  // Forgets every transfer (the call is over, or failed).
  void clear() noexcept { transfers_.clear(); }

  // Advances every pending transfer until transfers[target] has completed
  // (every one, with target = all): true; false when `wake` comes first.
  // Throws std::runtime_error on an abort (this group's, or a rank's on this
  // machine), at the deadline, or what `health.probe` throws for a peer it
  // still waits for; std::length_error when a peer sent a message of another
  // length (it called something else).
  bool drive(std::size_t target, clock::time_point wake, clock::time_point deadline, const shm_health& health);

 private:
  bool advance();
  bool finished(std::size_t target) const;

  int rank_;
  std::unique_ptr<shm_segment> inbox_;
  std::vector<std::unique_ptr<shm_segment>> peers_;
  std::vector<shm_transfer> transfers_;
  std::vector<const shm_ring*> busy_rings_;
};

}  // namespace dpactor
