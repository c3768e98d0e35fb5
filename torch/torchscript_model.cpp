// The libtorch plugin (See Note [The libtorch plugin], tensors/torch_model.hpp):
// a TorchScript module whose parameters and gradients are views of dpactor's
// flat buffers. The only file with torch headers; it exports one function.
//
// Note [Binding a module to flat buffers]
// Each parameter tensor is re-pointed (Tensor::set_) at its slice of the
// replica's current state buffer, and its .grad is a view of the slice of
// the gradient buffer the call writes, so forward reads dpactor's parameters
// and backward accumulates into dpactor's gradients in place: bitwise what
// the module computes on its own tensors, at no step cost (re-pointing six
// tensors takes ~2 us, done only when a buffer changes: the pending state
// swaps in after each step). Pitfalls, each checked (notes/libtorch.md):
// set_ needs NoGradGuard; an undefined .grad would be replaced by a tensor
// outside the buffer, so the views are never reset and the buffer is zeroed
// here, never by torch's zero_grad; the buffers never move while bound; a
// module is loaded once per replica, never cloned (a deep copy memoises by
// storage and would put every parameter on the first).

#include <torch/script.h>
#include <torch/version.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tensors/torch_model.hpp"

namespace dpactor {
namespace {

// The first line of a libtorch error (its messages carry C++ stack traces).
std::string first_line(const std::string& what) {
  const auto end = what.find('\n');
  return what.substr(0, end);
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct open_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class torchscript_model final : public torch_model {
 public:
  explicit torchscript_model(const torch_model_options& options) : options_(options) {
    load();
    describe();
  }

  std::size_t inputs() const noexcept override { return features_; }
  std::size_t outputs() const noexcept override { return classes_; }
  std::size_t max_batch() const noexcept override { return options_.max_batch; }
  const flat_layout& layout() const noexcept override { return layout_; }

  void initial_parameters(std::span<float> out) const override {
    std::fill(out.begin(), out.end(), 0.0f);
    std::copy(initial_.begin(), initial_.end(), out.begin());
  }

  // libtorch's errors leave as std::runtime_error: no torch type crosses
  // the plugin's boundary (See Note [The libtorch plugin]).
  batch_stats forward_backward(const float* params, float* grads, const float* x, const std::int32_t* labels,
                               std::size_t n, bool overwrite, layer_done_callback on_layer_done) override {
    try {
      return train_step(params, grads, x, labels, n, overwrite, on_layer_done);
    } catch (const c10::Error& e) {
      throw std::runtime_error(options_.path + ": " + first_line(e.what_without_backtrace()));
    }
  }

  batch_stats evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) override {
    try {
      return evaluation(params, x, labels, n);
    } catch (const c10::Error& e) {
      throw std::runtime_error(options_.path + ": " + first_line(e.what_without_backtrace()));
    }
  }

 private:
  batch_stats train_step(const float* params, float* grads, const float* x, const std::int32_t* labels,
                         std::size_t n, bool overwrite, layer_done_callback on_layer_done) {
    use_threads();
    bind(params, grads);
    if (overwrite) std::fill_n(grads, layout_.size(), 0.0f);
    if (n == 0) return {};
    set_training(true);
    const at::Tensor out = forward(x, n);
    const at::Tensor target = label_tensor(labels, n);
    const at::Tensor loss = loss_of(out, target);
    loss.backward();
    batch_stats stats;
    stats.loss_sum = loss.item<double>();
    stats.correct = correct(out, target);
    stats.samples = static_cast<std::int64_t>(n);
    // Autograd finishes the gradients in an order of its own: all are final
    // only now (See Note [Gradient buckets]).
    if (on_layer_done.call != nullptr) on_layer_done.call(on_layer_done.context, 0);
    return stats;
  }

  batch_stats evaluation(const float* params, const float* x, const std::int32_t* labels, std::size_t n) {
    use_threads();
    bind(params, bound_grads_);
    if (n == 0) return {};
    torch::NoGradGuard no_grad;
    set_training(false);
    const at::Tensor out = forward(x, n);
    const at::Tensor target = label_tensor(labels, n);
    batch_stats stats;
    stats.loss_sum = loss_of(out, target).item<double>();
    stats.correct = correct(out, target);
    stats.samples = static_cast<std::int64_t>(n);
    return stats;
  }

  void load() {
    const std::string& path = options_.path;
    std::ifstream file(path, std::ios::binary);
    if (!file) throw open_error("model.path = " + path + ": cannot open the file: " + std::strerror(errno));
    char magic[4] = {};
    file.read(magic, 4);
    if (file.gcount() < 4 || std::memcmp(magic, "PK\x03\x04", 4) != 0)
      throw open_error(path + " is not a TorchScript file (not a zip archive; torch.jit.script(model).save(path) "
                       "writes one)");
    try {
      module_ = torch::jit::load(path);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      // "Attempted to read a PyTorch file with version 11, but the maximum
      // supported version for reading is 10."
      static const std::regex newer(R"(file with version (\d+), but the maximum supported version for reading is (\d+))");
      std::smatch m;
      if (std::regex_search(what, m, newer))
        throw open_error(path + " was saved by a newer PyTorch (file format version " + m[1].str() +
                         ") than this libtorch " + TORCH_VERSION + " reads (up to version " + m[2].str() +
                         "): export it with PyTorch " + TORCH_VERSION + " (Debian's python3-torch)");
      throw open_error(path + " is not a TorchScript module (torch.jit.script(model).save(path) writes one; a "
                       "torch.save'd state_dict or pickled model is not): " + first_line(what));
    }
  }

  // Checks the module against the data and lays its parameters out.
  void describe() {
    const std::string& path = options_.path;
    for (const auto& b : module_.named_buffers(/*recurse=*/true))
      throw open_error(path + ": the module has buffers (" + b.name +
                       ", e.g. BatchNorm's running statistics), which this version of dpactor does not train yet");
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.scalar_type() != at::kFloat)
        throw open_error(path + ": parameter " + p.name + " is " + std::string(c10::toString(p.value.scalar_type())) +
                         "; dpactor trains float32 parameters only (model.float() before saving)");
      if (!p.value.requires_grad())
        throw open_error(path + ": parameter " + p.name + " is frozen (requires_grad = False); dpactor trains every "
                         "parameter of the module");
      params_.push_back(p.value);
      layout_.add(p.name, std::vector<std::int64_t>(p.value.sizes().begin(), p.value.sizes().end()));
    }
    if (params_.empty()) throw open_error(path + ": the module has no parameter to train");
    initial_.assign(layout_.size(), 0.0f);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor c = params_[i].detach().contiguous();
      std::memcpy(initial_.data() + layout_.tensors()[i].offset, c.data_ptr<float>(), c.numel() * sizeof(float));
    }

    std::int64_t features = 1;
    for (const auto d : options_.input_shape) features *= d;
    if (options_.input_shape.empty()) features = static_cast<std::int64_t>(options_.features);
    if (options_.features != 0 && features != static_cast<std::int64_t>(options_.features))
      throw open_error("model.input_shape = " + shape_text(options_.input_shape) + " is " + std::to_string(features) +
                       " values per sample, but the data has " + std::to_string(options_.features) +
                       " features (" + path + ")");
    features_ = static_cast<std::size_t>(features);
    shape_ = {1};
    if (options_.input_shape.empty()) shape_.push_back(features);
    else shape_.insert(shape_.end(), options_.input_shape.begin(), options_.input_shape.end());

    torch::NoGradGuard no_grad;
    at::Tensor out;
    try {
      module_.eval();
      out = module_.forward({torch::zeros(shape_)}).toTensor();
    } catch (const c10::Error& e) {
      throw open_error(path + ": forward of one sample shaped " + shape_text(shape_) +
                       " (a batch of 1, model.input_shape) failed: " + first_line(e.what_without_backtrace()));
    } catch (const std::exception& e) {
      throw open_error(path + ": forward of one sample shaped " + shape_text(shape_) + " failed: " + e.what());
    }
    if (out.dim() != 2 || out.size(0) != 1)
      throw open_error(path + ": forward must return one row of class scores per sample, shaped [N, classes]; for "
                       "a batch of 1 it returned " + shape_text(out.sizes()));
    if (out.scalar_type() != at::kFloat)
      throw open_error(path + ": forward returns " + std::string(c10::toString(out.scalar_type())) +
                       "; dpactor needs float32 scores");
    classes_ = static_cast<std::size_t>(out.size(1));
    if (options_.loss == loss_kind::cross_entropy && classes_ < 2)
      throw open_error(path + ": forward returns " + std::to_string(classes_) +
                       " score per sample; cross_entropy needs at least 2 classes");
    training_ = false;
  }

  // Intra-op threads are per calling thread (at::set_num_threads).
  void use_threads() {
    thread_local int threads = 0;
    if (threads == options_.threads) return;
    at::init_num_threads();
    at::set_num_threads(options_.threads);
    threads = options_.threads;
  }

  // See Note [Binding a module to flat buffers].
  void bind(const float* params, float* grads) {
    torch::NoGradGuard no_grad;
    if (params != bound_params_) {
      const at::Tensor whole = torch::from_blob(const_cast<float*>(params), {static_cast<std::int64_t>(layout_.size())});
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const auto& t = layout_.tensors()[i];
        params_[i].set_(whole.storage(), static_cast<std::int64_t>(t.offset), t.shape, contiguous_strides(t.shape));
      }
      bound_params_ = params;
    }
    if (grads != bound_grads_ && grads != nullptr) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const auto& t = layout_.tensors()[i];
        params_[i].mutable_grad() = torch::from_blob(grads + t.offset, t.shape);
      }
      bound_grads_ = grads;
    }
  }

  static std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> strides(shape.size(), 1);
    for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
    return strides;
  }

  void set_training(bool on) {
    if (training_ == on) return;
    module_.train(on);
    training_ = on;
  }

  at::Tensor forward(const float* x, std::size_t n) {
    shape_[0] = static_cast<std::int64_t>(n);
    const at::Tensor in = torch::from_blob(const_cast<float*>(x), shape_);
    at::Tensor out = module_.forward({in}).toTensor();
    if (out.dim() != 2 || out.size(0) != static_cast<std::int64_t>(n) || out.size(1) != static_cast<std::int64_t>(classes_))
      throw std::runtime_error(options_.path + ": forward of a batch of " + std::to_string(n) + " returned " +
                               shape_text(out.sizes()) + ", not [" + std::to_string(n) + ", " +
                               std::to_string(classes_) + "]");
    return out;
  }

  static at::Tensor label_tensor(const std::int32_t* labels, std::size_t n) {
    return torch::from_blob(const_cast<std::int32_t*>(labels), {static_cast<std::int64_t>(n)}, at::kInt).to(at::kLong);
  }

  // Per-sample losses summed, as dpactor's losses (tensors/loss.hpp): the
  // optimizer divides by the global batch.
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& target) const {
    if (options_.loss == loss_kind::cross_entropy)
      return at::cross_entropy_loss(out, target, {}, at::Reduction::Sum);
    const at::Tensor one_hot = at::one_hot(target, static_cast<std::int64_t>(classes_)).to(at::kFloat);
    return (out - one_hot).pow(2).sum() / static_cast<double>(classes_);
  }

  static std::int64_t correct(const at::Tensor& out, const at::Tensor& target) {
    return out.detach().argmax(1).eq(target).sum().item<std::int64_t>();
  }

  torch_model_options options_;
  torch::jit::Module module_;
  std::vector<at::Tensor> params_;  // the module's trainable parameters, layout order
  flat_layout layout_;
  std::vector<float> initial_;
  std::size_t features_ = 0, classes_ = 0;
  std::vector<std::int64_t> shape_;  // [n, input_shape...]
  const float* bound_params_ = nullptr;
  float* bound_grads_ = nullptr;
  bool training_ = true;
};

}  // namespace
}  // namespace dpactor

extern "C" __attribute__((visibility("default"))) dpactor::torch_model* dpactor_torch_open_v1(
    const dpactor::torch_model_options* options, char* error, std::size_t error_size) {
  auto fail = [&](const std::string& what) -> dpactor::torch_model* {
    if (error_size > 0) {
      const std::size_t n = std::min(what.size(), error_size - 1);
      std::memcpy(error, what.data(), n);
      error[n] = '\0';
    }
    return nullptr;
  };
  static std::once_flag interop;
  try {
    // One inter-op thread: dpactor runs one replica per core.
    std::call_once(interop, [] { at::set_num_interop_threads(1); });
    return new dpactor::torchscript_model(*options);
  } catch (const dpactor::open_error& e) {
    return fail(e.what());
  } catch (const c10::Error& e) {
    return fail(options->path + ": " + dpactor::first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return fail(options->path + ": " + e.what());
  }
}
