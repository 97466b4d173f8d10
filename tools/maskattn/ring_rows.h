// A ring rank's share of the .npy files (maskattn attend/grad --ring): it reads only its own
// rows of each input and writes only its own rows of each output, so P processes started by
// mpirun work on the same files as the single-process command, each touching 1/P of them.
//
// The rows are those dist::local_ranges() gives the rank along the sequence axis (L of
// [B,H,L,D]): one range for the contiguous layout, two for zigzag. Locally they are stacked in
// that order, as the ring expects its shards.
#pragma once

#include <string>
#include <vector>

#include "maskattn/npy.h"
#include "maskattn/ring.h"
#include "npy_tensors.h"

namespace maskattn::cli {

// The rank's rows of `input` ([B,H,L,D] as load_input sees it) as a contiguous [B,H,n,D] buffer
// in `dtype`, each value rounded once as ComputeInput rounds it. The file stays memory-mapped:
// only the pages of these rows are read.
TensorBuffer read_rows(const InputTensor& input, const std::vector<dist::RowRange>& rows,
                       DType dtype);

// Writes `local` ([B,H,n,W], the rank's rows stacked) into the .npy file at `path`, which holds
// [B,H,L,W] (or its [L,W] / [B,L,W] layout) of `file_type` after a header of `header_bytes`:
// each (b, h, range) is one contiguous run of the file, written in place (pwrite), converted to
// the file's element type. Throws Error "cannot write '…': …".
void write_rows(const std::string& path, size_t header_bytes, NpyType file_type,
                const Dims& global_shape, const TensorBuffer& local,
                const std::vector<dist::RowRange>& rows);

}  // namespace maskattn::cli
