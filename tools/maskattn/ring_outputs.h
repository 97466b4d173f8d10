// The output files of a `--ring` command: the same files, with the same all-or-nothing promise,
// as OutputFiles gives the single-process command (output_files.h), written by P processes.
//
// Rank 0 creates each output under a temporary name next to its destination, with its full
// header and size (blocks reserved, so a full disk fails here), and tells every rank the name;
// each rank then writes its own rows in place (ring_rows.h); commit() waits until every rank has
// written and rank 0 renames the files. Any rank's failure fails every rank (ring_agreement.h),
// and rank 0 removes the temporaries.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "maskattn/npy.h"
#include "maskattn/ring.h"
#include "npy_tensors.h"

namespace maskattn::cli {

class RingOutputs {
 public:
  explicit RingOutputs(MPI_Comm comm);
  RingOutputs(const RingOutputs&) = delete;
  RingOutputs& operator=(const RingOutputs&) = delete;
  ~RingOutputs();

  // Collective: creates the output `path` holding `file_shape` of `file_type`, whose elements in
  // C order are those of the [B,H,L,W] `shape`. Returns its index for write().
  size_t add(const std::string& flag, const std::string& path, NpyType file_type,
             const Dims& file_shape, const Dims& shape);
  // Local: writes this rank's rows `rows` of output `index` from `local` ([B,H,n,W]). Run the
  // writes through on_every_rank, whose agreement is also the barrier commit() needs.
  void write(size_t index, const TensorBuffer& local, const std::vector<dist::RowRange>& rows);
  // Collective, once every rank's writes have returned: rank 0 renames every file to its
  // destination.
  void commit();

 private:
  struct Output {
    std::string flag, path, temporary;
    NpyType file_type = NpyType::f4;
    Dims shape;
    size_t header_bytes = 0;
  };
  MPI_Comm comm_;
  int rank_ = 0;
  std::vector<Output> outputs_;
  bool committed_ = false;
};

}  // namespace maskattn::cli
