// predict (include/dpactor/snapshot.hpp): the native MLP's evaluation forward
// over a snapshot's parameters, for a service's predictions.

#include <dpactor/snapshot.hpp>

#include <memory>

#include <dpactor/error.hpp>
#include <dpactor/job_config.hpp>
#include "tensors/mlp.hpp"

namespace dpactor {
namespace {

// Rows per forward call: the workspaces of one thread's model.
constexpr std::size_t predict_rows = 256;

}  // namespace

std::vector<float> predict(const job_config& config, const parameter_snapshot& parameters, std::span<const float> inputs) {
  if (config.module.kind != model_kind::mlp)
    throw config_error("predict: model.kind is not \"mlp\"; a torch model predicts in the host's libtorch, from the "
                       "snapshot's tensors");
  const mlp_spec& spec = config.model;
  const auto in = static_cast<std::size_t>(spec.inputs()), out = static_cast<std::size_t>(spec.outputs());
  if (inputs.size() % in != 0)
    throw error(error_kind::invalid_argument, "predict: " + std::to_string(inputs.size()) +
                                                  " values are not whole rows of model.inputs() = " + std::to_string(in));
  if (!(parameters.layout == mlp_layout(spec)) || parameters.values.size() != parameters.layout.size())
    throw error(error_kind::invalid_argument, "predict: the parameters are not laid out for model.layers");
  // One model (its workspaces) per thread and shape: predictions run on
  // whichever threads a service serves on.
  thread_local std::unique_ptr<mlp> model;
  if (!model || model->spec().sizes != spec.sizes || model->spec().hidden_activation != spec.hidden_activation ||
      model->spec().loss != spec.loss)
    model = std::make_unique<mlp>(spec, predict_rows);
  const std::size_t rows = inputs.size() / in;
  std::vector<float> scores(rows * out);
  for (std::size_t r = 0; r < rows; r += predict_rows) {
    const std::size_t n = std::min(predict_rows, rows - r);
    model->predict(parameters.values.data(), inputs.data() + r * in, n, scores.data() + r * out);
  }
  return scores;
}

}  // namespace dpactor
