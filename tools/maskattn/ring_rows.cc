#include "ring_rows.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "maskattn/error.h"

namespace maskattn::cli {

TensorBuffer read_rows(const InputTensor& input, const std::vector<dist::RowRange>& rows,
                       DType dtype) {
  const int64_t batch = input.shape[0], heads = input.shape[1], length = input.shape[2],
                dim = input.shape[3];
  const uint8_t* bytes = input.file->c_order_data();
  std::optional<NpyArray> c_order;  // a Fortran-order or unaligned file: read whole, once
  if (bytes == nullptr) bytes = c_order.emplace(input.file->to_array()).bytes().data();
  TensorBuffer local(dtype, {batch, heads, dist::row_count(rows), dim});
  size_t next = 0;  // the local buffer is filled in its C order: (b, h, stacked row, d)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (const dist::RowRange& range : rows) {
        const auto first = static_cast<size_t>(((b * heads + h) * length + range.first) * dim);
        const auto count = static_cast<size_t>(range.size() * dim);
        for (size_t n = 0; n < count; ++n) {
          local.set(next++, file_value(bytes, input.file_type, first + n));
        }
      }
    }
  }
  return local;
}

namespace {

// Elements [first, first + count) of `local`, converted to the file's element type.
std::vector<uint8_t> file_bytes(const TensorBuffer& local, size_t first, size_t count,
                                NpyType file_type) {
  const size_t size = npy_type_size(file_type);
  std::vector<uint8_t> bytes(count * size);
  for (size_t n = 0; n < count; ++n) {
    const float value = local.get(first + n);
    if (file_type == NpyType::f2) {
      const float16 half = float16_from_float(value);
      std::memcpy(&bytes[n * 2], &half.bits, 2);
    } else {
      std::memcpy(&bytes[n * 4], &value, 4);
    }
  }
  return bytes;
}

void write_fully(int fd, const std::vector<uint8_t>& bytes, off_t offset, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t written =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, offset + static_cast<off_t>(done));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      throw Error("cannot write '" + path + "': " + std::strerror(written < 0 ? errno : EIO));
    }
    done += static_cast<size_t>(written);
  }
}

}  // namespace

void write_rows(const std::string& path, size_t header_bytes, NpyType file_type,
                const Dims& global_shape, const TensorBuffer& local,
                const std::vector<dist::RowRange>& rows) {
  const int64_t batch = global_shape[0], heads = global_shape[1], length = global_shape[2],
                width = global_shape[3];
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  try {
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (const dist::RowRange& range : rows) {
          const auto count = static_cast<size_t>(range.size() * width);
          const auto element = ((b * heads + h) * length + range.first) * width;
          const auto offset = static_cast<off_t>(header_bytes + static_cast<size_t>(element) *
                                                                    npy_type_size(file_type));
          write_fully(fd, file_bytes(local, next, count, file_type), offset, path);
          next += count;
        }
      }
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace maskattn::cli
