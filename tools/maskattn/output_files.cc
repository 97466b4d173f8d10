#include "output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "maskattn/error.h"
#include "npy_tensors.h"

namespace maskattn::cli {

namespace {

bool holds(NpyType file_type, DType dtype) {
  return (file_type == NpyType::f4 && dtype == DType::f32) ||
         (file_type == NpyType::f2 && dtype == DType::f16);
}

}  // namespace

struct OutputFiles::Output {
  std::string flag, path;
  std::string temporary;  // its name once created (removed unless committed)
  std::string error;      // why it could not be created; reported by commit()
  NpyType file_type = NpyType::f4;
  MappedFile file;  // header and data of the temporary
  size_t data_offset = 0;
  std::optional<TensorBuffer> staging;  // the result, when the file holds another dtype

  // Creates the temporary, `header` then room for `data_bytes`, and maps it; on failure, leaves
  // the reason in `error`.
  void create(const std::vector<uint8_t>& header, size_t data_bytes) {
    std::string name = path + ".tmp-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
      error = std::strerror(errno);
      return;
    }
    temporary = name;
    // mkstemp creates the file 0600; give the output the permissions a plain create would.
    const mode_t creation_mask = ::umask(0);
    ::umask(creation_mask);
    ::fchmod(fd, 0666 & ~creation_mask);
    // Reserving the blocks now turns a full disk into this error instead of a SIGBUS when the
    // computation stores into a page the file system cannot back.
    const size_t size = header.size() + data_bytes;
    const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (reserved != 0) {
      error = std::strerror(reserved);
    } else {
      try {
        file = MappedFile::map_writable(fd, size, temporary);
        std::memcpy(file.mutable_data(), header.data(), header.size());
        data_offset = header.size();
      } catch (const Error& failure) {
        error = failure.what();
      }
    }
    ::close(fd);  // the mapping keeps the file open
  }

  // Stores the staged result into the file, converted to its element type.
  void store_staged() {
    uint8_t* data = file.mutable_data() + data_offset;
    const size_t count = staging->size();
    for (size_t n = 0; n < count; ++n) {
      const float value = staging->get(n);
      if (file_type == NpyType::f2) {
        const float16 half = float16_from_float(value);
        std::memcpy(data + 2 * n, &half.bits, 2);
      } else {
        std::memcpy(data + 4 * n, &value, 4);
      }
    }
  }
};

OutputFiles::OutputFiles() = default;

OutputFiles::~OutputFiles() {
  if (committed_) return;
  for (const auto& output : outputs_) {
    if (!output->temporary.empty()) std::remove(output->temporary.c_str());
  }
}

MutableTensorView OutputFiles::add(const std::string& flag, const std::string& path,
                                   NpyType file_type, const Dims& file_shape, DType dtype,
                                   const Dims& shape) {
  auto output = std::make_unique<Output>();
  output->flag = flag;
  output->path = path;
  output->file_type = file_type;
  const size_t data_bytes =
      static_cast<size_t>(checked_numel(file_shape, flag)) * npy_type_size(file_type);
  checked_buffer_bytes(shape, dtype);  // a result counts against the memory cap (E83)
  output->create(serialize_npy_header(file_type, file_shape), data_bytes);
  MutableTensorView view;
  if (output->error.empty() && holds(file_type, dtype)) {
    view = MutableTensorView(output->file.mutable_data() + output->data_offset, dtype, shape);
  } else {
    output->staging.emplace(dtype, shape);
    view = output->staging->mutable_view();
  }
  outputs_.push_back(std::move(output));
  return view;
}

void OutputFiles::commit() {
  std::vector<std::pair<std::string, std::string>> names;
  for (const auto& output : outputs_) names.emplace_back(output->flag, output->path);
  require_distinct_outputs(names);
  for (const auto& output : outputs_) {
    if (!output->error.empty()) {
      throw Error("cannot write '" + output->path + "': " + output->error);
    }
  }
  for (const auto& output : outputs_) {
    if (output->staging) output->store_staged();
    output->file = MappedFile();  // unmapped: what was stored is the file's content
  }
  for (size_t n = 0; n < outputs_.size(); ++n) {
    if (std::rename(outputs_[n]->temporary.c_str(), outputs_[n]->path.c_str()) != 0) {
      const std::string reason = std::strerror(errno);
      for (size_t m = 0; m < n; ++m) std::remove(outputs_[m]->path.c_str());
      throw Error("cannot write '" + outputs_[n]->path + "': " + reason);
    }
  }
  committed_ = true;
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

}  // namespace maskattn::cli
