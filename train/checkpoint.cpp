#include "train/checkpoint.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>

#include <dpactor/error.hpp>
#include "train/checkpoint_checksum.hpp"
#include "tensors/file_io.hpp"
#include "tensors/finite_check.hpp"
#include "tensors/json.hpp"
#include "tensors/safetensors.hpp"

namespace dpactor {
namespace fs = std::filesystem;
namespace {

constexpr const char* checkpoint_prefix = "step-";

std::string checkpoint_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", checkpoint_prefix, static_cast<long long>(step));
  return name;
}

std::vector<tensor_to_save> tensors_of(const state_layout& layout, std::span<const float> state, std::size_t first,
                                       std::size_t last) {
  std::vector<tensor_to_save> out;
  for (std::size_t i = first; i < last; ++i) {
    const auto& t = layout.layout.tensors()[i];
    out.push_back({t.name, t.shape, state.subspan(t.offset, t.numel())});
  }
  return out;
}

// workers.safetensors: worker k's slot tensors as "worker.<k>.<name>", and
// each worker's step counter in the metadata ("steps", comma-separated).
constexpr const char* workers_file = "workers.safetensors";

std::string worker_tensor(std::size_t k, const std::string& name) { return "worker." + std::to_string(k) + "." + name; }

void save_workers(const fs::path& file, const worker_states& w) {
  const state_layout& inner = *w.inner;
  const worker_state_shape shape = worker_state_shape::of(inner, w.residual, w.fragments, w.delayed);
  const std::size_t per = shape.size(), count = w.states.size() / per;
  const std::size_t params = inner.parameter_tensors, all = inner.layout.tensors().size();
  std::vector<std::string> names;
  names.reserve(count * (all + 2 * params + 1));  // no reallocation: the tensors point at the names
  std::vector<tensor_to_save> tensors;
  std::string steps;
  for (std::size_t k = 0; k < count; ++k) {
    // The worker's floats sit as in an inner state from parameter_size on.
    for (std::size_t i = params; i < all; ++i) {
      const auto& t = inner.layout.tensors()[i];
      names.push_back(worker_tensor(k, t.name));
      tensors.push_back({names.back(), t.shape, w.states.subspan(k * per + (t.offset - inner.parameter_size), t.numel())});
    }
    for (std::size_t i = 0; w.residual && i < params; ++i) {
      const auto& t = inner.layout.tensors()[i];
      names.push_back(worker_tensor(k, "residual." + t.name));
      tensors.push_back({names.back(), t.shape, w.states.subspan(k * per + shape.residual_at() + t.offset, t.numel())});
    }
    for (std::size_t i = 0; shape.own_parameters() && i < params; ++i) {
      const auto& t = inner.layout.tensors()[i];
      names.push_back(worker_tensor(k, "inner." + t.name));
      tensors.push_back({names.back(), t.shape, w.states.subspan(k * per + shape.parameters_at() + t.offset, t.numel())});
    }
    for (std::size_t i = 0; shape.delayed && i < params; ++i) {
      const auto& t = inner.layout.tensors()[i];
      names.push_back(worker_tensor(k, "progress." + t.name));
      tensors.push_back({names.back(), t.shape, w.states.subspan(k * per + shape.progress_at() + t.offset, t.numel())});
    }
    if (shape.own_parameters()) {
      names.push_back(worker_tensor(k, "fragment_samples"));
      tensors.push_back({names.back(), {static_cast<std::int64_t>(shape.fragments)},
                         w.states.subspan(k * per + shape.samples_at(), shape.fragments)});
    }
    const std::span<const float> tail(w.states.data() + k * per + (inner.layout.size() - inner.parameter_size),
                                      state_layout::tail_floats);
    std::vector<float> one(inner.total_size(), 0.0f);
    std::copy(tail.begin(), tail.end(), one.begin() + static_cast<std::ptrdiff_t>(inner.layout.size()));
    steps += (k ? "," : "") + std::to_string(read_step_counter(one, inner));
  }
  string_pairs meta{{"workers", std::to_string(count)}, {"steps", steps}};
  meta.emplace_back(tensor_checksum_key, tensor_file_checksum(tensors, meta));
  save_safetensors(file, tensors, meta);
}

// A checkpoint's optional tensor file, loaded and its checksum verified;
// `missing`: why it may be absent, for the message.
safetensors_file open_tensor_file(const fs::path& file, const std::string& missing, bool checksummed) {
  std::error_code ec;
  if (!fs::exists(file, ec)) throw checkpoint_error(file.string() + ": missing: " + missing);
  auto loaded = load_safetensors(file);
  verify_tensor_file(loaded, file.string(), checksummed);
  return loaded;
}

// Tensor `name` of `loaded`, shaped `want`, F32 and finite, into `to`.
void take_tensor(const safetensors_file& loaded, const std::string& origin, const std::string& name,
                 const std::vector<std::int64_t>& want, float* to) {
  const loaded_tensor* t = loaded.find(name);
  if (t == nullptr) throw checkpoint_error(origin + ": tensor \"" + name + "\" is missing");
  if (t->shape != want || t->dtype != "F32")
    throw checkpoint_error(origin + ": tensor \"" + name + "\" does not have the model's shape in F32");
  if (const auto bad = first_nonfinite(t->values))
    throw checkpoint_error(origin + ": tensor " + name + " holds a non-finite value at index " + std::to_string(*bad));
  std::copy(t->values.begin(), t->values.end(), to);
}

// powersgd.safetensors (See Note [PowerSGD steps]): slice k's residual on
// each compressed matrix as "slice.<k>.residual.<param>" (it is zero
// elsewhere), the basis as "basis.<param>" (cols x rank); the slices and
// the rank in the metadata.
constexpr const char* powersgd_file = "powersgd.safetensors";

// The parameter tensor that starts at `offset`.
const tensor_spec& tensor_at(const state_layout& layout, std::size_t offset) {
  for (std::size_t i = 0; i < layout.parameter_tensors; ++i)
    if (layout.layout.tensors()[i].offset == offset) return layout.layout.tensors()[i];
  throw std::logic_error("powersgd: no parameter tensor at " + std::to_string(offset));
}

void save_powersgd(const fs::path& file, const state_layout& layout, const powersgd_states& p) {
  const powersgd_plan& plan = *p.plan;
  const std::size_t n = layout.parameter_size, slices = (p.states.size() - plan.q_floats()) / n;
  const std::span<const float> basis = p.states.subspan(slices * n);
  std::vector<std::string> names;
  names.reserve((slices + 1) * plan.matrices().size());  // no reallocation: the tensors point at the names
  std::vector<tensor_to_save> tensors;
  for (std::size_t k = 0; k < slices; ++k)
    for (const auto& m : plan.matrices()) {
      const tensor_spec& t = tensor_at(layout, m.offset);
      names.push_back("slice." + std::to_string(k) + ".residual." + t.name);
      tensors.push_back({names.back(), t.shape, p.states.subspan(k * n + m.offset, t.numel())});
    }
  for (const auto& m : plan.matrices()) {
    names.push_back("basis." + tensor_at(layout, m.offset).name);
    tensors.push_back({names.back(), {static_cast<std::int64_t>(m.cols), static_cast<std::int64_t>(plan.rank())},
                       basis.subspan(m.q_at, m.cols * plan.rank())});
  }
  string_pairs meta{{"slices", std::to_string(slices)}, {"rank", std::to_string(plan.rank())}};
  meta.emplace_back(tensor_checksum_key, tensor_file_checksum(tensors, meta));
  save_safetensors(file, tensors, meta);
}

std::vector<float> load_powersgd(const fs::path& file, const state_layout& layout, const powersgd_plan& plan,
                                 bool checksummed) {
  const std::string origin = file.string();
  const auto loaded = open_tensor_file(file, "the checkpoint holds no PowerSGD residuals and basis (is it of a run "
                                       "with another sync.codec, or in fast mode?)", checksummed);
  const std::string* slices_text = loaded.find_metadata("slices");
  const std::string* rank_text = loaded.find_metadata("rank");
  std::size_t slices = 0, rank = 0;
  try {
    if (slices_text == nullptr || rank_text == nullptr) throw std::invalid_argument("missing");
    slices = static_cast<std::size_t>(std::stoull(*slices_text));
    rank = static_cast<std::size_t>(std::stoull(*rank_text));
  } catch (const std::exception&) {
    throw checkpoint_error(origin + ": metadata \"slices\" or \"rank\" is missing or not a number");
  }
  if (rank != plan.rank())
    throw checkpoint_error(origin + ": factors of rank " + std::to_string(rank) + ", this run has sync.powersgd_rank = " +
                           std::to_string(plan.rank()));
  if (slices == 0 || slices > (1u << 20)) throw checkpoint_error(origin + ": " + std::to_string(slices) + " slices");
  const std::size_t n = layout.parameter_size;
  std::vector<float> out(slices * n + plan.q_floats(), 0.0f);
  const auto take = [&](const std::string& name, const std::vector<std::int64_t>& want, float* to) {
    take_tensor(loaded, origin, name, want, to);
  };
  for (std::size_t k = 0; k < slices; ++k)
    for (const auto& m : plan.matrices()) {
      const tensor_spec& t = tensor_at(layout, m.offset);
      take("slice." + std::to_string(k) + ".residual." + t.name, t.shape, out.data() + k * n + m.offset);
    }
  for (const auto& m : plan.matrices())
    take("basis." + tensor_at(layout, m.offset).name,
         {static_cast<std::int64_t>(m.cols), static_cast<std::int64_t>(plan.rank())},
         out.data() + slices * n + m.q_at);
  return out;
}

std::vector<float> load_workers(const fs::path& file, const state_layout& inner, bool residual, std::size_t fragments,
                                bool delayed, bool checksummed) {
  const std::string origin = file.string();
  const auto loaded = open_tensor_file(file, "the checkpoint holds no logical workers' states (is it of a run with "
                                       "sync.mode = \"every_step\"?)", checksummed);
  const std::string* count_text = loaded.find_metadata("workers");
  const std::string* steps_text = loaded.find_metadata("steps");
  if (count_text == nullptr || steps_text == nullptr)
    throw checkpoint_error(origin + ": metadata has no \"workers\" or \"steps\"");
  std::size_t count = 0;
  std::vector<std::int64_t> steps;
  try {
    count = static_cast<std::size_t>(std::stoull(*count_text));
    for (std::size_t at = 0; at < steps_text->size();) {
      const auto comma = steps_text->find(',', at);
      steps.push_back(std::stoll(steps_text->substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
      at = comma == std::string::npos ? steps_text->size() : comma + 1;
    }
  } catch (const std::exception&) {
    throw checkpoint_error(origin + ": metadata \"workers\" or \"steps\" is not a number");
  }
  if (count == 0 || count > 4096 || steps.size() != count)
    throw checkpoint_error(origin + ": " + std::to_string(steps.size()) + " step counters for " +
                           std::to_string(count) + " workers");
  const worker_state_shape shape = worker_state_shape::of(inner, residual, fragments, delayed);
  const std::size_t per = shape.size();
  std::vector<float> out(count * per, 0.0f);
  std::vector<float> one(inner.total_size());
  const auto take = [&](const std::string& name, const std::vector<std::int64_t>& want, float* to) {
    take_tensor(loaded, origin, name, want, to);
  };
  for (std::size_t k = 0; k < count; ++k) {
    if (steps[k] < 0 || steps[k] > (std::int64_t{1} << 40))
      throw checkpoint_error(origin + ": worker " + std::to_string(k) + "'s step " + std::to_string(steps[k]) +
                             " is out of range");
    std::fill(one.begin(), one.end(), 0.0f);
    for (std::size_t i = inner.parameter_tensors; i < inner.layout.tensors().size(); ++i) {
      const auto& spec = inner.layout.tensors()[i];
      take(worker_tensor(k, spec.name), spec.shape, one.data() + spec.offset);
    }
    write_step_counter(one, inner, steps[k]);
    std::copy(one.begin() + static_cast<std::ptrdiff_t>(inner.parameter_size), one.end(),
              out.begin() + static_cast<std::ptrdiff_t>(k * per));
    for (std::size_t i = 0; residual && i < inner.parameter_tensors; ++i) {
      const auto& spec = inner.layout.tensors()[i];
      take(worker_tensor(k, "residual." + spec.name), spec.shape, out.data() + k * per + shape.residual_at() + spec.offset);
    }
    for (std::size_t i = 0; shape.own_parameters() && i < inner.parameter_tensors; ++i) {
      const auto& spec = inner.layout.tensors()[i];
      take(worker_tensor(k, "inner." + spec.name), spec.shape, out.data() + k * per + shape.parameters_at() + spec.offset);
    }
    for (std::size_t i = 0; delayed && i < inner.parameter_tensors; ++i) {
      const auto& spec = inner.layout.tensors()[i];
      take(worker_tensor(k, "progress." + spec.name), spec.shape, out.data() + k * per + shape.progress_at() + spec.offset);
    }
    if (shape.own_parameters())
      take(worker_tensor(k, "fragment_samples"), {static_cast<std::int64_t>(shape.fragments)},
           out.data() + k * per + shape.samples_at());
  }
  return out;
}

json trainer_json(const trainer_record& r) {
  json j{{"format", "dpactor-checkpoint-2"},
         {"step", r.step},
         {"epoch", r.position.epoch},  // for readers of the file; read back against the ledger's
         {"train_samples", r.train_samples},
         {"data_fingerprint", r.data_fingerprint},
         {"ledger", {{"epoch", r.position.epoch}, {"cursor", r.position.cursor}, {"front", r.position.front}}},
         {"rng", {{"sampler", {{"seed", r.seed}, {"shuffle", r.shuffle}}}}},
         {"config", r.config}};
  // See Note [Exactly-once offsets].
  if (r.position.stream.active)
    j["stream"] = {{"committed_sequence", r.position.stream.committed},
                   {"trained_above", r.position.stream.trained_above}};
  // See Note [Async checkpoints]: the claims, the run's rounds in flight given back.
  if (const async_position& a = r.position.async; a.active) {
    json open = json::array();
    for (const async_epoch_position& e : a.open)
      open.push_back({{"epoch", e.epoch}, {"next", e.next}, {"committed", e.committed}, {"returned", e.returned}});
    j["async"] = {{"epochs_done", a.done}, {"requeued", a.requeued}, {"open", std::move(open)}};
  }
  return j;
}

trainer_record parse_trainer_json(const std::string& text, const std::string& origin) {
  trainer_record r;
  try {
    json doc = json::parse(text);
    const auto format = doc.at("format").get<std::string>();
    if (format != "dpactor-checkpoint-1" && format != "dpactor-checkpoint-2")
      throw checkpoint_error(origin + ": unknown checkpoint format \"" + format + "\"");
    r.checksummed = format == "dpactor-checkpoint-2";
    if (r.checksummed && !doc.contains("crc32"))
      throw checkpoint_error(origin + ": no \"crc32\", which format " + format + " requires: the file was damaged or replaced");
    if (const auto stored = doc.find("crc32"); stored != doc.end()) {
      const std::string expected = stored->get<std::string>();
      doc.erase("crc32");
      if (crc32_hex(doc.dump()) != expected)
        throw checkpoint_error(origin + ": checksum mismatch (stored " + expected + ", contents give " +
                               crc32_hex(doc.dump()) + "): the file was changed or damaged after it was written");
    }
    r.step = json_int(doc.at("step"), "step");
    const std::int64_t epoch = json_int(doc.at("epoch"), "epoch");
    r.train_samples = static_cast<std::uint64_t>(json_int(doc.at("train_samples"), "train_samples"));
    if (const auto fingerprint = doc.find("data_fingerprint"); fingerprint != doc.end())
      r.data_fingerprint = fingerprint->get<std::string>();
    const json& ledger = doc.at("ledger");
    r.position.epoch = json_int(ledger.at("epoch"), "ledger.epoch");
    r.position.cursor = static_cast<std::uint64_t>(json_int(ledger.at("cursor"), "ledger.cursor"));
    for (const auto& i : ledger.at("front")) r.position.front.push_back(static_cast<std::uint32_t>(json_int(i, "ledger.front")));
    // The top-level epoch is the ledger's, written twice: two different ones
    // mean an edited or damaged record.
    if (epoch != r.position.epoch)
      throw checkpoint_error(origin + ": epoch " + std::to_string(epoch) + " disagrees with ledger.epoch " +
                             std::to_string(r.position.epoch));
    if (const auto stream = doc.find("stream"); stream != doc.end()) {
      r.position.stream.active = true;
      r.position.stream.committed = json_int(stream->at("committed_sequence"), "stream.committed_sequence");
      for (const auto& i : stream->at("trained_above"))
        r.position.stream.trained_above.push_back(json_int(i, "stream.trained_above"));
    }
    if (const auto async = doc.find("async"); async != doc.end()) {
      async_position& a = r.position.async;
      a.active = true;
      a.done = json_int(async->at("epochs_done"), "async.epochs_done");
      for (const auto& i : async->at("requeued")) a.requeued.push_back(json_int(i, "async.requeued"));
      for (const auto& e : async->at("open")) {
        async_epoch_position p;
        p.epoch = json_int(e.at("epoch"), "async.open.epoch");
        p.next = json_int(e.at("next"), "async.open.next");
        p.committed = json_int(e.at("committed"), "async.open.committed");
        for (const auto& i : e.at("returned")) p.returned.push_back(json_int(i, "async.open.returned"));
        a.open.push_back(std::move(p));
      }
    }
    const json& sampler = doc.at("rng").at("sampler");
    r.seed = static_cast<std::uint64_t>(json_int(sampler.at("seed"), "rng.sampler.seed"));
    r.shuffle = sampler.at("shuffle").get<bool>();
    r.config = doc.at("config").get<std::string>();
  } catch (const json::exception& e) {
    throw checkpoint_error(origin + ": corrupt trainer record: " + e.what());
  } catch (const std::invalid_argument& e) {
    throw checkpoint_error(origin + ": corrupt trainer record: " + e.what());
  }
  return r;
}

// Copies the tensors of `file` named in layout[first, last) into `state`.
void load_tensors(const safetensors_file& file, const std::string& origin, const state_layout& layout, std::size_t first,
                  std::size_t last, std::span<float> state) {
  for (std::size_t i = first; i < last; ++i) {
    const auto& spec = layout.layout.tensors()[i];
    const loaded_tensor* t = file.find(spec.name);
    if (t == nullptr) throw checkpoint_error(origin + ": tensor \"" + spec.name + "\" is missing");
    auto shape_text = [](const std::vector<std::int64_t>& s) {
      std::string out = "[";
      for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
      return out + "]";
    };
    if (t->shape != spec.shape)
      throw checkpoint_error(origin + ": tensor \"" + spec.name + "\" has shape " + shape_text(t->shape) +
                             ", the model needs " + shape_text(spec.shape));
    if (t->dtype != "F32")
      throw checkpoint_error(origin + ": tensor \"" + spec.name + "\" has dtype " + t->dtype + ", expected F32");
    std::copy(t->values.begin(), t->values.end(), state.begin() + static_cast<std::ptrdiff_t>(spec.offset));
  }
}

}  // namespace

namespace {

// Refuses NaN and infinite values in `values` (laid out by `layout` from
// its first tensor on), naming the tensor and the index: a checkpoint or
// weights file is never written or loaded with them.
void require_finite(std::span<const float> values, const flat_layout& layout, const std::string& what) {
  const auto at = first_nonfinite(values);
  if (!at) return;
  for (const auto& t : layout.tensors())
    if (*at >= t.offset && *at < t.offset + t.numel())
      throw checkpoint_error(what + ": tensor " + t.name + " holds a non-finite value (" +
                             std::to_string(values[*at]) + ") at index " + std::to_string(*at - t.offset));
  throw checkpoint_error(what + ": a non-finite value at element " + std::to_string(*at));
}

// The trainer record's numbers are those a run can reach, and agree with the
// optimizer's step counter: a damaged or hand-edited checkpoint is refused
// before it can train, not after.
void check_ranges(const trainer_record& r, std::int64_t counter, const fs::path& dir) {
  constexpr std::int64_t max_steps = std::int64_t{1} << 40;  // as the config's step counts
  const std::string where = (dir / "trainer.json").string() + ": ";
  if (r.step < 0 || r.step > max_steps)
    throw checkpoint_error(where + "step " + std::to_string(r.step) + " is out of range [0, 2^40]");
  if (r.position.epoch < 0 || r.position.epoch > r.step + 1)
    throw checkpoint_error(where + "epoch " + std::to_string(r.position.epoch) + " is out of range for step " +
                           std::to_string(r.step));
  if (r.position.stream.active) {
    const auto& above = r.position.stream.trained_above;
    if (r.position.stream.committed < -1)
      throw checkpoint_error(where + "stream.committed_sequence " + std::to_string(r.position.stream.committed) +
                             " is out of range");
    for (std::size_t i = 0; i < above.size(); ++i)
      if (above[i] <= r.position.stream.committed || (i > 0 && above[i] <= above[i - 1]))
        throw checkpoint_error(where + "stream.trained_above is not ascending above committed_sequence at " +
                               std::to_string(above[i]));
  } else if (r.train_samples == 0) {
    throw checkpoint_error(where + "train_samples is 0");
  }
  if (r.position.cursor > r.train_samples)
    throw checkpoint_error(where + "ledger cursor " + std::to_string(r.position.cursor) + " is beyond the " +
                           std::to_string(r.train_samples) + " training samples");
  for (const auto i : r.position.front)
    if (i >= r.train_samples)
      throw checkpoint_error(where + "ledger index " + std::to_string(i) + " is beyond the " +
                             std::to_string(r.train_samples) + " training samples");
  if (counter != r.step)
    throw checkpoint_error((dir / "optimizer.safetensors").string() + ": step " + std::to_string(counter) +
                           " disagrees with trainer.json's step " + std::to_string(r.step));
}

std::function<void(std::string_view)>& crash_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}

void crash_point(std::string_view point) {
  if (crash_hook()) crash_hook()(point);
}

}  // namespace

void set_checkpoint_crash_hook(std::function<void(std::string_view)> hook) { crash_hook() = std::move(hook); }

fs::path write_checkpoint(const fs::path& root, const state_layout& layout, std::span<const float> state,
                          const trainer_record& record, worker_states workers, powersgd_states powersgd) {
  // See Note [Non-finite steps]: a diverged state never becomes the newest checkpoint.
  require_finite(state.first(layout.layout.size()), layout.layout,
                 "checkpoint of step " + std::to_string(record.step) + " not written (the newest one on disk stays)");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw checkpoint_error("cannot create checkpoint directory " + root.string() + ": " + ec.message());
  const std::string name = checkpoint_name(record.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / (std::string(checkpoint_tmp_prefix) + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  try {
    fs::create_directory(tmp);
    const std::size_t params = layout.parameter_tensors, all = layout.layout.tensors().size();
    const auto model = tensors_of(layout, state, 0, params);
    string_pairs model_meta{{"format", "pt"}};
    model_meta.emplace_back(tensor_checksum_key, tensor_file_checksum(model, model_meta));
    save_safetensors(tmp / "model.safetensors", model, model_meta);
    crash_point("model written");
    string_pairs opt_meta{{"format", "pt"}, {"step", std::to_string(read_step_counter(state, layout))}};
    std::string slots;
    for (const auto& s : layout.slots) slots += (slots.empty() ? "" : ",") + s;
    opt_meta.emplace_back("slots", slots);
    const auto optimizer = tensors_of(layout, state, params, all);
    opt_meta.emplace_back(tensor_checksum_key, tensor_file_checksum(optimizer, opt_meta));
    save_safetensors(tmp / "optimizer.safetensors", optimizer, opt_meta);
    if (workers.inner != nullptr) {
      if (workers.states.empty() ||
          workers.states.size() % worker_floats(*workers.inner, workers.residual, workers.fragments, workers.delayed) != 0)
        throw checkpoint_error("checkpoint of step " + std::to_string(record.step) + ": " +
                               std::to_string(workers.states.size()) + " floats of logical workers' states");
      if (const auto bad = first_nonfinite(workers.states))
        throw checkpoint_error("checkpoint of step " + std::to_string(record.step) +
                               " not written: a logical worker's state holds a non-finite value at " + std::to_string(*bad) +
                               " (the newest one on disk stays)");
      save_workers(tmp / workers_file, workers);
    }
    if (powersgd.plan != nullptr) {
      const std::size_t n = layout.parameter_size;
      if (powersgd.states.size() < powersgd.plan->q_floats() + n ||
          (powersgd.states.size() - powersgd.plan->q_floats()) % n != 0)
        throw checkpoint_error("checkpoint of step " + std::to_string(record.step) + ": " +
                               std::to_string(powersgd.states.size()) + " floats of PowerSGD's residuals and basis");
      if (const auto bad = first_nonfinite(powersgd.states))
        throw checkpoint_error("checkpoint of step " + std::to_string(record.step) +
                               " not written: a PowerSGD residual holds a non-finite value at " + std::to_string(*bad) +
                               " (the newest one on disk stays)");
      save_powersgd(tmp / powersgd_file, layout, powersgd);
    }
    crash_point("optimizer written");
    if (!record.decisions.empty()) write_file_synced(tmp / "decisions.jsonl", record.decisions);
    json trainer = trainer_json(record);
    trainer["crc32"] = crc32_hex(trainer.dump());
    write_file_synced(tmp / "trainer.json", trainer.dump() + "\n");
    crash_point("trainer written");
    sync_directory(tmp);
    crash_point("directory synced");
    // Read back and compared before it takes a name: a checkpoint that does
    // not verify never becomes `latest`, and nothing older is pruned for it.
    try {
      const loaded_checkpoint back = read_checkpoint(tmp, layout, workers.inner, workers.residual, workers.fragments,
                                                     workers.delayed, powersgd.plan);
      const auto same = [](float x, float y) { return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y); };
      for (const auto& t : layout.layout.tensors())  // the padding between tensors is not saved
        for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i)
          if (!same(back.state[i], state[i]))
            throw checkpoint_error("tensor " + t.name + " reads back differently at index " + std::to_string(i - t.offset));
      if (read_step_counter(back.state, layout) != read_step_counter(state, layout))
        throw checkpoint_error("the step counter reads back differently");
      if (workers.inner != nullptr && !std::equal(back.workers.begin(), back.workers.end(), workers.states.begin(),
                                                  workers.states.end(), same))
        throw checkpoint_error("the logical workers' states read back differently");
      if (powersgd.plan != nullptr && !std::equal(back.powersgd.begin(), back.powersgd.end(), powersgd.states.begin(),
                                                  powersgd.states.end(), same))
        throw checkpoint_error("PowerSGD's residuals and basis read back differently");
    } catch (const checkpoint_error& e) {
      throw checkpoint_error("checkpoint " + final_dir.string() + " not written: it does not read back (" + e.what() +
                             "); the newest one on disk stays");
    }
    // A checkpoint of the same step (a resumed run rewriting it) is swapped
    // with the new one in one step, never deleted first: at every moment the
    // name holds a complete checkpoint, the old or the new.
    bool replaced = false;
    if (fs::exists(final_dir)) {
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
        throw fs::filesystem_error("rename", tmp, final_dir, std::error_code(errno, std::generic_category()));
      replaced = true;
    } else {
      fs::rename(tmp, final_dir);
    }
    crash_point("renamed");
    write_file_synced(root / "latest.tmp", name + "\n");
    crash_point("latest written");
    fs::rename(root / "latest.tmp", root / "latest");
    crash_point("latest renamed");
    sync_directory(root);
    if (replaced) fs::remove_all(tmp, ec);  // now the old checkpoint
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw checkpoint_error("cannot write checkpoint " + final_dir.string() + ": " + e.code().message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir;
}

namespace {

// The checkpoint directory `path` names: itself, or a root's newest.
fs::path checkpoint_dir_of(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw checkpoint_error(path.string() + ": no such checkpoint");
  fs::path dir = path;
  // A root: its newest checkpoint. Every step-* folder holding a trainer.json
  // was verified before it took its name, so the newest one is whole even
  // when a crash came between its rename and `latest`'s.
  std::int64_t newest = -1;
  if (!fs::exists(path / "trainer.json", ec))
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() != std::string_view(checkpoint_prefix).size() + 8 || name.rfind(checkpoint_prefix, 0) != 0 ||
          !std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          !fs::exists(entry.path() / "trainer.json", ec))
        continue;
      newest = std::max<std::int64_t>(newest, std::stoll(name.substr(5)));
    }
  if (newest >= 0) {
    dir = path / checkpoint_name(newest);
  } else if (fs::exists(path / "latest", ec) && !fs::exists(path / "trainer.json", ec)) {
    std::string name = read_file(path / "latest", file_role::checkpoint);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos)
      throw checkpoint_error((path / "latest").string() + ": does not name a checkpoint");
    dir = path / name;
  }
  if (!fs::is_directory(dir, ec)) throw checkpoint_error(dir.string() + ": not a checkpoint directory");
  return dir;
}

}  // namespace

trainer_record read_trainer_record(const fs::path& path) {
  const fs::path dir = checkpoint_dir_of(path);
  return parse_trainer_json(read_file(dir / "trainer.json", file_role::checkpoint), (dir / "trainer.json").string());
}

loaded_checkpoint read_checkpoint(const fs::path& path, const state_layout& layout, const state_layout* inner,
                                  bool residual, std::size_t fragments, bool delayed, const powersgd_plan* powersgd) {
  const fs::path dir = checkpoint_dir_of(path);
  loaded_checkpoint out;
  out.directory = dir;
  out.record = parse_trainer_json(read_file(dir / "trainer.json", file_role::checkpoint), (dir / "trainer.json").string());
  out.state.assign(layout.total_size(), 0.0f);
  const std::size_t params = layout.parameter_tensors, all = layout.layout.tensors().size();
  const auto model = load_safetensors(dir / "model.safetensors");
  verify_tensor_file(model, (dir / "model.safetensors").string(), out.record.checksummed);
  load_tensors(model, (dir / "model.safetensors").string(), layout, 0, params, out.state);
  const auto opt = load_safetensors(dir / "optimizer.safetensors");
  verify_tensor_file(opt, (dir / "optimizer.safetensors").string(), out.record.checksummed);
  load_tensors(opt, (dir / "optimizer.safetensors").string(), layout, params, all, out.state);
  require_finite(std::span<const float>(out.state).first(layout.layout.size()), layout.layout, dir.string());
  const std::string* step = opt.find_metadata("step");
  if (step == nullptr) throw checkpoint_error((dir / "optimizer.safetensors").string() + ": metadata has no \"step\"");
  std::int64_t counter = 0;
  try {
    counter = std::stoll(*step);
  } catch (const std::exception&) {
    throw checkpoint_error((dir / "optimizer.safetensors").string() + ": metadata \"step\" is not a number");
  }
  check_ranges(out.record, counter, dir);
  write_step_counter(out.state, layout, counter);
  if (inner != nullptr)
    out.workers = load_workers(dir / workers_file, *inner, residual, fragments, delayed, out.record.checksummed);
  if (powersgd != nullptr) out.powersgd = load_powersgd(dir / powersgd_file, layout, *powersgd, out.record.checksummed);
  return out;
}

std::vector<float> read_model_weights(const fs::path& file, const state_layout& layout) {
  const auto weights = load_safetensors(file);
  verify_tensor_file(weights, file.string(), false);
  std::vector<float> params(layout.parameter_size, 0.0f);
  load_tensors(weights, file.string(), layout, 0, layout.parameter_tensors, params);
  require_finite(params, layout.layout, file.string());
  return params;
}

}  // namespace dpactor
