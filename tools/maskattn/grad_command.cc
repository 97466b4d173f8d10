// maskattn grad: dQ, dK, dV = attention_backward(Q, K, V, dO, mask) from .npy files; and
// maskattn gradcheck: the backward against finite differences on random inputs. The flags are a
// fixed contract (docs/cli.md): scripts depend on them.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "core/splitmix64.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/gradcheck.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"
#include "output_files.h"

namespace maskattn::cli {

int run_grad(const GradArgs& args) {
  require_ring_for_stats(args.ring, args.ring_stats);
  if (!args.ring.empty()) return run_grad_ring(args);
  require_distinct_outputs({{"--dq", args.dq}, {"--dk", args.dk}, {"--dv", args.dv}});
  const InputTensor q = load_input("--q", args.q);
  const InputTensor k = load_input("--k", args.k);
  const InputTensor v = load_input("--v", args.v);
  const InputTensor dout = load_input("--dout", args.dout);
  require_same_layout({&q, &k, &v, &dout}, "q, k, v and dout");
  const DType dtype = choose_dtype(args.dtype, {&q, &k, &v, &dout});
  const MaskSpecs parsed = parse_mask_specs(args.masks, args.mods, q.file_rank == 3);
  const Options options = call_options(args.scale, args.threads, args.kernel, args.products,
                                       Dropout{args.dropout, args.seed, 0});

  const ComputeInput q_in(q, dtype), k_in(k, dtype), v_in(v, dtype), dout_in(dout, dtype);
  // The backward needs the forward's O and LSE: computed here, not read from files. Shapes are
  // checked by the library; these only size the buffers.
  TensorBuffer out(dtype, {q.shape[0], q.shape[1], q.shape[2], v.shape[3]});
  TensorBuffer lse(DType::f32, {q.shape[0], q.shape[1], q.shape[2]});
  OutputFiles files;
  const auto gradient = [&](const char* flag, const std::string& path, const InputTensor& like) {
    return files.add(flag, path, result_type(like, dtype), like.file_shape, dtype, like.shape);
  };
  const MutableTensorView dq = gradient("--dq", args.dq, q);
  const MutableTensorView dk = gradient("--dk", args.dk, k);
  const MutableTensorView dv = gradient("--dv", args.dv, v);

  try {
    attention(q_in.view(), k_in.view(), v_in.view(), out.mutable_view(), parsed.mask, parsed.mods,
              options, lse.mutable_view());
    attention_backward(q_in.view(), k_in.view(), v_in.view(), out.view(), lse.view(),
                       dout_in.view(), {dq, dk, dv, {}, {}}, parsed.mask, parsed.mods, options);
  } catch (const Error& error) {
    throw Error(naming_program_spec(error.what(), parsed.programs) +
                input_files({&q, &k, &v, &dout}));
  }
  files.commit();
  return 0;
}

int run_gradcheck(const GradcheckArgs& args) {
  const int64_t kv_heads = args.kv_heads > 0 ? args.kv_heads : args.heads;
  for (const auto& [value, name] : {std::pair{args.batch, "--batch"},
                                    {args.heads, "--heads"},
                                    {kv_heads, "--kv-heads"},
                                    {args.q_len, "--lq"},
                                    {args.k_len, "--lk"},
                                    {args.dim, "--d"},
                                    {args.value_dim, "--dv"}}) {
    if (value < 1 || value > 4096) {
      throw Error(std::string(name) + " = " + std::to_string(value) + " must be in [1, 4096]");
    }
  }
  const int64_t elements = args.batch * (args.heads * args.q_len * args.dim +
                                         kv_heads * args.k_len * (args.dim + args.value_dim));
  if (elements > 200000) {
    throw Error("gradcheck: " + std::to_string(elements) +
                " input elements, each needing two reference forwards, is too many; keep B·H·L·D "
                "small (at most 200000 elements)");
  }
  const DType dtype = parse_dtype(args.dtype, "--dtype");
  const MaskSpecs parsed = parse_mask_specs(args.masks, args.mods, false);
  detail::SplitMix64 random(args.seed);
  const auto make = [&](Dims shape) {
    std::vector<float> values(static_cast<size_t>(checked_numel(shape, "input")));
    for (float& x : values) x = static_cast<float>(random.uniform(-1.0, 1.0));
    return TensorBuffer::from_floats(values, std::move(shape), dtype);
  };
  const TensorBuffer q = make({args.batch, args.heads, args.q_len, args.dim});
  const TensorBuffer k = make({args.batch, kv_heads, args.k_len, args.dim});
  const TensorBuffer v = make({args.batch, kv_heads, args.k_len, args.value_dim});
  const TensorBuffer dout = make({args.batch, args.heads, args.q_len, args.value_dim});

  const Options options = call_options(args.scale, args.threads, args.kernel, "auto",
                                       Dropout{args.dropout, args.seed, 0});
  GradcheckOptions check;
  check.step = args.step;
  check.tolerance = args.tolerance;
  GradcheckReport report;
  try {
    report = gradcheck(q.view(), k.view(), v.view(), dout.view(), parsed.mask, parsed.mods, options,
                       check);
  } catch (const Error& error) {
    throw Error(naming_program_spec(error.what(), parsed.programs));
  }

  std::printf("gradcheck: kernel %s, dtype %s, q %s, k %s, v %s, seed %llu, dropout %g, step %g\n",
              args.kernel.c_str(), dtype_name(dtype), shape_string(q.shape()).c_str(),
              shape_string(k.shape()).c_str(), shape_string(v.shape()).c_str(),
              static_cast<unsigned long long>(args.seed), args.dropout, args.step);
  std::printf("%-7s %9s %12s %14s %14s\n", "tensor", "elements", "max |fd|", "max abs error",
              "max rel error");
  for (const GradcheckEntry& entry : report.entries) {
    std::printf("%-7s %9lld %12.4e %14.4e %14.4e\n", entry.tensor.c_str(),
                static_cast<long long>(entry.count), entry.max_magnitude, entry.max_abs_error,
                entry.max_relative_error);
  }
  std::printf("tolerance %.1e: %s\n", report.tolerance, report.passed ? "passed" : "FAILED");
  if (report.passed) return 0;
  for (const GradcheckEntry& entry : report.entries) {
    if (!(entry.max_relative_error <= report.tolerance)) {
      std::fprintf(stderr,
                   "maskattn: error: gradcheck failed: %s max relative error %.3e exceeds the "
                   "tolerance %.1e\n",
                   entry.tensor.c_str(), entry.max_relative_error, report.tolerance);
      break;
    }
  }
  return 1;
}

Command add_grad_command(CLI::App& app) {
  auto args = std::make_shared<GradArgs>();
  CLI::App* command = app.add_subcommand(
      "grad", "dQ, dK, dV of attention for .npy inputs and dO (forward recomputed)");
  command->add_option("--q", args->q, "queries .npy (float32/float16)")->required();
  command->add_option("--k", args->k, "keys .npy")->required();
  command->add_option("--v", args->v, "values .npy")->required();
  command->add_option("--dout", args->dout, "dL/dO .npy, the output's shape")->required();
  command->add_option("--dq", args->dq, "dL/dQ output .npy (q's layout and dtype)")->required();
  command->add_option("--dk", args->dk, "dL/dK output .npy")->required();
  command->add_option("--dv", args->dv, "dL/dV output .npy")->required();
  add_compute_options(command, *args);
  add_dropout_options(command, *args);
  add_ring_options(command, args->ring, args->ring_stats);
  command->footer(mask_spec_help());
  return {command, [args] { return run_grad(*args); }};
}

Command add_gradcheck_command(CLI::App& app) {
  auto args = std::make_shared<GradcheckArgs>();
  CLI::App* command = app.add_subcommand(
      "gradcheck", "check the backward against finite differences on random inputs");
  add_mask_option(command, args->masks, kMaskHelp);
  add_mod_option(command, args->mods);
  command->add_option("--lq", args->q_len, "queries (default 8)");
  command->add_option("--lk", args->k_len, "keys (default 8)");
  command->add_option("--d", args->dim, "query/key head dim (default 4)");
  command->add_option("--dv", args->value_dim, "value head dim (default 4)");
  add_random_input_options(command, *args, "2");
  command->add_option("--scale", args->scale, "score scale (default 1/sqrt(D))");
  add_threads_option(command, args->threads);
  command
      ->add_option("--dropout", args->dropout,
                   "attention dropout probability, its pairs drawn from --seed (default 0)")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--step", args->step, "finite-difference step (default 1e-3)");
  command->add_option("--tolerance", args->tolerance,
                      "max relative error (default f32 1e-4, f16 1e-2, bf16 5e-2)");
  command->footer(mask_spec_help());
  return {command, [args] { return run_gradcheck(*args); }};
}

}  // namespace maskattn::cli
