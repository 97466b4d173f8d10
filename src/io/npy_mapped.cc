// .npy files used in place through POSIX mmap. A mapping costs no memory up front: the kernel
// loads a page of the file when it is first read (and may drop it again under memory pressure,
// since the file holds it), so a 64 MiB input does not become a 64 MiB heap copy.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "maskattn/npy.h"
#include "npy_internal.h"

namespace maskattn {
namespace {

std::string errno_text(int error) {
  return std::generic_category().message(error);
}

// Closes a descriptor on every path out of open_read_only; the mapping outlives it.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile MappedFile::open_read_only(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as non-regular.
  const FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) throw Error("cannot open '" + path + "': " + errno_text(errno));
  struct stat status {};
  if (::fstat(file.fd, &status) != 0) {
    throw Error("cannot read '" + path + "': " + errno_text(errno));
  }
  if (S_ISDIR(status.st_mode)) throw Error("cannot read '" + path + "': " + errno_text(EISDIR));
  if (!S_ISREG(status.st_mode)) {
    throw Error("cannot read '" + path + "': " + errno_text(ENOTSUP) + " (not a regular file)");
  }
  MappedFile mapped;
  mapped.size_ = static_cast<size_t>(status.st_size);
  if (mapped.size_ == 0) return mapped;  // nothing to map; parsing reports the empty file
  void* address = ::mmap(nullptr, mapped.size_, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (address == MAP_FAILED) throw Error("cannot read '" + path + "': " + errno_text(errno));
  mapped.data_ = static_cast<uint8_t*>(address);
  return mapped;
}

MappedFile MappedFile::map_writable(int fd, size_t size, const std::string& path) {
  MappedFile mapped;
  mapped.size_ = size;
  if (size == 0) return mapped;
  void* address = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) throw Error("cannot map '" + path + "': " + errno_text(errno));
  mapped.data_ = static_cast<uint8_t*>(address);
  return mapped;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

MappedNpy::MappedNpy(const std::string& path)
    : path_(path),
      file_(MappedFile::open_read_only(path)),
      layout_(parse_npy_layout(file_.data(), file_.size(), path)) {
  // read_npy refuses bool bytes other than 0 and 1; so must the data handed out in place. (In
  // Fortran order there is none: to_array() checks the transposed copy, as read_npy does.)
  const uint8_t* bools = layout_.type == NpyType::b1 ? c_order_data() : nullptr;
  if (bools != nullptr) npy_detail::check_bools(bools, layout_.data_size, path_);
}

const uint8_t* MappedNpy::c_order_data() const {
  if (layout_.fortran_order && layout_.shape.size() > 1) return nullptr;
  const uint8_t* data = file_.data() + layout_.data_offset;
  // Mapping starts on a page boundary, so the data is aligned as its offset in the file is.
  if (layout_.data_offset % npy_type_size(layout_.type) != 0) return nullptr;
  return data;
}

NpyArray MappedNpy::to_array() const {
  require_memory(static_cast<double>(layout_.data_size), "reading '" + path_ + "'");
  return npy_detail::array_from_layout(file_.data(), layout_, path_);
}

}  // namespace maskattn
