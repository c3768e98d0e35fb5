#include "torch/module_model.hpp"

#include "tensors/error.hpp"
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

}  // namespace dpactor
