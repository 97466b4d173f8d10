// The GPT model of include/maskattn/model/ from Python: the loss and the gradients of a checkpoint
// on one batch, by state_dict name, so that the model can be checked against the identical PyTorch
// model (python/tests/test_gpt.py) and used from Python tools. Training and generation are the
// CLI's (`maskattn gpt`).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "maskattn/error.h"
#include "maskattn/model/gpt.h"
#include "maskattn/model/trainer.h"

namespace maskattn::python {

namespace {

std::vector<int32_t> token_rows(nb::handle values, const char* name, const Dims& shape) {
  const Array<int64_t> ids = int_array(values, name);
  if (ids.rank() != 2 || (!shape.empty() && ids.shape() != shape)) {
    throw Error(std::string("gpt_loss_and_gradients: ") + name + " has shape " +
                shape_string(ids.shape()) + "; expected [B, L]" +
                (shape.empty() ? "" : " = " + shape_string(shape)));
  }
  return {ids.values().begin(), ids.values().end()};
}

}  // namespace

void bind_gpt(nb::module_& m) {
  m.def(
      "gpt_loss_and_gradients",
      [](const std::string& checkpoint, nb::handle tokens, nb::handle targets, int64_t pad,
         nb::handle mask, int threads) {
        const model::LoadedModel loaded = model::load_model(checkpoint);
        const Array<int64_t> shape_probe = int_array(tokens, "tokens");
        const std::vector<int32_t> x = token_rows(tokens, "tokens", {});
        const std::vector<int32_t> y = token_rows(targets, "targets", shape_probe.shape());
        bool causal = loaded.causal;
        if (!mask.is_none()) {
          const std::string name = nb::cast<std::string>(mask);
          if (name != "causal" && name != "none") {
            throw Error("gpt_loss_and_gradients: mask is '" + name + "'; use 'causal' or 'none'");
          }
          causal = name == "causal";
        }
        model::Gpt gpt(loaded.parameters, causal);
        std::vector<float> grads(loaded.parameters.count());
        const model::GptBatch batch{x.data(), y.data(), shape_probe.dim(0), shape_probe.dim(1),
                                    static_cast<int32_t>(pad)};
        model::CrossEntropy loss;
        {
          nb::gil_scoped_release released;
          loss = gpt.loss_and_gradients(loaded.values.data(), batch, grads.data(), threads);
        }
        nb::dict by_name;
        for (const model::NamedTensor& tensor : loaded.parameters.tensors()) {
          std::vector<float> values(grads.begin() + tensor.offset,
                                    grads.begin() + tensor.offset + tensor.size);
          by_name[tensor.name.c_str()] = to_numpy(Array<float>(tensor.shape, std::move(values)));
        }
        return nb::make_tuple(loss.loss, loss.real_rows, by_name);
      },
      nb::arg("checkpoint"), nb::arg("tokens"), nb::arg("targets"), nb::arg("pad") = -1,
      nb::arg("mask") = nb::none(), nb::arg("threads") = 0,
      "(loss, real_rows, grads): the mean cross-entropy of a `maskattn gpt` checkpoint on tokens "
      "[B, L] with targets [B, L] (-1 = ignored), and its gradient per state_dict name (the "
      "tied head's in transformer.wte.weight). pad: a token id whose keys are hidden, or -1; "
      "mask: 'causal', 'none' or None (the mask the checkpoint trained with).");
}

}  // namespace maskattn::python
