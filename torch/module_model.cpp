#include <dpactor/torch_module.hpp>

#include <torch/script.h>
#include <torch/torch.h>

#include "tensors/torch_model.hpp"

#include <mutex>

#include <dpactor/error.hpp>
#include "torch/bound_module.hpp"

namespace dpactor {

torch_model_factory torch_module(std::function<torch::nn::AnyModule()> make) {
  return [make = std::move(make)](const torch_model_options& options) -> std::unique_ptr<torch_model> {
    try {
      auto module = std::make_shared<torch::nn::AnyModule>(make());
      const std::shared_ptr<torch::nn::Module> root = module->ptr();
      module_parts parts;
      parts.name = "the C++ module (run_options::torch_model)";
      for (const auto& p : root->named_parameters(/*recurse=*/true)) parts.parameters.emplace_back(p.key(), p.value());
      for (const auto& b : root->named_buffers(/*recurse=*/true)) parts.buffers.emplace_back(b.key(), b.value());
      parts.forward = [module](const at::Tensor& x) { return module->forward(x); };
      parts.set_training = [root](bool on) { root->train(on); };
      parts.owner = module;
      return std::make_unique<bound_module>(std::move(parts), options);
    } catch (const open_error& e) {
      throw config_error(e.what());
    } catch (const c10::Error& e) {
      throw config_error("the C++ module (run_options::torch_model): " + first_line(e.what_without_backtrace()));
    }
  };
}

namespace {

// Module::clone copies each tensor with Tensor::clone, recorded by autograd:
// a parameter of the copy would be a non-leaf whose gradients flow back to
// the original's. Copied with autograd off, the copy's parameters are
// leaves, and require gradients as the original's do.
torch::jit::Module deep_copy(const torch::jit::Module& module) {
  torch::jit::Module copy;
  {
    const torch::NoGradGuard no_grad;
    copy = module.clone();
  }
  auto from = module.parameters().begin();
  for (at::Tensor p : copy.parameters()) p.requires_grad_((*from++).requires_grad());
  return copy;
}

}  // namespace

torch_model_factory torch_script_module(const torch::jit::Module& module) {
  // A deep copy per call: replicas never share a tensor, and the caller's
  // module keeps its weights. A copy registers a new class type in the
  // module's compilation unit, which is not safe from two threads at once.
  auto copying = std::make_shared<std::mutex>();
  return [module = deep_copy(module), copying](const torch_model_options& options) -> std::unique_ptr<torch_model> {
    const std::string name = "the TorchScript module (run_options::torch_model)";
    try {
      std::shared_ptr<torch::jit::Module> copy;
      {
        const std::lock_guard<std::mutex> lock(*copying);
        copy = std::make_shared<torch::jit::Module>(deep_copy(module));
      }
      return std::make_unique<bound_module>(script_parts(std::move(copy), name), options);
    } catch (const open_error& e) {
      throw config_error(e.what());
    } catch (const c10::Error& e) {
      throw config_error(name + ": " + first_line(e.what_without_backtrace()));
    }
  };
}

}  // namespace dpactor
