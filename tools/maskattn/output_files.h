// The CLI's output .npy files: either every requested file appears or none does, and a result is
// computed straight into its file instead of being copied there afterwards.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "maskattn/npy.h"
#include "maskattn/tensor.h"

namespace maskattn::cli {

// Each output is created at once under a temporary name next to its destination (so that the
// final rename is atomic), sized for its header and data (the blocks are reserved, so a full disk
// is an error here, not a crash while writing) and memory-mapped. commit() renames them all;
// destroying an uncommitted set removes them.
class OutputFiles {
 public:
  OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles();

  // Registers the output `path` (`flag` names it in messages): a .npy of `file_type` and
  // `file_shape`. Returns where the computation writes its result, `dtype` elements of `shape`
  // (the same number, in the same order). When the file holds `dtype`, that is the mapped file
  // itself; otherwise it is a buffer converted into the file by commit(). If the temporary
  // cannot be made, the buffer is used too and commit() reports why: the computation's own
  // errors come first, as when the files were written after it.
  MutableTensorView add(const std::string& flag, const std::string& path, NpyType file_type,
                        const Dims& file_shape, DType dtype, const Dims& shape);
  // Throws Error naming the path that failed ("cannot write '…': …"); nothing is left behind.
  void commit();

 private:
  struct Output;
  std::vector<std::unique_ptr<Output>> outputs_;
  bool committed_ = false;
};

// Throws if two of the (flag, path) outputs are the same file.
void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace maskattn::cli
