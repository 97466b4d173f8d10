// Variable-length (packed) attention: FlashAttention's `cu_seqlens` entry point.
//
// B sequences of different lengths are packed one after another along the token axis, with no
// padding:
//
//   q [total_q, Hq, D]   k [total_k, Hkv, D]   v [total_k, Hkv, Dv]   →   out [total_q, Hq, Dv]
//   lse (optional) [Hq, total_q] f32 (FlashAttention's varlen softmax_lse layout)
//
// Sequence i owns query rows [cu_seqlens_q[i], cu_seqlens_q[i+1]) and key rows
// [cu_seqlens_k[i], cu_seqlens_k[i+1]); its queries attend to its own keys only. Lq_i or Lk_i may
// be 0 (a sequence with no keys gives out = 0 and LSE = −inf, or the sink, as attention() does).
//
// The mask and the modifiers are those of a padded batch [B, Hq, max_seqlen_q, max_seqlen_k]:
// sequence i is batch entry i, rows [0, Lq_i) and columns [0, Lk_i) of it (docs/semantics.md §19).
// The contract, tested bit for bit: the rows of sequence i are exactly what attention() returns
// when called on sequence i alone (a [1, Hq, Lq_i, D] problem) with the mask and modifiers
// restricted to that batch entry — alignment from the sequence's own Lq_i and Lk_i (a draft tree's
// too: its draft is the sequence's own last T rows), programs, predicates and score_fn seeing
// b = i, dropout drawing with b = i (Dropout::batch_offset).
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn {

// FlashAttention's varlen arguments, with its names. cu_seqlens_q and cu_seqlens_k hold B + 1
// cumulative offsets: 0 first, non-decreasing, the last equal to total_q (total_k). max_seqlen_q
// and max_seqlen_k bound every sequence's length; they set the padded batch the mask describes.
struct Varlen {
  std::vector<int64_t> cu_seqlens_q;
  std::vector<int64_t> cu_seqlens_k;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;

  int64_t batch() const { return static_cast<int64_t>(cu_seqlens_q.size()) - 1; }
};

// out = attention of each sequence over its own keys (above). Options as for attention(), except
// `frame` (a varlen call is the whole problem). Throws maskattn::Error before writing anything on
// invalid input (docs/errors.md E136–E139 for the varlen arguments; the usual codes otherwise).
// Bitwise identical for any thread count. Work is planned over sequences: long ones run one at a
// time on every thread, short ones side by side, one thread each.
void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const MutableTensorView& out, const Varlen& varlen, const Mask& mask = {},
                      const ScoreMods& mods = {}, const Options& options = {},
                      const MutableTensorView& lse = {});

// The gradients of attention_varlen (attention_backward per sequence): dq [total_q, Hq, D],
// dk [total_k, Hkv, D], dv [total_k, Hkv, Dv]; `out` and `lse` are what attention_varlen returned.
// A key no query sees (a sequence with Lq_i = 0 included) gets dk = dv = 0. grads.dsinks,
// grads.dbias and grads.dtables are summed over the sequences in sequence order.
void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const Varlen& varlen, const Gradients& grads, const Mask& mask = {},
                               const ScoreMods& mods = {}, const Options& options = {});

// The mask and modifiers of sequence `i` alone, as attention_varlen applies them: batch entry i
// of the padded batch, cut to Lq_i × Lk_i. (attention() on sequence i with these equals the
// sequence's rows of attention_varlen, bit for bit.) Checks the varlen arguments as the calls do.
struct SequenceProblem {
  Mask mask;
  ScoreMods mods;
  Options options;  // dropout.batch_offset = i
};
SequenceProblem varlen_sequence(const Varlen& varlen, int64_t i, const Mask& mask,
                                const ScoreMods& mods, const Options& options = {});

}  // namespace maskattn
