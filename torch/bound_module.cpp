// Note [Binding a module to flat buffers]
// Each parameter tensor is re-pointed (Tensor::set_) at its slice of the
// replica's current state buffer, and its .grad is a view of the slice of
// the gradient buffer the call writes, so forward reads dpactor's parameters
// and backward accumulates into dpactor's gradients in place: bitwise what
// the module computes on its own tensors, at no step cost (re-pointing six
// tensors takes ~2 us, done only when a buffer changes: the pending state
// swaps in after each step). Pitfalls, each checked:
// set_ needs NoGradGuard; an undefined .grad would be replaced by a tensor
// outside the buffer, so the views are never reset and the buffer is zeroed
// here, never by torch's zero_grad; the buffers never move while bound; a
// module is loaded once per replica, never cloned (a deep copy memoises by
// storage and would put every parameter on the first).

#include "torch/bound_module.hpp"
#include <dpactor/error.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace dpactor {
namespace {

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

at::Tensor label_tensor(const std::int32_t* labels, std::size_t n) {
  return torch::from_blob(const_cast<std::int32_t*>(labels), {static_cast<std::int64_t>(n)}, at::kInt).to(at::kLong);
}

std::int64_t correct(const at::Tensor& out, const at::Tensor& target) {
  return out.detach().argmax(1).eq(target).sum().item<std::int64_t>();
}

}  // namespace

std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

bound_module::bound_module(module_parts parts, const torch_model_options& options)
    : parts_(std::move(parts)), options_(options) {
  describe();
}

void bound_module::initial_parameters(std::span<float> out) const {
  std::fill(out.begin(), out.end(), 0.0f);
  std::copy(initial_.begin(), initial_.end(), out.begin());
}

batch_stats bound_module::forward_backward(const float* params, float* grads, const float* x,
                                           const std::int32_t* labels, std::size_t n, bool overwrite,
                                           layer_done_callback on_layer_done) {
  try {
    return train_step(params, grads, x, labels, n, overwrite, on_layer_done);
  } catch (const c10::Error& e) {
    throw error(error_kind::internal, parts_.name + ": " + first_line(e.what_without_backtrace()));
  }
}

batch_stats bound_module::evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) {
  try {
    return evaluation(params, x, labels, n);
  } catch (const c10::Error& e) {
    throw error(error_kind::internal, parts_.name + ": " + first_line(e.what_without_backtrace()));
  }
}

// Checks the module against the data and lays its parameters out.
void bound_module::describe() {
  const std::string& name = parts_.name;
  for (const auto& [pname, value] : parts_.parameters) {
    if (value.scalar_type() != at::kFloat)
      throw open_error(name + ": parameter " + pname + " is " + std::string(c10::toString(value.scalar_type())) +
                       "; dpactor trains float32 parameters only (model.float() before saving)");
    if (!value.requires_grad())
      throw open_error(name + ": parameter " + pname + " is frozen (requires_grad = False); dpactor trains every "
                       "parameter of the module");
    params_.push_back(value);
    layout_.add(pname, std::vector<std::int64_t>(value.sizes().begin(), value.sizes().end()));
  }
  if (params_.empty()) throw open_error(name + ": the module has no parameter to train");
  // See Note [Module buffers]: after the parameters, in the same layout.
  buffer_begin_ = layout_.size();
  for (const auto& [bname, value] : parts_.buffers) {
    if (value.scalar_type() != at::kFloat && value.scalar_type() != at::kLong)
      throw open_error(name + ": buffer " + bname + " is " + std::string(c10::toString(value.scalar_type())) +
                       "; dpactor keeps float32 buffers and int64 counters only");
    buffers_.push_back(value);
    layout_.add(bname, std::vector<std::int64_t>(value.sizes().begin(), value.sizes().end()));
  }
  initial_.assign(layout_.size(), 0.0f);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor c = params_[i].detach().contiguous();
    std::memcpy(initial_.data() + layout_.tensors()[i].offset, c.data_ptr<float>(), c.numel() * sizeof(float));
  }
  store_buffers(initial_.data());

  std::int64_t features = 1;
  for (const auto d : options_.input_shape) features *= d;
  if (options_.input_shape.empty()) features = static_cast<std::int64_t>(options_.features);
  if (options_.features != 0 && features != static_cast<std::int64_t>(options_.features))
    throw open_error("model.input_shape = " + shape_text(options_.input_shape) + " is " + std::to_string(features) +
                     " values per sample, but the data has " + std::to_string(options_.features) +
                     " features (" + name + ")");
  features_ = static_cast<std::size_t>(features);
  shape_ = {1};
  if (options_.input_shape.empty()) shape_.push_back(features);
  else shape_.insert(shape_.end(), options_.input_shape.begin(), options_.input_shape.end());

  torch::NoGradGuard no_grad;
  at::Tensor out;
  try {
    parts_.set_training(false);
    out = parts_.forward(torch::zeros(shape_));
  } catch (const c10::Error& e) {
    throw open_error(name + ": forward of one sample shaped " + shape_text(shape_) +
                     " (a batch of 1, model.input_shape) failed: " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw open_error(name + ": forward of one sample shaped " + shape_text(shape_) + " failed: " + e.what());
  }
  if (out.dim() != 2 || out.size(0) != 1)
    throw open_error(name + ": forward must return one row of class scores per sample, shaped [N, classes]; for "
                     "a batch of 1 it returned " + shape_text(out.sizes()));
  if (out.scalar_type() != at::kFloat)
    throw open_error(name + ": forward returns " + std::string(c10::toString(out.scalar_type())) +
                     "; dpactor needs float32 scores");
  classes_ = static_cast<std::size_t>(out.size(1));
  if (options_.loss == loss_kind::cross_entropy && classes_ < 2)
    throw open_error(name + ": forward returns " + std::to_string(classes_) +
                     " score per sample; cross_entropy needs at least 2 classes");
  training_ = false;
}

module_parts script_parts(std::shared_ptr<torch::jit::Module> module, std::string name) {
  module_parts parts;
  parts.name = std::move(name);
  for (const auto& p : module->named_parameters(/*recurse=*/true)) parts.parameters.emplace_back(p.name, p.value);
  for (const auto& b : module->named_buffers(/*recurse=*/true)) parts.buffers.emplace_back(b.name, b.value);
  parts.forward = [module](const at::Tensor& x) { return module->forward({x}).toTensor(); };
  parts.set_training = [module](bool on) { module->train(on); };
  parts.owner = module;
  return parts;
}

batch_stats bound_module::train_step(const float* params, float* grads, const float* x, const std::int32_t* labels,
                       std::size_t n, bool overwrite, layer_done_callback on_layer_done) {
  use_threads();
  bind(params, grads);
  if (overwrite) {
    std::fill_n(grads, layout_.size(), 0.0f);
    load_buffers(params);  // the step starts from the state's buffers
  }
  if (n == 0) {
    store_buffers(grads);
    return {};
  }
  set_training(true);
  const at::Tensor out = forward(x, n);
  const at::Tensor target = label_tensor(labels, n);
  const at::Tensor loss = loss_of(out, target);
  loss.backward();
  store_buffers(grads);
  batch_stats stats;
  stats.loss_sum = loss.item<double>();
  stats.correct = correct(out, target);
  stats.samples = static_cast<std::int64_t>(n);
  // Autograd finishes the gradients in an order of its own: all are final
  // only now (See Note [Gradient buckets]).
  if (on_layer_done.call != nullptr) on_layer_done.call(on_layer_done.context, 0);
  return stats;
}

batch_stats bound_module::evaluation(const float* params, const float* x, const std::int32_t* labels, std::size_t n) {
  use_threads();
  bind(params, bound_grads_);
  if (n == 0) return {};
  load_buffers(params);
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

// Intra-op threads are per calling thread (at::set_num_threads).
void bound_module::use_threads() {
  thread_local int threads = 0;
  if (threads == options_.threads) return;
  at::init_num_threads();
  at::set_num_threads(options_.threads);
  threads = options_.threads;
}

// See Note [Binding a module to flat buffers].
void bound_module::bind(const float* params, float* grads) {
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

void bound_module::load_buffers(const float* state) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const auto& t = layout_.tensors()[params_.size() + i];
    buffers_[i].copy_(torch::from_blob(const_cast<float*>(state + t.offset), t.shape));
  }
}

void bound_module::store_buffers(float* grads) const {
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const auto& t = layout_.tensors()[params_.size() + i];
    torch::from_blob(grads + t.offset, t.shape).copy_(buffers_[i].detach());
  }
}

void bound_module::set_training(bool on) {
  if (training_ == on) return;
  parts_.set_training(on);
  training_ = on;
}

at::Tensor bound_module::forward(const float* x, std::size_t n) {
  shape_[0] = static_cast<std::int64_t>(n);
  const at::Tensor in = torch::from_blob(const_cast<float*>(x), shape_);
  at::Tensor out = parts_.forward(in);
  if (out.dim() != 2 || out.size(0) != static_cast<std::int64_t>(n) || out.size(1) != static_cast<std::int64_t>(classes_))
    throw error(error_kind::internal, parts_.name + ": forward of a batch of " + std::to_string(n) + " returned " +
                             shape_text(out.sizes()) + ", not [" + std::to_string(n) + ", " +
                             std::to_string(classes_) + "]");
  return out;
}

// Per-sample losses summed, as dpactor's losses (tensors/loss.hpp): the
// optimizer divides by the global batch.
at::Tensor bound_module::loss_of(const at::Tensor& out, const at::Tensor& target) const {
  if (options_.loss == loss_kind::cross_entropy)
    return at::cross_entropy_loss(out, target, {}, at::Reduction::Sum);
  const at::Tensor one_hot = at::one_hot(target, static_cast<std::int64_t>(classes_)).to(at::kFloat);
  return (out - one_hot).pow(2).sum() / static_cast<double>(classes_);
}

}  // namespace dpactor
