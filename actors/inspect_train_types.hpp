#pragma once
// How the types of train/ and data/ that travel inside messages are
// serialised (CAF's inspect): the shards, the step records, the samples a
// cut returned, the ledger's position, and the trained events. Here, so
// that those libraries stay free of CAF.

#include <caf/all.hpp>

#include "data/epoch_ledger.hpp"
#include <dpactor/events.hpp>
#include "train/step_record.hpp"
#include "train/step_shard.hpp"

namespace dpactor {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_shard& x) {
  return f(caf::meta::type_name("step_shard"), x.step, x.epoch, x.indices, x.slice_rows, x.first_slice, x.last_slice,
           x.schedule_position, x.lr_override, x.slice_count, x.own_slices);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_record& x) {
  return f(caf::meta::type_name("step_record"), x.step, x.epoch, x.loss_sum, x.correct, x.samples, x.checksum,
           x.counter, x.compute_s, x.member_samples, x.member_returned, x.lr, x.nonfinite, x.applied);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_returned& x) {
  return f(caf::meta::type_name("step_returned"), x.step, x.indices);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, async_epoch_position& x) {
  return f(caf::meta::type_name("async_epoch_position"), x.epoch, x.next, x.committed, x.returned);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ledger_position& x) {
  return f(caf::meta::type_name("ledger_position"), x.epoch, x.cursor, x.front, x.stream.active, x.stream.committed,
           x.stream.trained_above, x.async.active, x.async.done, x.async.requeued, x.async.open);
}

// A device in another process reports what it trained to the reducer, which
// publishes it as the event (train.record_trained): after the device's
// earlier reports, before its later ones.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trained_event& x) {
  return f(caf::meta::type_name("trained_event"), x.device, x.step, x.epoch, x.samples, x.digest, x.carried,
           x.generation, x.worker, x.worker_round);
}

}  // namespace dpactor
