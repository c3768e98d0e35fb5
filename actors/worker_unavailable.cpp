// The worker role in a build without the Gloo backend (See
// actors/worker.hpp): refused before it connects.

#include "actors/worker.hpp"

#include <dpactor/error.hpp>

namespace dpactor {

worker_result run_worker(const worker_options&) {
  throw config_error("this build of dpactor has no Gloo backend, which a worker needs (apt-get install libgloo-dev, "
                     "then build again)");
}

}  // namespace dpactor
