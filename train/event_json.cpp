#include "train/event_json.hpp"

namespace dpactor {
namespace {

json to_json(const step_event& e) {
  json j{{"event", "step"},   {"step", e.step},       {"epoch", e.epoch}, {"epoch_step", e.epoch_step},
         {"loss", e.loss},    {"accuracy", e.accuracy}, {"lr", e.lr},     {"samples_per_s", e.samples_per_s},
         {"generation", e.generation}, {"cuts", e.cuts}, {"skipped", e.skipped}, {"shares", e.shares}, {"throughput", e.throughput},
         {"bytes_sent", e.bytes_sent}, {"samples", e.samples}};
  if (!e.workers.empty()) {
    json workers = json::array();
    for (const worker_account& w : e.workers)
      workers.push_back({{"contributed", w.contributed}, {"dropped", w.dropped}, {"mean_staleness", w.mean_staleness},
                         {"inner_steps", w.inner_steps}, {"samples_per_s", w.samples_per_s}});
    j["workers"] = std::move(workers);
  }
  return j;
}

json to_json(const epoch_event& e) {
  return {{"event", "epoch"},
          {"epoch", e.epoch},
          {"step", e.step},
          {"train_loss", e.train_loss},
          {"train_accuracy", e.train_accuracy},
          {"test_loss", e.test_loss},
          {"test_accuracy", e.test_accuracy},
          {"samples_per_s", e.samples_per_s},
          {"seconds", e.seconds},
          {"samples", e.samples},
          {"requeued", e.requeued}};
}

json to_json(const membership_event& e) {
  return {{"event", "membership"}, {"generation", e.generation}, {"step", e.step},
          {"members", e.members},  {"actor_ids", e.actor_ids},   {"reason", e.reason}};
}

json to_json(const recovery_event& e) {
  return {{"event", "recovery"},
          {"generation", e.generation},
          {"step", e.step},
          {"recovery_ms", e.recovery_ms},
          {"requeued", e.requeued}};
}

json to_json(const checkpoint_event& e) {
  json j{{"event", "checkpoint"}, {"step", e.step}, {"path", e.path}};
  if (e.committed_sequence >= 0) j["committed_sequence"] = e.committed_sequence;
  return j;
}

json to_json(const trained_event& e) {
  json j{{"event", "trained"}, {"device", e.device}, {"step", e.step + 1},   {"epoch", e.epoch},
         {"samples", e.samples}, {"digest", e.digest}, {"carried", e.carried}, {"generation", e.generation}};
  if (e.worker >= 0) {
    j["worker"] = e.worker;
    j["worker_round"] = e.worker_round;
  }
  return j;
}

json to_json(const round_contribution& c) {
  return {{"worker", c.worker}, {"worker_round", c.worker_round}, {"base_round", c.base_round},
          {"epoch", c.epoch},   {"first", c.first},               {"samples", c.samples}};
}

json to_json(const round_decision_event& e) {
  json merged = json::array(), dropped = json::array();
  for (const auto& c : e.merged) merged.push_back(to_json(c));
  for (const auto& c : e.dropped) dropped.push_back(to_json(c));
  json j{{"event", "round_decision"}, {"round", e.round}, {"committed", e.committed},
         {"merged", std::move(merged)}, {"dropped", std::move(dropped)}};
  if (!e.lost.empty()) {
    json lost = json::array();
    for (const auto& c : e.lost) lost.push_back(to_json(c));
    j["lost"] = std::move(lost);
  }
  if (!e.job.empty()) j["job"] = e.job;
  if (!e.data.empty()) j["data"] = e.data;
  if (e.workers > 0) j["workers"] = e.workers;
  return j;
}

round_contribution contribution_from_json(const json& j) {
  round_contribution c;
  c.worker = j.at("worker").get<std::int64_t>();
  c.worker_round = j.at("worker_round").get<std::int64_t>();
  c.base_round = j.at("base_round").get<std::int64_t>();
  c.epoch = j.at("epoch").get<std::int64_t>();
  c.first = j.at("first").get<std::int64_t>();
  c.samples = j.at("samples").get<std::int64_t>();
  return c;
}

}  // namespace

round_decision_event round_decision_from_json(const json& j) {
  round_decision_event e;
  e.round = j.at("round").get<std::int64_t>();
  e.committed = j.at("committed").get<bool>();
  for (const json& c : j.at("merged")) e.merged.push_back(contribution_from_json(c));
  for (const json& c : j.at("dropped")) e.dropped.push_back(contribution_from_json(c));
  if (j.contains("lost"))
    for (const json& c : j.at("lost")) e.lost.push_back(contribution_from_json(c));
  e.job = j.value("job", "");
  e.data = j.value("data", "");
  e.workers = j.value("workers", std::int64_t{0});
  return e;
}

json to_json(const event& e) {
  return std::visit([](const auto& v) { return to_json(v); }, e);
}

json to_json(const run_summary& s) {
  return {{"event", "summary"},
          {"test_accuracy", s.test_accuracy},
          {"test_loss", s.test_loss},
          {"samples_per_s", s.samples_per_s},
          {"wall_s", s.wall_s},
          {"train_s", s.train_s},
          {"steps", s.steps},
          {"epochs", s.epochs},
          {"samples", s.samples},
          {"membership_changes", s.membership_changes},
          {"cuts", s.cuts},
          {"skipped_steps", s.skipped_steps},
          {"requeued", s.requeued},
          {"bytes_sent", s.bytes_sent},
          {"largest_send", s.largest_send},
          {"overlapped_exchanges", s.overlapped_exchanges},
          {"max_recovery_ms", s.max_recovery_ms},
          {"checkpoint", s.checkpoint},
          {"stopped", s.stopped}};
}

}  // namespace dpactor
