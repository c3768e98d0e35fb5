#pragma once
// A model defined in C++ for an embedding service (public API): a factory of
// torch::nn::Module instances, trained by the libtorch replica with no file
// in between. Link dpactor::torch_modules (find_package(dpactor COMPONENTS
// torch); it links libtorch into the program, unlike the engine's plugin),
// include this header after libtorch's, and pass the factory in
// run_options::torch_model:
//
//   struct NetImpl : torch::nn::Module {
//     NetImpl() : fc1(register_module("fc1", torch::nn::Linear(784, 128))),
//                 fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
//     torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
//     torch::nn::Linear fc1, fc2;
//   };
//   TORCH_MODULE(Net);
//
//   dpactor::run_options o;
//   o.torch_model = dpactor::torch_module([] { return torch::nn::AnyModule(Net()); });
//   config.module.input_shape = {784};
//   dpactor::Engine engine(config, o);
//
// Every replica calls the factory for a module of its own; the weights of the
// first one made are every replica's start (a factory may draw them at
// random). The module's forward takes [N, *model.input_shape] float32 and
// returns [N, classes] scores; its named_parameters() are the checkpoint's
// tensor names, its named_buffers() (BatchNorm's statistics) follow DDP's
// default (docs/torch.md). A factory must make a new module at each call.
//
// A TorchScript module the program has loaded itself (torch::jit::load of a
// stream or of bytes it holds), with torch_script_module(module): every
// replica trains a deep copy, starting from the module's weights, which stay
// as they are.

#include <functional>

#include <dpactor/engine.hpp>  // torch_model_factory

// libtorch's types, declared: this header includes none of libtorch.
namespace torch::nn {
class AnyModule;
}  // namespace torch::nn
namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace dpactor {

torch_model_factory torch_module(std::function<torch::nn::AnyModule()> make);
torch_model_factory torch_script_module(const torch::jit::Module& module);

}  // namespace dpactor
