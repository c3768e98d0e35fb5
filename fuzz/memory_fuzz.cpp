// Fuzz target: the config keys that size memory (See Note [Memory before
// allocating], train/memory_estimate.hpp). Input: a job config's text. A
// config that loads and whose estimate fits in a small budget must build its
// replica and its synthetic data without an allocation beyond the budget
// (libFuzzer's -malloc_limit_mb makes one a finding) and without
// std::bad_alloc; one that does not fit is refused with a config_error.

#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config_file.hpp"
#include "config/memory_needs.hpp"
#include "data/synthetic.hpp"
#include "fuzz/fuzz_support.hpp"
#include "tensors/cpu_replica.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dpactor;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Below the run's -malloc_limit_mb (1024) and -rss_limit_mb (2048).
  const memory_limit budget{256.0 * 1024 * 1024, "the fuzz budget"};
  fuzz::expect_clear_error<config_error>([&] {
    job_config config = parse_job_config(text, "fuzz.cfg");
    config.data.format = data_format::synthetic;
    const double rows = static_cast<double>(config.data.synthetic_train + config.data.synthetic_test);
    const double features = static_cast<double>(config.model.inputs());
    check_memory(memory_needs(config, 0.0, 1, rows * (features + 3.0) * 4.0), budget);
    cpu_replica replica(config.model, config.optimizer, static_cast<std::size_t>(config.train.micro_batch));
    synthetic_options o;
    o.rows = static_cast<std::size_t>(config.data.synthetic_train);
    o.features = static_cast<std::size_t>(config.model.inputs());
    o.classes = config.model.outputs();
    (void)make_synthetic(o);
  });
  return 0;
}
