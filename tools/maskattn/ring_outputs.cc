#include "ring_outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "maskattn/error.h"
#include "ring_agreement.h"
#include "ring_rows.h"

namespace maskattn::cli {

namespace {

// Rank 0's part of add(): the temporary file, sized, with its header. Returns its name.
std::string create_temporary(const std::string& path, const std::vector<uint8_t>& header,
                             size_t data_bytes) {
  std::string name = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  // mkstemp creates the file 0600; give the output the permissions a plain create would.
  const mode_t creation_mask = ::umask(0);
  ::umask(creation_mask);
  ::fchmod(fd, 0666 & ~creation_mask);
  const auto fail = [&](int code) {
    ::close(fd);
    std::remove(name.c_str());
    throw Error("cannot write '" + path + "': " + std::strerror(code));
  };
  const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(header.size() + data_bytes));
  if (reserved != 0) fail(reserved);
  if (::pwrite(fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    fail(errno != 0 ? errno : EIO);
  }
  if (::close(fd) != 0) fail(errno);
  return name;
}

}  // namespace

RingOutputs::RingOutputs(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm, &rank_);
}

RingOutputs::~RingOutputs() {
  if (committed_ || rank_ != 0) return;
  for (const Output& output : outputs_) {
    if (!output.temporary.empty()) std::remove(output.temporary.c_str());
  }
}

size_t RingOutputs::add(const std::string& flag, const std::string& path, NpyType file_type,
                        const Dims& file_shape, const Dims& shape) {
  Output output{flag, path, "", file_type, shape, 0};
  const std::vector<uint8_t> header = serialize_npy_header(file_type, file_shape);
  output.header_bytes = header.size();
  on_every_rank(comm_, [&] {
    if (rank_ != 0) return;
    const size_t data_bytes =
        static_cast<size_t>(checked_numel(file_shape, flag)) * npy_type_size(file_type);
    output.temporary = create_temporary(path, header, data_bytes);
  });
  int length = static_cast<int>(output.temporary.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm_);
  output.temporary.resize(static_cast<size_t>(length));
  MPI_Bcast(output.temporary.data(), length, MPI_CHAR, 0, comm_);
  outputs_.push_back(std::move(output));
  return outputs_.size() - 1;
}

void RingOutputs::write(size_t index, const TensorBuffer& local,
                        const std::vector<dist::RowRange>& rows) {
  const Output& output = outputs_.at(index);
  write_rows(output.temporary, output.header_bytes, output.file_type, output.shape, local, rows);
}

void RingOutputs::commit() {
  on_every_rank(comm_, [&] {
    if (rank_ != 0) return;
    for (size_t n = 0; n < outputs_.size(); ++n) {
      if (std::rename(outputs_[n].temporary.c_str(), outputs_[n].path.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        for (size_t m = 0; m < n; ++m) std::remove(outputs_[m].path.c_str());
        for (size_t m = n; m < outputs_.size(); ++m) std::remove(outputs_[m].temporary.c_str());
        committed_ = true;  // nothing left to remove
        throw Error("cannot write '" + outputs_[n].path + "': " + reason);
      }
    }
    committed_ = true;
  });
}

}  // namespace maskattn::cli
