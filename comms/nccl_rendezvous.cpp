#include "comms/nccl_rendezvous.hpp"

#include <algorithm>
#include <stdexcept>

#include "comms/collective.hpp"

namespace dpactor {

std::vector<char> share_unique_id(rendezvous_store& store, const std::string& prefix, int rank, std::size_t id_bytes,
                                  const std::function<std::vector<char>()>& make_id, const std::atomic<bool>& aborted,
                                  std::chrono::steady_clock::time_point deadline) {
  const std::string key = prefix + "/nccl_id";
  const auto check = [&](std::vector<char> id) {
    if (id.size() != id_bytes)
      throw collective_error(collective_errc::mismatch, "NCCL rendezvous: " + key + " holds " + std::to_string(id.size()) +
                                                            " bytes, not the " + std::to_string(id_bytes) +
                                                            " of a unique id");
    return id;
  };
  try {
    if (rank == 0) {
      std::vector<char> id = check(make_id());
      store.set(key, id);
      return id;
    }
    for (;;) {
      if (aborted) throw collective_error(collective_errc::aborted, "NCCL rendezvous aborted waiting for " + key);
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw collective_error(collective_errc::timeout, "NCCL rendezvous timed out waiting for " + key +
                                                             " (generation rank 0 never published it)");
      if (auto id = store.get(key, std::min(deadline, now + store_poll_slice))) return check(std::move(*id));
    }
  } catch (const collective_error&) {
    throw;
  } catch (const std::exception& e) {  // the store's
    throw collective_error(collective_errc::aborted, std::string("NCCL rendezvous: ") + e.what());
  }
}

}  // namespace dpactor
