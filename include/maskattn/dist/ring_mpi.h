// Ring attention over MPI (built with -DMASKATTN_WITH_MPI=ON, target maskattn::distributed).
// Every rank passes its local shards (the rows local_ranges() gives it, stacked in that order)
// and the same global mask and modifiers; K/V travel around the ring with non-blocking sends,
// overlapped with compute. Bad input on any rank fails every rank with the same Error.
//
// Collective over `comm`: every rank calls with the same global problem (lengths, mask, modifiers,
// options). Call from the thread that initialised MPI; with MPI_Init_thread at
// MPI_THREAD_FUNNELED or above a worker thread computes while this one progresses the messages
// (overlap); below it the ring computes, then waits (no overlap, same results). The results are
// the same bits as ring_emulation's rows of this rank, for any thread count.
#pragma once

#include <mpi.h>

#include "maskattn/ring.h"

namespace maskattn::dist {

// q [B,Hq,nq,D], k [B,Hkv,nk,D], v [B,Hkv,nk,Dv], out [B,Hq,nq,Dv], lse [B,Hq,nq] (optional):
// this rank's rows. global_q_len / global_k_len: the whole sequence lengths (N).
void ring_attention(MPI_Comm comm, int64_t global_q_len, int64_t global_k_len, const TensorView& q,
                    const TensorView& k, const TensorView& v, const MutableTensorView& out,
                    const Mask& mask = {}, const ScoreMods& mods = {},
                    const RingOptions& options = {}, const MutableTensorView& lse = {},
                    RingStats* stats = nullptr);

void ring_attention_backward(MPI_Comm comm, int64_t global_q_len, int64_t global_k_len,
                             const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const TensorView& dout,
                             const Gradients& grads, const Mask& mask = {},
                             const ScoreMods& mods = {}, const RingOptions& options = {},
                             RingStats* stats = nullptr);

}  // namespace maskattn::dist
