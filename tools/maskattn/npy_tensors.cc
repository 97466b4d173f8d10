#include "npy_tensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "maskattn/error.h"
#include "maskattn/mask_spec.h"
#include "maskattn/memory.h"

namespace maskattn::cli {

namespace {

// Bytes of a [B,H,L,D] tensor, checked against the memory cap before anything is allocated.
size_t buffer_bytes(const Dims& shape, DType dtype) {
  const double bytes = static_cast<double>(checked_numel(shape, "tensor")) * dtype_size(dtype);
  require_memory(bytes, "a " + std::string(dtype_name(dtype)) + " tensor " + shape_string(shape));
  return static_cast<size_t>(bytes);
}

}  // namespace

TensorBuffer::TensorBuffer(DType dtype, Dims shape)
    : dtype_(dtype), shape_(std::move(shape)), bytes_(buffer_bytes(shape_, dtype)) {}

TensorBuffer TensorBuffer::from_floats(const std::vector<float>& values, Dims shape, DType dtype) {
  TensorBuffer buffer(dtype, std::move(shape));
  for (size_t n = 0; n < values.size(); ++n) {
    switch (dtype) {
      case DType::f32:
        std::memcpy(&buffer.bytes_[n * 4], &values[n], 4);
        break;
      case DType::f16: {
        const float16 x = float16_from_float(values[n]);
        std::memcpy(&buffer.bytes_[n * 2], &x.bits, 2);
        break;
      }
      case DType::bf16: {
        const bfloat16 x = bfloat16_from_float(values[n]);
        std::memcpy(&buffer.bytes_[n * 2], &x.bits, 2);
        break;
      }
    }
  }
  return buffer;
}

std::vector<float> TensorBuffer::to_floats() const {
  const size_t count = bytes_.size() / dtype_size(dtype_);
  std::vector<float> values(count);
  for (size_t n = 0; n < count; ++n) {
    uint16_t bits = 0;
    switch (dtype_) {
      case DType::f32:
        std::memcpy(&values[n], &bytes_[n * 4], 4);
        break;
      case DType::f16:
        std::memcpy(&bits, &bytes_[n * 2], 2);
        values[n] = to_float(float16{bits});
        break;
      case DType::bf16:
        std::memcpy(&bits, &bytes_[n * 2], 2);
        values[n] = to_float(bfloat16{bits});
        break;
    }
  }
  return values;
}

InputTensor load_input(const std::string& flag, const std::string& path) {
  InputTensor input;
  input.flag = flag + " " + path;
  const NpyArray array = read_npy(path);
  if (array.type() != NpyType::f4 && array.type() != NpyType::f2) {
    throw Error(input.flag + " has dtype " + npy_type_name(array.type()) +
                "; attention inputs are float32 or float16");
  }
  const Dims& s = array.shape();
  switch (array.rank()) {
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
  input.file_type = array.type();
  input.file_rank = array.rank();
  input.file_shape = s;
  input.values = array.to_float32(input.flag);
  return input;
}

void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<std::filesystem::path> seen;
  for (const auto& [flag, path] : outputs) {
    std::error_code ignored;
    seen.push_back(std::filesystem::weakly_canonical(path, ignored));
    if (seen.back().empty()) seen.back() = std::filesystem::absolute(path, ignored);
    for (size_t n = 0; n + 1 < seen.size(); ++n) {
      if (seen[n] == seen.back()) {
        throw Error(outputs[n].first + " and " + flag + " name the same file '" + path + "'");
      }
    }
  }
}

void OutputFiles::add(const std::string& flag, const std::string& path, NpyArray array) {
  pending_.push_back({flag, path, std::move(array)});
}

void OutputFiles::commit() {
  std::vector<std::pair<std::string, std::string>> outputs;
  for (const Pending& output : pending_) outputs.emplace_back(output.flag, output.path);
  require_distinct_outputs(outputs);

  std::vector<std::string> temporaries;
  const auto remove_temporaries = [&] {
    for (const std::string& temporary : temporaries) std::remove(temporary.c_str());
  };
  for (const Pending& output : pending_) {
    // A unique name in the destination's directory, so that the final rename is atomic.
    std::string temporary = output.path + ".tmp-XXXXXX";
    const int fd = ::mkstemp(temporary.data());
    if (fd < 0) {
      const std::string reason = std::strerror(errno);
      remove_temporaries();
      throw Error("cannot write '" + output.path + "': " + reason);
    }
    // mkstemp creates the file 0600; give the output the permissions a plain create would.
    const mode_t creation_mask = ::umask(0);
    ::umask(creation_mask);
    ::fchmod(fd, 0666 & ~creation_mask);
    ::close(fd);
    temporaries.push_back(temporary);
    try {
      write_npy(temporary, output.array);
    } catch (const Error& error) {
      remove_temporaries();
      throw Error("cannot write '" + output.path + "': " + error.what());
    }
  }
  for (size_t n = 0; n < pending_.size(); ++n) {
    if (std::rename(temporaries[n].c_str(), pending_[n].path.c_str()) != 0) {
      const std::string reason = std::strerror(errno);
      for (size_t m = 0; m < n; ++m) std::remove(pending_[m].path.c_str());
      remove_temporaries();
      throw Error("cannot write '" + pending_[n].path + "': " + reason);
    }
  }
}

DType choose_dtype(const std::string& requested, const std::vector<const InputTensor*>& inputs) {
  if (!requested.empty()) return dtype_named(requested);
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

Kernel kernel_named(const std::string& name) {
  if (name == "reference") return Kernel::reference;
  if (name == "fused") return Kernel::fused;
  return Kernel::automatic;
}

DType dtype_named(const std::string& name) {
  if (name == "f16") return DType::f16;
  if (name == "bf16") return DType::bf16;
  return DType::f32;
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

NpyArray result_array(const std::vector<float>& values, const Dims& file_shape,
                      const InputTensor& like, DType computed) {
  if (like.file_type == NpyType::f2 && computed != DType::bf16) {
    std::vector<float16> halves(values.size());
    for (size_t n = 0; n < halves.size(); ++n) halves[n] = float16_from_float(values[n]);
    return NpyArray::from_float16(halves, file_shape);
  }
  return NpyArray::from_floats(values, file_shape);
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

MaskSpecs parse_mask_specs(const std::vector<std::string>& specs, bool one_head_layout) {
  MaskSpecs parsed;
  SpecOptions options;
  options.one_head_layout = one_head_layout;
  for (const std::string& spec : specs) {
    apply_mask_spec(spec, parsed.mask, parsed.mods, "--mask " + spec, options);
  }
  return parsed;
}

Options call_options(const std::optional<double>& scale, int threads, const std::string& kernel) {
  Options options;
  options.scale = scale;
  options.threads = threads;
  options.kernel = kernel_named(kernel);
  return options;
}

}  // namespace maskattn::cli
