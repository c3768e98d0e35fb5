#pragma once
// Note [NCCL's unique id through the store]
// Every rank of an NCCL communicator must be given the same ncclUniqueId,
// which one of them makes (it embeds that rank's listening address). In one
// process the group object carries it; across processes generation rank 0
// makes it and publishes it under "<prefix>/nccl_id" in the generation's
// rendezvous store (See Note [Rendezvous store]), and every other rank reads
// it there, in slices of store_poll_slice, so that an abort of its group
// (the reducer's, during a rendezvous that a dead rank 0 never completes)
// ends the wait within one slice. Kept apart from NCCL itself so that it
// builds and is tested on machines without CUDA.

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comms/rendezvous_store.hpp"

namespace dpactor {

// The id bytes every rank of the group under `prefix` uses: rank 0 makes them
// with `make_id` and publishes them; the others wait for them until
// `deadline`. Throws collective_error: aborted (once `aborted` is set) or
// timeout; also when the store fails (aborted) or the bytes are not
// `id_bytes` long (mismatch).
std::vector<char> share_unique_id(rendezvous_store& store, const std::string& prefix, int rank, std::size_t id_bytes,
                                  const std::function<std::vector<char>()>& make_id, const std::atomic<bool>& aborted,
                                  std::chrono::steady_clock::time_point deadline);

}  // namespace dpactor
