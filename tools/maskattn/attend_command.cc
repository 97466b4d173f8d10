// maskattn attend: O = attention(Q, K, V, mask) from .npy files. The flags are a fixed contract
// (docs/cli.md): scripts depend on them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "commands.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"

namespace maskattn::cli {

namespace {

DType compute_dtype(const AttendArgs& args, const InputTensor& q, const InputTensor& k,
                    const InputTensor& v) {
  if (args.dtype == "f32") return DType::f32;
  if (args.dtype == "f16") return DType::f16;
  if (args.dtype == "bf16") return DType::bf16;
  for (const InputTensor* input : {&k, &v}) {
    if (input->file_type != q.file_type) {
      throw Error(input->flag + " is " + npy_type_name(input->file_type) + " but " + q.flag +
                  " is " + npy_type_name(q.file_type) + "; pass --dtype f32|f16|bf16 to convert");
    }
  }
  return q.file_type == NpyType::f2 ? DType::f16 : DType::f32;
}

Kernel kernel_of(const std::string& name) {
  if (name == "reference") return Kernel::reference;
  if (name == "fused") return Kernel::fused;
  return Kernel::automatic;
}

// The output keeps Q's layout: [Lq,Dv], [B,Lq,Dv] or [B,H,Lq,Dv].
Dims output_file_shape(const InputTensor& q, const Dims& out) {
  switch (q.file_rank) {
    case 2:
      return {out[2], out[3]};
    case 3:
      return {out[0], out[2], out[3]};
    default:
      return out;
  }
}

}  // namespace

int run_attend(const AttendArgs& args) {
  std::vector<std::pair<std::string, std::string>> outputs = {{"--out", args.out}};
  if (!args.lse.empty()) outputs.emplace_back("--lse", args.lse);
  if (!args.weights.empty()) outputs.emplace_back("--weights", args.weights);
  require_distinct_outputs(outputs);

  const InputTensor q = load_input("--q", args.q);
  const InputTensor k = load_input("--k", args.k);
  const InputTensor v = load_input("--v", args.v);
  for (const InputTensor* input : {&k, &v}) {
    if (input->file_rank != q.file_rank) {
      throw Error(input->flag + " has rank " + std::to_string(input->file_rank) + " but " + q.flag +
                  " has rank " + std::to_string(q.file_rank) +
                  "; give q, k and v in the same layout");
    }
  }
  const DType dtype = compute_dtype(args, q, k, v);

  Mask mask;
  ScoreMods mods;
  SpecOptions spec_options;
  spec_options.one_head_layout = q.file_rank == 3;
  for (const std::string& spec : args.masks) {
    apply_mask_spec(spec, mask, mods, "--mask " + spec, spec_options);
  }

  Options options;
  options.scale = args.scale;
  options.threads = args.threads;
  options.kernel = kernel_of(args.kernel);

  const TensorBuffer q_buffer = TensorBuffer::from_floats(q.values, q.shape, dtype);
  const TensorBuffer k_buffer = TensorBuffer::from_floats(k.values, k.shape, dtype);
  const TensorBuffer v_buffer = TensorBuffer::from_floats(v.values, v.shape, dtype);
  // Shapes are checked by attention(); these only size the buffers, so guard their indexing.
  const Dims out_shape = {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
  TensorBuffer out(dtype, out_shape);
  std::optional<TensorBuffer> lse;
  if (!args.lse.empty()) lse.emplace(DType::f32, Dims{q.shape[0], q.shape[1], q.shape[2]});

  // Library errors speak of the [B,H,L,D] views; add the files they came from.
  const std::string input_files = " (" + q.flag + " " + shape_string(q.file_shape) + ", " + k.flag +
                                  " " + shape_string(k.file_shape) + ", " + v.flag + " " +
                                  shape_string(v.file_shape) + ")";
  const auto compute = [&] {
    attention(q_buffer.view(), k_buffer.view(), v_buffer.view(), out.mutable_view(), mask, mods,
              options, lse ? lse->mutable_view() : MutableTensorView());
  };
  try {
    compute();  // with --repeat, this is the warm-up
  } catch (const Error& error) {
    throw Error(error.what() + input_files);
  }
  if (args.repeat > 0) {
    // Compute only: no file I/O, no conversions. Fixed format: scripts read this line.
    std::vector<double> times;
    for (int r = 0; r < args.repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      compute();
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    const double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
    std::fprintf(stderr, "time_ms median=%.3f min=%.3f max=%.3f\n", median, times.front(),
                 times.back());
  }

  OutputFiles files;
  // Output keeps the input file's dtype; bf16 has no .npy dtype, so a bf16 run writes f32.
  const std::vector<float> out_values = out.to_floats();
  const Dims out_file_shape = output_file_shape(q, out_shape);
  if (q.file_type == NpyType::f2 && dtype != DType::bf16) {
    std::vector<float16> halves(out_values.size());
    for (size_t n = 0; n < halves.size(); ++n) halves[n] = float16_from_float(out_values[n]);
    files.add("--out", args.out, NpyArray::from_float16(halves, out_file_shape));
  } else {
    files.add("--out", args.out, NpyArray::from_floats(out_values, out_file_shape));
  }
  if (lse) files.add("--lse", args.lse, NpyArray::from_floats(lse->to_floats(), lse->shape()));
  if (!args.weights.empty()) {
    TensorBuffer weights(DType::f32, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]});
    attention_weights(q_buffer.view(), k_buffer.view(), weights.mutable_view(), mask, mods,
                      options);
    files.add("--weights", args.weights,
              NpyArray::from_floats(weights.to_floats(), weights.shape()));
  }
  files.commit();
  return 0;
}

}  // namespace maskattn::cli
