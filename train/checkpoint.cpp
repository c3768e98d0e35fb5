#include "train/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tensors/error.hpp"
#include "tensors/file_io.hpp"
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

json trainer_json(const trainer_record& r) {
  return {{"format", "dpactor-checkpoint-1"},
          {"step", r.step},
          {"epoch", r.epoch},
          {"train_samples", r.train_samples},
          {"ledger", {{"epoch", r.position.epoch}, {"cursor", r.position.cursor}, {"front", r.position.front}}},
          {"rng", {{"sampler", {{"seed", r.seed}, {"shuffle", r.shuffle}}}}},
          {"config", r.config}};
}

trainer_record parse_trainer_json(const std::string& text, const std::string& origin) {
  trainer_record r;
  try {
    const json doc = json::parse(text);
    const auto format = doc.at("format").get<std::string>();
    if (format != "dpactor-checkpoint-1")
      throw checkpoint_error(origin + ": unknown checkpoint format \"" + format + "\"");
    r.step = json_int(doc.at("step"), "step");
    r.epoch = json_int(doc.at("epoch"), "epoch");
    r.train_samples = static_cast<std::uint64_t>(json_int(doc.at("train_samples"), "train_samples"));
    const json& ledger = doc.at("ledger");
    r.position.epoch = json_int(ledger.at("epoch"), "ledger.epoch");
    r.position.cursor = static_cast<std::uint64_t>(json_int(ledger.at("cursor"), "ledger.cursor"));
    for (const auto& i : ledger.at("front")) r.position.front.push_back(static_cast<std::uint32_t>(json_int(i, "ledger.front")));
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

void prune(const fs::path& root, std::int64_t keep, const fs::path& newest) {
  if (keep <= 0) return;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory() && entry.path().filename().string().rfind(checkpoint_prefix, 0) == 0) found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  const auto excess = static_cast<std::int64_t>(found.size()) - keep;
  for (std::int64_t i = 0; i < excess; ++i) {
    if (found[static_cast<std::size_t>(i)] == newest) continue;
    std::error_code ec;
    fs::remove_all(found[static_cast<std::size_t>(i)], ec);
  }
}

}  // namespace

fs::path write_checkpoint(const fs::path& root, const state_layout& layout, std::span<const float> state,
                          const trainer_record& record, std::int64_t keep) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw checkpoint_error("cannot create checkpoint directory " + root.string() + ": " + ec.message());
  const std::string name = checkpoint_name(record.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / (".tmp-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  try {
    fs::create_directory(tmp);
    const std::size_t params = layout.parameter_tensors, all = layout.layout.tensors().size();
    save_safetensors(tmp / "model.safetensors", tensors_of(layout, state, 0, params), {{"format", "pt"}});
    string_pairs opt_meta{{"format", "pt"}, {"step", std::to_string(read_step_counter(state, layout))}};
    std::string slots;
    for (const auto& s : layout.slots) slots += (slots.empty() ? "" : ",") + s;
    opt_meta.emplace_back("slots", slots);
    save_safetensors(tmp / "optimizer.safetensors", tensors_of(layout, state, params, all), opt_meta);
    write_file_synced(tmp / "trainer.json", trainer_json(record).dump() + "\n");
    sync_directory(tmp);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    write_file_synced(root / "latest.tmp", name + "\n");
    fs::rename(root / "latest.tmp", root / "latest");
    sync_directory(root);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw checkpoint_error("cannot write checkpoint " + final_dir.string() + ": " + e.code().message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  prune(root, keep, final_dir);
  return final_dir;
}

loaded_checkpoint read_checkpoint(const fs::path& path, const state_layout& layout) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw checkpoint_error(path.string() + ": no such checkpoint");
  fs::path dir = path;
  if (fs::exists(path / "latest", ec) && !fs::exists(path / "trainer.json", ec)) {
    std::string name = read_file(path / "latest", file_role::checkpoint);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos)
      throw checkpoint_error((path / "latest").string() + ": does not name a checkpoint");
    dir = path / name;
  }
  if (!fs::is_directory(dir, ec)) throw checkpoint_error(dir.string() + ": not a checkpoint directory");
  loaded_checkpoint out;
  out.directory = dir;
  out.record = parse_trainer_json(read_file(dir / "trainer.json", file_role::checkpoint), (dir / "trainer.json").string());
  out.state.assign(layout.total_size(), 0.0f);
  const std::size_t params = layout.parameter_tensors, all = layout.layout.tensors().size();
  const auto model = load_safetensors(dir / "model.safetensors");
  load_tensors(model, (dir / "model.safetensors").string(), layout, 0, params, out.state);
  const auto opt = load_safetensors(dir / "optimizer.safetensors");
  load_tensors(opt, (dir / "optimizer.safetensors").string(), layout, params, all, out.state);
  const std::string* step = opt.find_metadata("step");
  if (step == nullptr) throw checkpoint_error((dir / "optimizer.safetensors").string() + ": metadata has no \"step\"");
  try {
    write_step_counter(out.state, layout, std::stoll(*step));
  } catch (const std::exception&) {
    throw checkpoint_error((dir / "optimizer.safetensors").string() + ": metadata \"step\" is not a number");
  }
  return out;
}

std::vector<float> read_model_weights(const fs::path& file, const state_layout& layout) {
  const auto weights = load_safetensors(file);
  std::vector<float> params(layout.parameter_size, 0.0f);
  load_tensors(weights, file.string(), layout, 0, layout.parameter_tensors, params);
  return params;
}

}  // namespace dpactor
