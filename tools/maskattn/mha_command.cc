// maskattn mha: a multi-head attention layer (weights from a directory of PyTorch-named .npy
// files) over [B, L, E] inputs. The flags are a fixed contract (docs/cli.md).
#include <string>
#include <variant>
#include <vector>

#include "commands.h"
#include "maskattn/error.h"
#include "maskattn/multihead.h"
#include "npy_tensors.h"

namespace maskattn::cli {

namespace {

// A [B, L, E] layer input ([L, E] is one sequence), as f32 [B, L, E] values.
InputTensor load_tokens(const std::string& flag, const std::string& path) {
  InputTensor input = load_input(flag, path);
  if (input.file_rank == 4) {
    throw Error(input.flag + " has shape " + shape_string(input.file_shape) +
                "; mha inputs are [B,L,E] (or [L,E])");
  }
  return input;
}

// --incremental: key padding given as key-starts, key-keep or key-blocked becomes the cache's
// starts (left padding: each row's padding must be a prefix), because a per-key mask cannot
// follow a key count that grows by one each step. The other SPECs apply to every step.
struct IncrementalSpecs {
  MaskSpecs specs;
  std::vector<int64_t> starts;  // empty: no padding
};
IncrementalSpecs incremental_specs(const std::vector<std::string>& masks, int64_t batch,
                                   int64_t length) {
  IncrementalSpecs result;
  std::vector<std::string> others;
  for (const std::string& spec : masks) {
    const std::string kind = spec.substr(0, spec.find(':'));
    if (kind != "key-starts" && kind != "key-keep" && kind != "key-blocked") {
      others.push_back(spec);
      continue;
    }
    if (!result.starts.empty()) {
      throw Error("--mask " + spec + ": --incremental takes one key padding SPEC");
    }
    const Mask parsed = parse_mask_specs({spec}, false).mask;
    const auto& padding = std::get<component::Padding>(parsed.components().front());
    const std::vector<int64_t>& values = padding.values.values();
    if (padding.form == component::Padding::Form::starts) {
      result.starts = values;
    } else {
      if (padding.values.shape() != Dims{batch, length}) {
        throw Error("--mask " + spec + " has shape " + shape_string(padding.values.shape()) +
                    "; expected [B,L] = " + shape_string({batch, length}));
      }
      for (int64_t b = 0; b < batch; ++b) {
        int64_t start = 0;
        while (start < length && values[b * length + start] == 0) ++start;
        for (int64_t t = start; t < length; ++t) {
          if (values[b * length + t] == 0) {
            throw Error("--mask " + spec + ": sequence " + std::to_string(b) +
                        " has padding at position " + std::to_string(t) +
                        " after a real token; --incremental takes left padding only");
          }
        }
        result.starts.push_back(start);
      }
    }
    if (static_cast<int64_t>(result.starts.size()) != batch) {
      throw Error("--mask " + spec + " has " + std::to_string(result.starts.size()) +
                  " sequences but the batch has B=" + std::to_string(batch));
    }
    for (size_t b = 0; b < result.starts.size(); ++b) {
      if (result.starts[b] >= length) {
        throw Error("--mask " + spec + ": sequence " + std::to_string(b) +
                    " is all padding; --incremental needs at least one real token per sequence");
      }
    }
  }
  result.specs = parse_mask_specs(others, false);
  return result;
}

TensorView tokens_view(const InputTensor& x) {
  return TensorView(x.values.data(), {x.shape[0], x.shape[2], x.shape[3]});
}

}  // namespace

int run_mha(const MhaArgs& args) {
  if (args.key.empty() != args.value.empty()) {
    throw Error("--key and --value go together: give both (cross-attention) or neither");
  }
  if (args.incremental && !args.key.empty()) {
    throw Error(
        "--incremental decodes self-attention through a KV cache; it takes no --key/--value");
  }
  const MultiHeadAttention layer =
      MultiHeadAttention::load(args.weights, args.heads, args.kv_heads);
  const InputTensor query = load_tokens("--query", args.query);
  const bool cross = !args.key.empty();
  const InputTensor key = cross ? load_tokens("--key", args.key) : query;
  const InputTensor value = cross ? load_tokens("--value", args.value) : query;
  if (cross) require_same_layout({&query, &key, &value}, "query, key and value");
  const DType dtype = choose_dtype(args.dtype, {&query, &key, &value});
  const MaskSpecs specs = parse_mask_specs(args.masks, false);
  LayerOptions options;
  options.attention = call_options(args.scale, args.threads, args.kernel);
  options.dtype = dtype;

  const int64_t batch = query.shape[0], length = query.shape[2];
  const Dims out_shape = {batch, 1, length, layer.embed_dim()};
  TensorBuffer out(DType::f32, out_shape);
  const MutableTensorView out_view(out.mutable_view().mutable_data(), DType::f32,
                                   {batch, length, layer.embed_dim()});
  if (!args.incremental) {
    layer.forward(tokens_view(query), tokens_view(key), tokens_view(value), out_view, specs.mask,
                  specs.mods, options);
  } else {
    // One query at a time: each step appends its key and value to the cache and attends over
    // everything cached so far (causal, bottom-right), then the outputs are concatenated.
    const IncrementalSpecs steps = incremental_specs(args.masks, batch, length);
    KVCache cache = layer.make_cache(batch, length, dtype);
    if (!steps.starts.empty()) cache.set_starts(steps.starts);
    const int64_t width = query.shape[3], embed = layer.embed_dim();
    for (int64_t t = 0; t < length; ++t) {
      const TensorView step(query.values.data() + t * width, {batch, 1, width},
                            {length * width, width, 1});
      const MutableTensorView step_out(static_cast<float*>(out_view.mutable_data()) + t * embed,
                                       {batch, 1, embed}, {length * embed, embed, 1});
      try {
        layer.forward_cached(step, cache, step_out, steps.specs.mask, steps.specs.mods, options);
      } catch (const Error& error) {
        throw Error(std::string(error.what()) + " (--incremental step " + std::to_string(t) +
                    ": 1 query over " + std::to_string(t + 1) +
                    " cached keys; a --mask file must not depend on the key count)");
      }
    }
  }
  OutputFiles files;
  files.add("--out", args.out,
            result_array(out.to_floats(), file_layout(query, out_shape), query, dtype));
  files.commit();
  return 0;
}

}  // namespace maskattn::cli
