// The .npy parser on arbitrary bytes: it must return an array or throw maskattn::Error, never
// crash, read out of bounds or allocate without bound; a parsed array must survive serialisation,
// parse back to the same array, and convert to float32 or throw Error.
//
// The same bytes are also read as a file through MappedNpy (the CLI's memory-mapped inputs): it
// must accept exactly what parse_npy accepts, with the same message when it refuses, and the data
// it hands out in place must be the bytes parse_npy returns.
#include <sys/mman.h>  // memfd_create
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/npy.h"

namespace {

using namespace maskattn;

// The bytes as a file that needs no disk: an anonymous memory file, named through /proc.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(::memfd_create("npy_fuzzer", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t wrote = ::write(fd_, data + done, size - done);
      if (wrote <= 0) std::abort();
      done += static_cast<size_t>(wrote);
    }
  }
  ~MemoryFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// parse_npy's verdict on the bytes: the array, or the message of its Error.
struct Verdict {
  bool parsed = false;
  NpyArray array;
  std::string error;
};

void check_mapped_reader(const MemoryFile& file, const Verdict& expected) {
  std::string error;
  try {
    const MappedNpy mapped(file.path());
    const NpyArray copy = mapped.to_array();
    if (!expected.parsed || copy.shape() != expected.array.shape() ||
        copy.type() != expected.array.type() || copy.bytes() != expected.array.bytes()) {
      std::abort();  // the mapped reader accepted what parse_npy refused, or read other values
    }
    const uint8_t* in_place = mapped.c_order_data();
    if (in_place != nullptr && mapped.layout().data_size > 0 &&
        std::memcmp(in_place, copy.bytes().data(), mapped.layout().data_size) != 0) {
      std::abort();  // the in-place data differs from the C-order copy
    }
    return;
  } catch (const Error& failure) {
    error = failure.what();
  }
  // The messages name the file; parse_npy was given the same name.
  if (expected.parsed || error != expected.error) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  Verdict verdict;
  try {
    verdict.array = parse_npy(data, size, file.path());  // the name the mapped reader will use
    verdict.parsed = true;
    const std::vector<uint8_t> bytes = serialize_npy(verdict.array);
    const NpyArray again = parse_npy(bytes.data(), bytes.size(), "again.npy");
    if (again.shape() != verdict.array.shape() || again.type() != verdict.array.type() ||
        again.bytes() != verdict.array.bytes()) {
      std::abort();  // serialize ∘ parse must be the identity on what parses
    }
    try {
      (void)verdict.array.to_float32("fuzz");
    } catch (const Error&) {
    }
  } catch (const Error& error) {
    verdict.error = error.what();
  }
  check_mapped_reader(file, verdict);
  return 0;
}
