// maskattn mha: a multi-head attention layer (weights from a directory of PyTorch-named .npy
// files) over [B, L, E] inputs. The flags are a fixed contract (docs/cli.md).
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"
#include "maskattn/multihead.h"
#include "npy_tensors.h"
#include "output_files.h"

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

// Which of the `length` tokens of each sequence a padding component marks real: keep [B·L].
std::vector<int64_t> keep_matrix(const component::Padding& padding, const std::string& spec,
                                 int64_t batch, int64_t length) {
  using Form = component::Padding::Form;
  const std::vector<int64_t>& values = padding.values.values();
  const bool per_sequence = padding.form == Form::lengths || padding.form == Form::starts;
  const Dims expected = per_sequence ? Dims{batch} : Dims{batch, length};
  if (padding.values.shape() != expected) {
    throw Error("--mask " + spec + " has shape " + shape_string(padding.values.shape()) +
                "; expected " + (per_sequence ? "[B] = " : "[B,L] = ") + shape_string(expected));
  }
  std::vector<int64_t> keep(batch * length);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t) {
      const int64_t n = b * length + t;
      switch (padding.form) {
        case Form::lengths:
          keep[n] = t < values[b];
          break;
        case Form::starts:
          keep[n] = t >= values[b];
          break;
        case Form::keep:
          keep[n] = values[n] != 0;
          break;
        case Form::token_ids:
          keep[n] = values[n] != padding.pad_id;
          break;
      }
    }
  }
  return keep;
}

// --incremental: a program sees the row indices of the call it is evaluated in, and each step is
// a call of its own with one query: q would be 0 at every step, not the token's position. So
// programs are refused there rather than silently evaluated at the wrong positions.
void refuse_programs(const std::vector<std::string>& masks, const std::vector<std::string>& mods) {
  for (const auto& [flag, specs] : {std::pair{"--mask ", &masks}, {"--mod ", &mods}}) {
    for (const std::string& spec : *specs) {
      if (spec.rfind("expr:", 0) != 0) continue;
      throw Error(flag + spec +
                  ": --incremental runs one call per step, where a program's q and kv are the "
                  "step's row indices (q is always 0), not the tokens' positions; run without "
                  "--incremental, or use structured SPECs (causal, window, alibi, …)");
    }
  }
}

// --incremental: each step has one query and one more key, so the padding SPECs, which are
// sized by the whole sequence, are taken apart. Key padding becomes the cache's starts (left
// padding: each row's padding must be a prefix, as in batched generation); query padding becomes
// each step's own query_keep column. The other SPECs apply to every step as they are.
struct IncrementalSpecs {
  MaskSpecs specs;
  std::vector<int64_t> starts;      // [B]; empty: no key padding
  std::vector<int64_t> query_keep;  // [B·L]; empty: no query padding
};
IncrementalSpecs incremental_specs(const std::vector<std::string>& masks,
                                   const std::vector<std::string>& mods, int64_t batch,
                                   int64_t length) {
  refuse_programs(masks, mods);
  IncrementalSpecs result;
  static const std::set<std::string> kPaddingKinds = {"key-lengths",  "key-starts", "key-keep",
                                                      "key-blocked",  "pad-id",     "query-lengths",
                                                      "query-starts", "query-keep", "query-pad-id"};
  std::vector<std::string> others;
  for (const std::string& spec : masks) {
    if (kPaddingKinds.count(spec.substr(0, spec.find(':'))) == 0) {
      others.push_back(spec);
      continue;
    }
    const Mask parsed = parse_mask_specs({spec}, {}, false).mask;
    const auto& padding = std::get<component::Padding>(parsed.components().front());
    const std::vector<int64_t> keep = keep_matrix(padding, spec, batch, length);
    if (padding.side == Side::query) {
      if (!result.query_keep.empty()) {
        throw Error("--mask " + spec + ": --incremental takes one query padding SPEC");
      }
      result.query_keep = keep;
      continue;
    }
    if (!result.starts.empty()) {
      throw Error("--mask " + spec + ": --incremental takes one key padding SPEC");
    }
    for (int64_t b = 0; b < batch; ++b) {
      int64_t start = 0;
      while (start < length && keep[b * length + start] == 0) ++start;
      if (start == length) {
        throw Error("--mask " + spec + ": sequence " + std::to_string(b) +
                    " is all padding; --incremental needs at least one real token per sequence");
      }
      for (int64_t t = start; t < length; ++t) {
        if (keep[b * length + t] == 0) {
          throw Error("--mask " + spec + ": sequence " + std::to_string(b) +
                      " has padding at position " + std::to_string(t) +
                      " after a real token; --incremental takes left padding only");
        }
      }
      result.starts.push_back(start);
    }
  }
  result.specs = parse_mask_specs(others, mods, false);
  return result;
}

// A layer input as the f32 [B, L, E] tokens the layer takes (in place for float32 files).
struct Tokens {
  ComputeInput values;
  Dims shape;
  explicit Tokens(const InputTensor& x)
      : values(x, DType::f32), shape{x.shape[0], x.shape[2], x.shape[3]} {}
  const float* data() const { return static_cast<const float*>(values.view().data()); }
  TensorView view() const { return TensorView(data(), shape); }
};

// --incremental: one query at a time. Each step appends its key and value to the cache and
// attends over everything cached so far (causal, bottom-right); the outputs are concatenated.
void decode_incrementally(const MultiHeadAttention& layer, const Tokens& query, const MhaArgs& args,
                          const LayerOptions& options, const MutableTensorView& out) {
  const int64_t batch = query.shape[0], length = query.shape[1];
  const IncrementalSpecs steps = incremental_specs(args.masks, args.mods, batch, length);
  KVCache cache = layer.make_cache(batch, length, options.dtype);
  if (!steps.starts.empty()) cache.set_starts(steps.starts);
  const int64_t width = query.shape[2], embed = layer.embed_dim();
  for (int64_t t = 0; t < length; ++t) {
    const TensorView step(query.data() + t * width, {batch, 1, width}, {length * width, width, 1});
    const MutableTensorView step_out(static_cast<float*>(out.mutable_data()) + t * embed,
                                     {batch, 1, embed}, {length * embed, embed, 1});
    Mask mask = steps.specs.mask;
    if (!steps.query_keep.empty()) {
      std::vector<int64_t> column(batch);
      for (int64_t b = 0; b < batch; ++b) column[b] = steps.query_keep[b * length + t];
      mask = mask & Mask().query_keep(Array<int64_t>({batch, 1}, std::move(column)));
    }
    try {
      layer.forward_cached(step, cache, step_out, mask, steps.specs.mods, options);
    } catch (const Error& error) {
      throw Error(
          std::string(error.what()) + " (--incremental step " + std::to_string(t) +
          ": 1 query over " + std::to_string(t + 1) +
          " cached keys; a --mask file sized by the query or key count cannot follow the steps)");
    }
  }
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
  LayerOptions options;
  options.attention = call_options(args.scale, args.threads, args.kernel, args.products);
  options.dtype = dtype;

  const int64_t batch = query.shape[0], length = query.shape[2];
  const Dims out_shape = {batch, 1, length, layer.embed_dim()};
  OutputFiles files;
  const MutableTensorView out_4d = files.add("--out", args.out, result_type(query, dtype),
                                             file_layout(query, out_shape), DType::f32, out_shape);
  const MutableTensorView out(out_4d.mutable_data(), DType::f32,
                              {batch, length, layer.embed_dim()});
  const Tokens query_tokens(query);
  if (args.incremental) {
    decode_incrementally(layer, query_tokens, args, options, out);
  } else {
    const MaskSpecs specs = parse_mask_specs(args.masks, args.mods, false);
    std::optional<Tokens> key_tokens, value_tokens;  // cross-attention only
    if (cross) key_tokens.emplace(key), value_tokens.emplace(value);
    const Tokens& k = cross ? *key_tokens : query_tokens;
    const Tokens& v = cross ? *value_tokens : query_tokens;
    try {
      layer.forward(query_tokens.view(), k.view(), v.view(), out, specs.mask, specs.mods, options);
    } catch (const Error& error) {
      throw Error(naming_program_spec(error.what(), specs.programs));
    }
  }
  files.commit();
  return 0;
}

Command add_mha_command(CLI::App& app) {
  auto args = std::make_shared<MhaArgs>();
  CLI::App* command = app.add_subcommand(
      "mha", "a multi-head attention layer (PyTorch-named .npy weights) over [B,L,E] inputs");
  command->add_option("--query", args->query, "queries .npy [B,L,E] (float32/float16)")->required();
  command->add_option("--key", args->key, "keys .npy [B,Lk,Ek] (cross-attention; with --value)");
  command->add_option("--value", args->value, "values .npy [B,Lk,Ev] (with --key)");
  command
      ->add_option("--weights", args->weights,
                   "directory of in_proj_weight.npy (or q/k/v_proj_weight.npy), "
                   "out_proj.weight.npy and optionally in_proj_bias.npy, out_proj.bias.npy")
      ->required();
  command->add_option("--heads", args->heads, "query heads")
      ->required()
      ->check(CLI::PositiveNumber);
  command->add_option("--kv-heads", args->kv_heads, "kv heads (default: --heads)")
      ->check(CLI::PositiveNumber);
  command->add_option("--out", args->out, "output .npy [B,L,E] (the query's dtype; f32 for bf16)")
      ->required();
  ComputeOptionHelp help;
  help.scale = "score scale (default 1/sqrt(head dim))";
  help.dtype = "compute (and cache) in this dtype";
  add_compute_options(command, *args, help, [&] {
    command->add_flag("--incremental", args->incremental,
                      "feed the queries one at a time through a KV cache (causal) and write the "
                      "concatenated outputs");
  });
  command->footer(mask_spec_help());
  return {command, [args] { return run_mha(*args); }};
}

}  // namespace maskattn::cli
