// Input checks shared by the emulator and the MPI ring. Everything a call of the ring could
// reject is checked before the first message: the shapes against the rows local_ranges() gives
// the rank, then one 1 × 1 "probe" call of attention()/attention_backward() on the first rows in
// the global frame, into scratch outputs, which runs the library's own checks of the mask,
// modifiers, options, dtypes and head counts. (A NaN found by check_finite in a later slice can
// still fail mid-ring; the MPI code keeps exchanging and agrees on that error at the end.)
#pragma once

#include <cstdint>
#include <string>

#include "maskattn/attention.h"
#include "ring/ring_schedule.h"

namespace maskattn::dist::detail {

struct RingInputs {
  TensorView q, k, v, out, lse, dout;  // out/dout/lse null when not given
  Gradients grads;                     // backward only
};

// `who` names the entry point in messages; q_rows/k_rows are the rows this caller must hold,
// q_first/k_first the global index of its first query/key row.
void check_ring_options(const char* who, const RingOptions& options);
void check_forward_inputs(const char* who, const RingInputs& in, const Mask& mask,
                          const ScoreMods& mods, const RingOptions& options, int64_t q_rows,
                          int64_t k_rows, int64_t q_first, int64_t k_first, int64_t q_len,
                          int64_t k_len);
void check_backward_inputs(const char* who, const RingInputs& in, const Mask& mask,
                           const ScoreMods& mods, const RingOptions& options, int64_t q_rows,
                           int64_t k_rows, int64_t q_first, int64_t k_first, int64_t q_len,
                           int64_t k_len);

}  // namespace maskattn::dist::detail
