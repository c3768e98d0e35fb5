#include "train/async_replay.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "train/event_json.hpp"

namespace dpactor {

async_replay::async_replay(std::vector<round_decision_event> decisions, std::size_t workers)
    : decisions_(std::move(decisions)), rounds_(workers), handed_(workers, 0) {
  std::int64_t open = 0;  // the round the next decision must be of
  for (std::size_t i = 0; i < decisions_.size(); ++i) {
    const round_decision_event& d = decisions_[i];
    const std::string where = "decision " + std::to_string(i + 1) + " (round " + std::to_string(d.round) + ")";
    if (d.round != open)
      throw std::invalid_argument(where + ": the decisions before it leave round " + std::to_string(open) + " open");
    if (d.committed && d.merged.empty()) throw std::invalid_argument(where + ": commits nothing");
    for (const round_contribution& c : d.lost)
      if (c.worker < 0 || static_cast<std::size_t>(c.worker) >= workers || c.samples <= 0 || c.first < 0 || c.epoch < 0)
        throw std::invalid_argument(where + ": a lost round of worker " + std::to_string(c.worker) + " with " +
                                    std::to_string(c.samples) + " samples cannot be one of this run's");
    if (!d.lost.empty() && (d.committed || !d.merged.empty() || !d.dropped.empty()))
      throw std::invalid_argument(where + ": a lost round's record decides nothing else");
    for (const auto* list : {&d.merged, &d.dropped})
      for (const round_contribution& c : *list) {
        if (c.worker < 0 || static_cast<std::size_t>(c.worker) >= workers)
          throw std::invalid_argument(where + ": logical worker " + std::to_string(c.worker) + " of a run with " +
                                      std::to_string(workers));
        if (c.base_round > d.round || c.base_round < 0 || c.samples <= 0 || c.first < 0 || c.epoch < 0)
          throw std::invalid_argument(where + ": worker " + std::to_string(c.worker) + "'s contribution from round " +
                                      std::to_string(c.base_round) + " with " + std::to_string(c.samples) +
                                      " samples cannot be decided here");
        rounds_[static_cast<std::size_t>(c.worker)].push_back(c);
      }
    if (d.committed) ++open;
  }
  for (std::size_t k = 0; k < workers; ++k) {
    auto& r = rounds_[k];
    std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.worker_round < b.worker_round; });
    for (std::size_t j = 0; j < r.size(); ++j)
      if (r[j].worker_round != static_cast<std::int64_t>(j))
        throw std::invalid_argument("logical worker " + std::to_string(k) + "'s decided rounds are not 0, 1, 2 ...: " +
                                    (r[j].worker_round < static_cast<std::int64_t>(j)
                                         ? "round " + std::to_string(r[j].worker_round) + " is decided twice"
                                         : "round " + std::to_string(j) + " is missing"));
  }
}

const round_contribution* async_replay::next_round(std::size_t worker) const {
  const auto& r = rounds_.at(worker);
  return handed_[worker] < r.size() ? &r[handed_[worker]] : nullptr;
}

void async_replay::handed_out(std::size_t worker) {
  if (next_round(worker) == nullptr) throw std::logic_error("async_replay: worker " + std::to_string(worker) + " has no round left");
  ++handed_[worker];
}

std::int64_t async_replay::oldest_base() const {
  std::int64_t oldest = std::numeric_limits<std::int64_t>::max();
  for (std::size_t k = 0; k < rounds_.size(); ++k)
    if (const round_contribution* c = next_round(k)) oldest = std::min(oldest, c->base_round);
  return oldest;
}

void async_replay::lost(std::size_t worker) {
  if (handed_.at(worker) == 0) throw std::logic_error("async_replay: worker " + std::to_string(worker) + " has no round handed out");
  --handed_[worker];
}

const round_decision_event* async_replay::next_decision() const {
  return next_decision_ < decisions_.size() ? &decisions_[next_decision_] : nullptr;
}

void async_replay::applied() {
  if (next_decision_ >= decisions_.size()) throw std::logic_error("async_replay: no decision left to apply");
  ++next_decision_;
}

std::vector<round_decision_event> read_round_decisions(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read: " + std::strerror(errno));
  std::vector<round_decision_event> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.find("\"round_decision\"") == std::string::npos) continue;  // not one: skipped unparsed
    try {
      const json j = json::parse(line);
      if (j.value("event", "") == "round_decision") out.push_back(round_decision_from_json(j));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": not a round_decision record: " + e.what());
    }
  }
  return out;
}

}  // namespace dpactor
