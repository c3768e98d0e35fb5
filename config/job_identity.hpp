#pragma once
// What the processes of one multi-node job must agree on before a worker's
// devices may join (See Note [Coordinator and workers]): the same config,
// but for what is each node's own (its data paths, its devices, the
// coordinator's checkpoints and faults), and the same data, proven by a
// fingerprint of the bytes each node loaded from its own copy.

#include <string>

#include "config/job_config.hpp"
#include "data/dataset.hpp"

namespace dpactor {

// The config as TOML with the node's own parts set to their defaults: equal
// on two nodes exactly when their devices train the same job.
std::string job_identity(const job_config& config);

// The first key whose line differs between two job_identity() texts, as
// "optimizer.lr = 0.05 (coordinator) against 0.5 (worker)"; "" when equal.
std::string first_difference(const std::string& mine, const std::string& theirs, const std::string& my_name,
                             const std::string& their_name);

// "train 60000 x 784 (10 classes) 1f0c..., test 10000 x 784 (10 classes)
// 9a2e...": the shapes and a 64-bit checksum of the features and labels.
std::string data_fingerprint(const dataset& train, const dataset& test);

}  // namespace dpactor
