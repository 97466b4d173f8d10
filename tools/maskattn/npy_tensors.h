// Attention tensors on disk: loading Q/K/V from .npy into [B,H,L,D] buffers of a chosen dtype,
// and writing results so that either every output file appears or none does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/dtype.h"
#include "maskattn/npy.h"
#include "maskattn/tensor.h"

namespace maskattn::cli {

// A contiguous [B, H, L, D] tensor owned by the CLI.
class TensorBuffer {
 public:
  TensorBuffer(DType dtype, Dims shape);  // zero-filled
  // Rounds each value to nearest even in `dtype` (exact for f32, and for f16 data going to f16).
  static TensorBuffer from_floats(const std::vector<float>& values, Dims shape, DType dtype);

  DType dtype() const { return dtype_; }
  const Dims& shape() const { return shape_; }
  TensorView view() const { return TensorView(bytes_.data(), dtype_, shape_); }
  MutableTensorView mutable_view() { return MutableTensorView(bytes_.data(), dtype_, shape_); }
  std::vector<float> to_floats() const;

 private:
  DType dtype_;
  Dims shape_;
  std::vector<uint8_t> bytes_;
};

// One of --q/--k/--v: float32 or float16, [L,D], [B,L,D] or [B,H,L,D].
struct InputTensor {
  std::string flag;  // "--q q.npy", for messages
  NpyType file_type = NpyType::f4;
  int file_rank = 4;
  Dims file_shape;  // as in the file
  Dims shape;       // as [B, H, L, D]
  std::vector<float> values;
};
InputTensor load_input(const std::string& flag, const std::string& path);

// The compute dtype: `requested` ("f32", "f16", "bf16"), or "" for the files' own, which must
// then agree (f16 files compute in f16, f32 files in f32).
DType choose_dtype(const std::string& requested, const std::vector<const InputTensor*>& inputs);

// "auto" | "reference" | "fused".
Kernel kernel_named(const std::string& name);
// "f32" | "f16" | "bf16" (the flags' choices are checked by CLI11).
DType dtype_named(const std::string& name);

// Throws unless every input has the rank of the first ("give q, k and v in the same layout").
void require_same_layout(const std::vector<const InputTensor*>& inputs, const std::string& names);

// The --mask SPECs of a command, applied in order; with one-head inputs ([B,L,D] files), 3-D
// dense files are read as [B,Lq,Lk].
struct MaskSpecs {
  Mask mask;
  ScoreMods mods;
};
MaskSpecs parse_mask_specs(const std::vector<std::string>& specs, bool one_head_layout);

// Options from the --scale, --threads and --kernel flags.
Options call_options(const std::optional<double>& scale, int threads, const std::string& kernel);

// A [B,H,L,W] result in the layout of the file `like` came from: [L,W], [B,L,W] or [B,H,L,W].
Dims file_layout(const InputTensor& like, const Dims& shape);

// A result as an .npy array in the dtype of the file `like` came from: float16 files get float16
// (unless the run was bf16, which .npy cannot hold), everything else float32.
NpyArray result_array(const std::vector<float>& values, const Dims& file_shape,
                      const InputTensor& like, DType computed);

// Files are first written next to their destination under a temporary name, then renamed, so a
// failure leaves no output behind.
class OutputFiles {
 public:
  // `flag` names the option in messages; two flags naming the same file are an error.
  void add(const std::string& flag, const std::string& path, NpyArray array);
  void commit();  // throws Error naming the path that failed; removes the temporaries it wrote

 private:
  struct Pending {
    std::string flag, path;
    NpyArray array;
  };
  std::vector<Pending> pending_;
};

// Throws if two of the (flag, path) outputs are the same file.
void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace maskattn::cli
