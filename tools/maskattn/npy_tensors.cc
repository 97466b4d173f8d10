#include "npy_tensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "maskattn/error.h"

namespace maskattn::cli {

TensorBuffer::TensorBuffer(DType dtype, Dims shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(static_cast<size_t>(checked_numel(shape_, "tensor")) * dtype_size(dtype)) {}

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
  input.values = array.to_float32(input.flag);
  return input;
}

void OutputFiles::add(const std::string& path, NpyArray array) {
  pending_.emplace_back(path, std::move(array));
}

void OutputFiles::commit() {
  std::vector<std::string> temporaries;
  const auto remove_temporaries = [&] {
    for (const std::string& temporary : temporaries) std::remove(temporary.c_str());
  };
  for (const auto& [path, array] : pending_) {
    const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
    temporaries.push_back(temporary);
    try {
      write_npy(temporary, array);
    } catch (const Error& error) {
      remove_temporaries();
      throw Error("cannot write '" + path + "': " + error.what());
    }
  }
  for (size_t n = 0; n < pending_.size(); ++n) {
    if (std::rename(temporaries[n].c_str(), pending_[n].first.c_str()) != 0) {
      const std::string reason = std::strerror(errno);
      remove_temporaries();
      throw Error("cannot write '" + pending_[n].first + "': " + reason);
    }
  }
}

}  // namespace maskattn::cli
