#include "train/membership.hpp"

#include <algorithm>
#include <utility>

namespace dpactor {

membership::membership(std::vector<member> initial, std::vector<fault_spec> planned)
    : members_(std::move(initial)), planned_(std::move(planned)) {
  std::stable_sort(planned_.begin(), planned_.end(), [](const fault_spec& a, const fault_spec& b) { return a.step < b.step; });
  reasons_.push_back("start");
}

std::size_t membership::live() const noexcept {
  return static_cast<std::size_t>(std::count_if(members_.begin(), members_.end(), [](const member& m) { return !m.gone; }));
}

std::optional<std::size_t> membership::rank_of(int id) const noexcept {
  for (std::size_t r = 0; r < members_.size(); ++r)
    if (members_[r].id == id && !members_[r].gone) return r;
  return std::nullopt;
}

std::optional<std::size_t> membership::rank_of(const std::string& name) const noexcept {
  for (std::size_t r = 0; r < members_.size(); ++r)
    if (members_[r].name == name && !members_[r].gone) return r;
  return std::nullopt;
}

bool membership::remove(std::size_t rank, const std::string& reason) {
  member& m = members_.at(rank);
  if (m.gone) return false;
  m.gone = true;
  reasons_.push_back(m.name + " " + reason);
  return true;
}

void membership::note(const std::string& reason) { reasons_.push_back(reason); }

bool membership::request_leave(const std::string& name) {
  if (std::none_of(members_.begin(), members_.end(), [&](const member& m) { return m.name == name; })) return false;
  pending_leaves_.push_back(name);
  return true;
}

void membership::plan(const fault_spec& change) {
  const auto at = std::upper_bound(planned_.begin(), planned_.end(), change,
                                   [](const fault_spec& a, const fault_spec& b) { return a.step < b.step; });
  planned_.insert(at, change);
}

std::optional<std::int64_t> membership::next_pause(std::int64_t committed, std::optional<std::int64_t> last_step) {
  // Spec steps count from 1; a change "at S" comes after 0-based step S - 2.
  if (last_step) std::erase_if(planned_, [&](const fault_spec& f) { return f.step - 2 >= *last_step; });
  if (pending_joins_ > 0 || !pending_leaves_.empty()) return committed;  // as soon as possible
  if (!planned_.empty()) return std::max(committed, planned_.front().step - 2);
  return std::nullopt;
}

void membership::take_due_changes(std::int64_t pause_point) {
  while (!planned_.empty() && planned_.front().step - 2 <= pause_point) {
    const fault_spec f = planned_.front();
    planned_.erase(planned_.begin());
    if (f.kind == fault_kind::join) ++pending_joins_;
    else pending_leaves_.push_back("cpu:" + std::to_string(f.device));
  }
}

std::vector<int> membership::apply_leaves(std::optional<int> keep) {
  std::vector<std::string> deferred;
  std::vector<int> left;
  for (const auto& name : std::exchange(pending_leaves_, {})) {
    for (std::size_t r = 0; r < members_.size(); ++r) {
      if (members_[r].name != name || members_[r].gone) continue;
      if (keep && members_[r].id == *keep) {
        deferred.push_back(name);
      } else {
        remove(r, "left");
        left.push_back(members_[r].id);
      }
    }
  }
  pending_leaves_ = std::move(deferred);
  std::erase_if(members_, [](const member& m) { return m.gone; });
  return left;
}

void membership::admit(member newcomer) {
  reasons_.push_back(newcomer.name + " joined");
  members_.push_back(std::move(newcomer));
  if (pending_joins_ > 0) --pending_joins_;
}

std::string membership::reasons() const {
  std::string out;
  for (const auto& r : reasons_) out += (out.empty() ? "" : "; ") + r;
  return out;
}

std::string membership::form_generation() {
  std::erase_if(members_, [](const member& m) { return m.gone; });
  ++generation_;
  late_ = {};
  std::string why = reasons();
  reasons_.clear();
  return why;
}

state_source membership::choose_state_source(const std::map<int, std::int64_t>& applied, std::int64_t committed,
                                             std::optional<std::int64_t> rescue_step) const {
  state_source s;
  s.through = committed;
  for (std::size_t r = 0; r < members_.size(); ++r) {
    if (members_[r].gone) continue;
    const auto it = applied.find(members_[r].id);
    if (it == applied.end() || it->second < committed) continue;
    if (!s.rank || it->second > s.through) {  // strictly more advanced: the oldest wins a tie
      s.rank = r;
      s.through = std::max(s.through, it->second);
    }
  }
  if (!s.rank && rescue_step && *rescue_step >= committed) s.through = std::max(s.through, *rescue_step);
  return s;
}

std::vector<std::int32_t> membership::on_late(std::int64_t step, std::int32_t rank, std::span<const std::int32_t> missing,
                                              std::int64_t committed) {
  if (step <= committed) return {};
  if (late_.step != step) {
    late_ = {step, {missing.begin(), missing.end()}, {}};
  } else if (!missing.empty()) {
    std::erase_if(late_.missing, [&](std::int32_t r) { return std::find(missing.begin(), missing.end(), r) == missing.end(); });
  }
  late_.waiting.push_back(rank);
  if (missing.empty()) {
    // The backend cannot tell who is missing (NCCL): the members that have not
    // said they are waiting. One still waiting short of its own deadline may
    // be counted too; cutting a member that has finished computing is a no-op.
    late_.missing.clear();
    for (std::size_t r = 0; r < members_.size(); ++r)
      if (std::find(late_.waiting.begin(), late_.waiting.end(), static_cast<std::int32_t>(r)) == late_.waiting.end())
        late_.missing.push_back(static_cast<std::int32_t>(r));
  }
  std::vector<std::int32_t> cut;
  for (const auto r : missing.empty() ? std::span<const std::int32_t>(late_.missing) : missing)
    if (r >= 0 && static_cast<std::size_t>(r) < members_.size()) cut.push_back(r);
  return cut;
}

std::vector<std::size_t> membership::late_suspects(std::int64_t committed) const {
  std::vector<std::size_t> suspects;
  if (late_.step <= committed) return suspects;
  for (const auto r : late_.missing)
    if (r >= 0 && static_cast<std::size_t>(r) < members_.size()) suspects.push_back(static_cast<std::size_t>(r));
  return suspects;
}

std::string member_list(std::span<const std::string> names, std::size_t listed_in_full) {
  constexpr std::size_t head = 8, tail = 4;
  std::string out;
  const auto add = [&](const std::string& text) { out += (out.empty() ? "" : ", ") + text; };
  if (names.size() <= std::max(listed_in_full, head + tail)) {
    for (const auto& n : names) add(n);
    return out;
  }
  for (std::size_t i = 0; i < head; ++i) add(names[i]);
  add("... " + std::to_string(names.size() - head - tail) + " more ...");
  for (std::size_t i = names.size() - tail; i < names.size(); ++i) add(names[i]);
  return out;
}

}  // namespace dpactor
