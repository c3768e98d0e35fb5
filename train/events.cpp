#include "train/events.hpp"

namespace dpactor {
namespace {

json to_json(const step_event& e) {
  json out = json::make_object();
  out.set("event", "step").set("step", e.step).set("epoch", e.epoch).set("epoch_step", e.epoch_step)
      .set("loss", e.loss).set("accuracy", e.accuracy).set("lr", e.lr).set("samples_per_s", e.samples_per_s)
      .set("generation", e.generation).set("cuts", e.cuts);
  json shares = json::make_array(), rates = json::make_array();
  for (double v : e.shares) shares.push(v);
  for (double v : e.throughput) rates.push(v);
  out.set("shares", std::move(shares)).set("throughput", std::move(rates));
  return out;
}

json to_json(const epoch_event& e) {
  json out = json::make_object();
  out.set("event", "epoch").set("epoch", e.epoch).set("step", e.step).set("train_loss", e.train_loss)
      .set("train_accuracy", e.train_accuracy).set("test_loss", e.test_loss).set("test_accuracy", e.test_accuracy)
      .set("samples_per_s", e.samples_per_s).set("seconds", e.seconds).set("samples", e.samples)
      .set("requeued", e.requeued);
  return out;
}

json to_json(const membership_event& e) {
  json members = json::make_array();
  for (const auto& m : e.members) members.push(m);
  json out = json::make_object();
  json ids = json::make_array();
  for (const auto id : e.actor_ids) ids.push(static_cast<std::int64_t>(id));
  out.set("event", "membership").set("generation", e.generation).set("step", e.step).set("members", std::move(members))
      .set("actor_ids", std::move(ids)).set("reason", e.reason);
  return out;
}

json to_json(const recovery_event& e) {
  json out = json::make_object();
  out.set("event", "recovery").set("generation", e.generation).set("step", e.step).set("recovery_ms", e.recovery_ms)
      .set("requeued", e.requeued);
  return out;
}

json to_json(const checkpoint_event& e) {
  json out = json::make_object();
  out.set("event", "checkpoint").set("step", e.step).set("path", e.path);
  return out;
}

}  // namespace

json to_json(const event& e) {
  return std::visit([](const auto& v) { return to_json(v); }, e);
}

json to_json(const run_summary& s) {
  json out = json::make_object();
  out.set("event", "summary").set("test_accuracy", s.test_accuracy).set("test_loss", s.test_loss)
      .set("samples_per_s", s.samples_per_s).set("wall_s", s.wall_s).set("train_s", s.train_s).set("steps", s.steps)
      .set("epochs", s.epochs).set("samples", s.samples).set("membership_changes", s.membership_changes)
      .set("cuts", s.cuts).set("requeued", s.requeued).set("max_recovery_ms", s.max_recovery_ms)
      .set("checkpoint", s.checkpoint).set("stopped", s.stopped);
  return out;
}

}  // namespace dpactor
