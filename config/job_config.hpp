#pragma once
// What the engine derives from a job config (include/dpactor/job_config.hpp:
// the config itself, public): its schedule, whether cuts are on, and the
// checks between keys.

#include <cstdint>
#include <string>

#include <dpactor/job_config.hpp>
#include "tensors/lr_schedule.hpp"
#include "tensors/mlp.hpp"
#include "tensors/optimizer.hpp"
#include "train/step_record.hpp"

namespace dpactor {

// The schedule the job uses, with total_steps resolved from the run length.
lr_schedule make_lr_schedule(const job_config& config, std::int64_t run_steps);

// Whether late members are cut short (and their samples deferred): the
// policy says so and the run is not reproducible, where stealing replaces
// cuts (See Note [Stealing slices]).
bool cuts_enabled(const job_config& config) noexcept;

// sync.mode as the config file spells it ("every_step", "local_sgd", "diloco").
std::string sync_mode_name(sync_mode mode);
// sync.codec as the config file spells it ("fp32", "bf16", "int8").
std::string sync_codec_name(sync_codec codec);

// Checks relations between keys (e.g. nesterov needs momentum); throws config_error.
void validate_job_config(const job_config& config);

}  // namespace dpactor
