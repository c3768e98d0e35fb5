#include "train/async_claims.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "data/sampler.hpp"

namespace dpactor {

async_claims::async_claims(std::size_t samples, std::uint64_t seed, bool shuffle, std::int64_t epochs)
    : samples_(samples), seed_(seed), shuffle_(shuffle), epochs_(epochs),
      requeued_(static_cast<std::size_t>(std::max<std::int64_t>(epochs, 0)), 0) {
  if (samples == 0) throw std::invalid_argument("async_claims: no samples");
}

async_claims::async_claims(std::size_t samples, std::uint64_t seed, bool shuffle, std::int64_t epochs,
                           const async_position& p)
    : async_claims(samples, seed, shuffle, epochs) {
  const auto bad = [](const std::string& what) { throw std::invalid_argument("async claims: " + what); };
  if (p.done < 0 || p.done > epochs) bad("epochs_done " + std::to_string(p.done) + " of a run of " + std::to_string(epochs));
  done_ = p.done;
  for (std::size_t e = 0; e < p.requeued.size() && e < requeued_.size(); ++e) requeued_[e] = p.requeued[e];
  const auto n = static_cast<std::int64_t>(samples);
  for (const async_epoch_position& e : p.open) {
    const std::string where = "epoch " + std::to_string(e.epoch) + ": ";
    if (e.epoch < done_ || e.epoch >= epochs || open_.count(e.epoch)) bad(where + "not an open epoch of this run");
    if (e.next < 0 || e.next > n || e.returned.size() % 2 != 0) bad(where + "positions past its " + std::to_string(n) + " samples");
    epoch_state& s = at(e.epoch);
    s.next = static_cast<std::size_t>(e.next);
    std::int64_t back = 0;
    for (std::size_t i = 0; i < e.returned.size(); i += 2) {
      const std::int64_t first = e.returned[i], count = e.returned[i + 1];
      if (first < 0 || count <= 0 || first + count > e.next) bad(where + "a returned range past what was handed out");
      const auto b = s.order.begin() + first;
      s.returned.push_back(async_claim{e.epoch, first, {b, b + static_cast<std::ptrdiff_t>(count)}});
      back += count;
    }
    if (e.committed < 0 || e.committed + back != e.next)
      bad(where + std::to_string(e.committed) + " committed and " + std::to_string(back) + " returned of " +
          std::to_string(e.next) + " handed out");
    s.committed = e.committed;
  }
}

async_position async_claims::position(std::span<const async_claim> outstanding) const {
  async_position p;
  p.active = true;
  p.done = done_;
  p.requeued = requeued_;
  for (const auto& [e, s] : open_) {
    async_epoch_position ep;
    ep.epoch = e;
    ep.next = static_cast<std::int64_t>(s.next);
    ep.committed = s.committed;
    const auto add = [&](const async_claim& c) {
      ep.returned.push_back(c.first);
      ep.returned.push_back(static_cast<std::int64_t>(c.rows.size()));
    };
    for (const async_claim& c : outstanding)
      if (c.epoch == e) add(c);
    for (const async_claim& c : s.returned) add(c);
    p.open.push_back(std::move(ep));
  }
  return p;
}

async_claims::epoch_state& async_claims::at(std::int64_t e) {
  auto it = open_.find(e);
  if (it == open_.end()) {
    it = open_.emplace(e, epoch_state{}).first;
    it->second.order = epoch_order(samples_, seed_, e, shuffle_);
  }
  return it->second;
}

// See Note [Async claims]: the oldest epoch with samples not handed out.
std::optional<async_claim> async_claims::claim(std::size_t n) {
  if (n == 0) throw std::invalid_argument("async_claims::claim: a claim of no samples");
  for (std::int64_t e = done_; e < epochs_; ++e) {
    epoch_state& s = at(e);
    if (!s.returned.empty()) {
      async_claim& front = s.returned.front();
      if (front.rows.size() <= n) {
        async_claim c = std::move(front);
        s.returned.pop_front();
        return c;
      }
      async_claim c{e, front.first, {front.rows.begin(), front.rows.begin() + static_cast<std::ptrdiff_t>(n)}};
      front.rows.erase(front.rows.begin(), front.rows.begin() + static_cast<std::ptrdiff_t>(n));
      front.first += static_cast<std::int64_t>(n);
      return c;
    }
    if (s.next < samples_) {
      const std::size_t end = std::min(samples_, s.next + n);
      async_claim c{e, static_cast<std::int64_t>(s.next),
                    {s.order.begin() + static_cast<std::ptrdiff_t>(s.next), s.order.begin() + static_cast<std::ptrdiff_t>(end)}};
      s.next = end;
      return c;
    }
  }
  return std::nullopt;
}

async_claim async_claims::claim_at(std::int64_t epoch, std::int64_t first, std::size_t n) {
  if (epoch < done_ || epoch >= epochs_ || first < 0 || n == 0 || static_cast<std::size_t>(first) + n > samples_)
    throw std::out_of_range("async_claims::claim_at: epoch " + std::to_string(epoch) + " positions [" +
                            std::to_string(first) + ", " + std::to_string(first + static_cast<std::int64_t>(n)) +
                            ") are not an open epoch's");
  const epoch_state& s = at(epoch);
  const auto b = s.order.begin() + first;
  return async_claim{epoch, first, {b, b + static_cast<std::ptrdiff_t>(n)}};
}

void async_claims::commit(const async_claim& c) {
  const auto it = open_.find(c.epoch);
  if (it == open_.end()) throw std::logic_error("async_claims::commit: epoch " + std::to_string(c.epoch) + " is not open");
  epoch_state& s = it->second;
  s.committed += static_cast<std::int64_t>(c.rows.size());
  if (s.committed > static_cast<std::int64_t>(samples_))
    throw std::logic_error("async_claims::commit: epoch " + std::to_string(c.epoch) + " committed more samples than it has");
  // Epochs all of whose samples are committed leave, in order (a later one
  // may finish first: it waits for the ones before it).
  while (true) {
    const auto first = open_.find(done_);
    if (first == open_.end() || first->second.committed != static_cast<std::int64_t>(samples_)) break;
    open_.erase(first);
    ++done_;
  }
}

void async_claims::give_back(async_claim c) {
  const auto it = open_.find(c.epoch);
  if (it == open_.end()) throw std::logic_error("async_claims::give_back: epoch " + std::to_string(c.epoch) + " is not open");
  requeued_[static_cast<std::size_t>(c.epoch)] += static_cast<std::int64_t>(c.rows.size());
  it->second.returned.push_front(std::move(c));
}

std::int64_t async_claims::committed(std::int64_t e) const {
  if (e < done_) return static_cast<std::int64_t>(samples_);
  const auto it = open_.find(e);
  return it == open_.end() ? 0 : it->second.committed;
}

std::int64_t async_claims::requeued(std::int64_t e) const {
  return e >= 0 && e < epochs_ ? requeued_[static_cast<std::size_t>(e)] : 0;
}

std::int64_t async_inner_steps(std::int64_t every, double throughput, double fastest) {
  if (!(throughput > 0.0) || !(fastest > 0.0)) return every;
  const auto h = static_cast<std::int64_t>(std::llround(static_cast<double>(every) * std::min(1.0, throughput / fastest)));
  return std::max<std::int64_t>(1, h);
}

}  // namespace dpactor
