// Attention tensors on disk: Q/K/V from memory-mapped .npy files as [B,H,L,D] views of the
// compute dtype, converted only when the file holds another dtype (outputs: output_files.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/dtype.h"
#include "maskattn/npy.h"
#include "maskattn/tensor.h"

namespace maskattn::cli {

// Bytes of a tensor of `shape` and `dtype`; throws Error (E83) when more than the memory cap.
size_t checked_buffer_bytes(const Dims& shape, DType dtype);

// A contiguous [B, H, L, D] tensor owned by the CLI.
class TensorBuffer {
 public:
  TensorBuffer(DType dtype, Dims shape);  // zero-filled
  // Rounds each value to nearest even in `dtype` (exact for f32, and for f16 data going to f16).
  static TensorBuffer from_floats(const std::vector<float>& values, Dims shape, DType dtype);

  DType dtype() const { return dtype_; }
  const Dims& shape() const { return shape_; }
  size_t size() const { return bytes_.size() / dtype_size(dtype_); }  // elements
  TensorView view() const { return TensorView(bytes_.data(), dtype_, shape_); }
  MutableTensorView mutable_view() { return MutableTensorView(bytes_.data(), dtype_, shape_); }
  float get(size_t n) const;    // element n (flat, C order) widened to f32
  void set(size_t n, float x);  // rounded to nearest even in the buffer's dtype
  std::vector<float> to_floats() const;

 private:
  DType dtype_;
  Dims shape_;
  std::vector<uint8_t> bytes_;
};

// One of --q/--k/--v (or --dout, --query, ...): float32 or float16, [L,D], [B,L,D] or [B,H,L,D].
// The file is memory-mapped, not read: ComputeInput uses its bytes in place when it can.
struct InputTensor {
  std::string flag;  // "--q q.npy", for messages
  NpyType file_type = NpyType::f4;
  int file_rank = 4;
  Dims file_shape;  // as in the file
  Dims shape;       // as [B, H, L, D]
  std::shared_ptr<const MappedNpy> file;
};
InputTensor load_input(const std::string& flag, const std::string& path);

// Element n of float32 or float16 file bytes (an input's NpyType), widened to f32.
float file_value(const uint8_t* bytes, NpyType type, size_t n);

// An input as a [B,H,L,D] view in the compute dtype. When the file already holds that dtype in C
// order (float32 for f32, float16 for f16) the view points into the file's mapping and nothing is
// copied; otherwise (another dtype, Fortran order, unaligned data) the values are converted once
// into an owned buffer, each rounded to nearest even.
class ComputeInput {
 public:
  ComputeInput(const InputTensor& input, DType dtype);
  ComputeInput(const ComputeInput&) = delete;  // the view may point into copy_
  ComputeInput(ComputeInput&&) = default;      // a moved vector keeps its buffer
  TensorView view() const { return view_; }

 private:
  std::optional<TensorBuffer> copy_;
  TensorView view_;
};

// The compute dtype: `requested` ("f32", "f16", "bf16"), or "" for the files' own, which must
// then agree (f16 files compute in f16, f32 files in f32).
DType choose_dtype(const std::string& requested, const std::vector<const InputTensor*>& inputs);

// Throws unless every input has the rank of the first ("give q, k and v in the same layout").
void require_same_layout(const std::vector<const InputTensor*>& inputs, const std::string& names);

// The --mask SPECs of a command, applied in order, then its --mod SPECs; with one-head inputs
// ([B,L,D] files), 3-D dense files are read as [B,Lq,Lk].
struct MaskSpecs {
  Mask mask;
  ScoreMods mods;
  std::vector<std::string> programs;  // the expr: SPECs as errors name them: "--mod expr:…"
};
MaskSpecs parse_mask_specs(const std::vector<std::string>& masks,
                           const std::vector<std::string>& mods, bool one_head_layout);

// The library's errors from checking or evaluating a program during a call (errors.md E126,
// E128) begin "program `TEXT`", which does not say which SPEC the program came from. This puts
// the SPEC of `programs` (expr: SPECs, each with its flag or not) whose text it is in front, as
// every other SPEC error has it; any other message is returned as it is.
std::string naming_program_spec(const std::string& message,
                                const std::vector<std::string>& programs);

// Options from the --scale, --threads, --kernel, --products and --dropout/--seed flags.
Options call_options(const std::optional<double>& scale, int threads, const std::string& kernel,
                     const std::string& products = "auto", const Dropout& dropout = {});

// A [B,H,L,W] result in the layout of the file `like` came from: [L,W], [B,L,W] or [B,H,L,W].
Dims file_layout(const InputTensor& like, const Dims& shape);

// Library errors speak of the [B,H,L,D] views; this names the files they came from:
// " (--q q.npy [1,3,4], --k k.npy [1,3,4], ...)".
std::string input_files(const std::vector<const InputTensor*>& inputs);

// The .npy type of a result computed in `computed` from the file `like` came from: float16 files
// get float16 (unless the run was bf16, which .npy cannot hold), everything else float32.
NpyType result_type(const InputTensor& like, DType computed);

}  // namespace maskattn::cli
