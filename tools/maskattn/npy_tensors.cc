#include "npy_tensors.h"

#include <cstring>

#include "maskattn/cpu.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"
#include "maskattn/memory.h"

namespace maskattn::cli {

size_t checked_buffer_bytes(const Dims& shape, DType dtype) {
  const double bytes = static_cast<double>(checked_numel(shape, "tensor")) * dtype_size(dtype);
  require_memory(bytes, "a " + std::string(dtype_name(dtype)) + " tensor " + shape_string(shape));
  return static_cast<size_t>(bytes);
}

TensorBuffer::TensorBuffer(DType dtype, Dims shape)
    : dtype_(dtype), shape_(std::move(shape)), bytes_(checked_buffer_bytes(shape_, dtype)) {}

TensorBuffer TensorBuffer::from_floats(const std::vector<float>& values, Dims shape, DType dtype) {
  TensorBuffer buffer(dtype, std::move(shape));
  for (size_t n = 0; n < values.size(); ++n) buffer.set(n, values[n]);
  return buffer;
}

float TensorBuffer::get(size_t n) const {
  if (dtype_ == DType::f32) {
    float value;
    std::memcpy(&value, &bytes_[n * 4], 4);
    return value;
  }
  uint16_t bits = 0;
  std::memcpy(&bits, &bytes_[n * 2], 2);
  return dtype_ == DType::f16 ? to_float(float16{bits}) : to_float(bfloat16{bits});
}

void TensorBuffer::set(size_t n, float x) {
  switch (dtype_) {
    case DType::f32:
      std::memcpy(&bytes_[n * 4], &x, 4);
      break;
    case DType::f16: {
      const float16 half = float16_from_float(x);
      std::memcpy(&bytes_[n * 2], &half.bits, 2);
      break;
    }
    case DType::bf16: {
      const bfloat16 brain = bfloat16_from_float(x);
      std::memcpy(&bytes_[n * 2], &brain.bits, 2);
      break;
    }
  }
}

std::vector<float> TensorBuffer::to_floats() const {
  std::vector<float> values(size());
  for (size_t n = 0; n < values.size(); ++n) values[n] = get(n);
  return values;
}

InputTensor load_input(const std::string& flag, const std::string& path) {
  InputTensor input;
  input.flag = flag + " " + path;
  input.file = std::make_shared<const MappedNpy>(path);
  const NpyType type = input.file->type();
  if (type != NpyType::f4 && type != NpyType::f2) {
    throw Error(input.flag + " has dtype " + npy_type_name(type) +
                "; attention inputs are float32 or float16");
  }
  const Dims& s = input.file->shape();
  switch (s.size()) {
    case 2:
      input.shape = {1, 1, s[0], s[1]};
      break;
    case 3:
      input.shape = {s[0], 1, s[1], s[2]};
      break;
    case 4:
      input.shape = s;
      break;
    default:
      throw Error(input.flag + " has shape " + shape_string(s) +
                  "; expected [L,D], [B,L,D] or [B,H,L,D]");
  }
  input.file_type = type;
  input.file_rank = static_cast<int>(s.size());
  input.file_shape = s;
  return input;
}

float file_value(const uint8_t* bytes, NpyType type, size_t n) {
  if (type == NpyType::f4) {
    float value;
    std::memcpy(&value, bytes + 4 * n, 4);
    return value;
  }
  float16 half;
  std::memcpy(&half.bits, bytes + 2 * n, 2);
  return to_float(half);
}

ComputeInput::ComputeInput(const InputTensor& input, DType dtype) {
  const uint8_t* in_place = input.file->c_order_data();
  const bool same_dtype = (input.file_type == NpyType::f4 && dtype == DType::f32) ||
                          (input.file_type == NpyType::f2 && dtype == DType::f16);
  if (same_dtype && in_place != nullptr) {
    view_ = TensorView(in_place, dtype, input.shape);
    return;
  }
  std::optional<NpyArray> c_order;  // a Fortran-order or unaligned file, copied
  if (in_place == nullptr) in_place = c_order.emplace(input.file->to_array()).bytes().data();
  copy_.emplace(dtype, input.shape);
  for (size_t n = 0; n < copy_->size(); ++n)
    copy_->set(n, file_value(in_place, input.file_type, n));
  view_ = copy_->view();
}

DType choose_dtype(const std::string& requested, const std::vector<const InputTensor*>& inputs) {
  if (!requested.empty()) return parse_dtype(requested, "--dtype");
  const InputTensor& first = *inputs.front();
  for (const InputTensor* input : inputs) {
    if (input->file_type != first.file_type) {
      throw Error(input->flag + " is " + npy_type_name(input->file_type) + " but " + first.flag +
                  " is " + npy_type_name(first.file_type) +
                  "; pass --dtype f32|f16|bf16 to convert");
    }
  }
  return first.file_type == NpyType::f2 ? DType::f16 : DType::f32;
}

Dims file_layout(const InputTensor& like, const Dims& shape) {
  switch (like.file_rank) {
    case 2:
      return {shape[2], shape[3]};
    case 3:
      return {shape[0], shape[2], shape[3]};
    default:
      return shape;
  }
}

std::string input_files(const std::vector<const InputTensor*>& inputs) {
  std::string text;
  for (const InputTensor* input : inputs) {
    text += (text.empty() ? " (" : ", ") + input->flag + " " + shape_string(input->file_shape);
  }
  return text + ")";
}

NpyType result_type(const InputTensor& like, DType computed) {
  return like.file_type == NpyType::f2 && computed != DType::bf16 ? NpyType::f2 : NpyType::f4;
}

void require_same_layout(const std::vector<const InputTensor*>& inputs, const std::string& names) {
  const InputTensor& first = *inputs.front();
  for (const InputTensor* input : inputs) {
    if (input->file_rank != first.file_rank) {
      throw Error(input->flag + " has rank " + std::to_string(input->file_rank) + " but " +
                  first.flag + " has rank " + std::to_string(first.file_rank) + "; give " + names +
                  " in the same layout");
    }
  }
}

MaskSpecs parse_mask_specs(const std::vector<std::string>& masks,
                           const std::vector<std::string>& mods, bool one_head_layout) {
  MaskSpecs parsed;
  SpecOptions options;
  options.one_head_layout = one_head_layout;
  for (const std::string& spec : masks) {
    apply_mask_spec(spec, parsed.mask, parsed.mods, "--mask " + spec, options);
    if (spec.rfind("expr:", 0) == 0) parsed.programs.push_back("--mask " + spec);
  }
  for (const std::string& spec : mods) {
    apply_mod_spec(spec, parsed.mods, "--mod " + spec, options);
    if (spec.rfind("expr:", 0) == 0) parsed.programs.push_back("--mod " + spec);
  }
  return parsed;
}

std::string naming_program_spec(const std::string& message,
                                const std::vector<std::string>& programs) {
  const std::string opening = "program `";
  if (message.rfind(opening, 0) != 0) return message;
  const size_t end = message.find('`', opening.size());
  const std::string text = message.substr(opening.size(), end - opening.size());
  for (const std::string& spec : programs) {
    // "[--mask ]expr:TEXT[:NAME=FILE]...": the text runs to the next ':' (it never holds one).
    const size_t kind = spec.find("expr:");
    if (kind == std::string::npos) continue;
    const size_t start = kind + 5;
    if (spec.compare(start, spec.find(':', start) - start, text) == 0) {
      return spec + ": " + message;
    }
  }
  return message;
}

Options call_options(const std::optional<double>& scale, int threads, const std::string& kernel,
                     const std::string& products, const Dropout& dropout) {
  Options options;
  options.scale = scale;
  options.threads = threads;
  options.kernel = parse_kernel(kernel, "--kernel");
  options.products = parse_products(products, "--products");
  options.dropout = dropout;
  return options;
}

}  // namespace maskattn::cli
