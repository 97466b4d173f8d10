// Catalogue rows of varlen attention (docs/errors.md E136–E139): each bad argument raises before
// anything is written.
#include <gtest/gtest.h>

#include <vector>

#include "maskattn/varlen.h"
#include "test_util.h"

namespace maskattn {
namespace {

// Two sequences: Lq = 2, 3 and Lk = 4, 1; Hq = 2, Hkv = 1, D = 4, Dv = 3.
struct Packed {
  std::vector<float> q = test::random_values(5 * 2 * 4, 1), k = test::random_values(5 * 4, 2),
                     v = test::random_values(5 * 3, 3), out = std::vector<float>(5 * 2 * 3, -7.0f),
                     lse = std::vector<float>(2 * 5, -7.0f);
  Varlen varlen{{0, 2, 5}, {0, 4, 5}, 3, 4};

  void call(const Varlen& with, const Mask& mask = {}, const Options& options = {}) {
    attention_varlen(TensorView(q.data(), {5, 2, 4}), TensorView(k.data(), {5, 1, 4}),
                     TensorView(v.data(), {5, 1, 3}), MutableTensorView(out.data(), {5, 2, 3}),
                     with, mask, {}, options, MutableTensorView(lse.data(), {2, 5}));
  }
  bool untouched() const { return out[0] == -7.0f && lse[0] == -7.0f; }
};

TEST(Errors, E136_CuSeqlensMalformed) {
  Packed p;
  EXPECT_MASKATTN_ERROR(p.call({{1, 2, 5}, {0, 4, 5}, 3, 4}),
                        "cu_seqlens_q [1,2,5] starts at 1; the first offset must be 0");
  EXPECT_MASKATTN_ERROR(p.call({{0, 4, 2, 5}, {0, 1, 4, 5}, 3, 4}),
                        "cu_seqlens_q [0,4,2,5] decreases at [2]");
  EXPECT_MASKATTN_ERROR(p.call({{}, {0, 4, 5}, 3, 4}), "cu_seqlens_q is empty");
  EXPECT_MASKATTN_ERROR(p.call({{0, 2, 5}, {0, 1, 4, 5}, 3, 4}),
                        "cu_seqlens_q has 3 offsets (B = 2) but cu_seqlens_k has 4 (B = 3)");
  EXPECT_TRUE(p.untouched());
}

TEST(Errors, E137_CuSeqlensDoNotEndAtTheTotal) {
  Packed p;
  EXPECT_MASKATTN_ERROR(p.call({{0, 2, 4}, {0, 4, 5}, 3, 4}),
                        "cu_seqlens_q ends at 4 but q has 5 rows");
  EXPECT_MASKATTN_ERROR(p.call({{0, 2, 5}, {0, 4, 6}, 3, 4}),
                        "cu_seqlens_k ends at 6 but k has 5 rows");
  EXPECT_TRUE(p.untouched());
}

TEST(Errors, E138_LengthsBeyondMaxSeqlenOrTheSequence) {
  Packed p;
  EXPECT_MASKATTN_ERROR(p.call({{0, 2, 5}, {0, 4, 5}, 2, 4}), "sequence 1 has Lq = 3",
                        "max_seqlen_q = 2");
  EXPECT_MASKATTN_ERROR(p.call({{0, 2, 5}, {0, 4, 5}, 3, -1}), "max_seqlen_k = -1 is negative");
  EXPECT_MASKATTN_ERROR(p.call(p.varlen, Mask().key_lengths({4, 3})),
                        "key_lengths[1] = 3 exceeds sequence 1's own Lk = 1");
  EXPECT_MASKATTN_ERROR(p.call(p.varlen, Mask().query_starts({3, 0})),
                        "query_starts[0] = 3 exceeds sequence 0's own Lq = 2");
  EXPECT_MASKATTN_ERROR(p.call(p.varlen, Mask().tree(std::vector<int64_t>{-1, 0})),
                        "tree[2]: the draft of T=2 tokens is longer than sequence 1's own Lk = 1 "
                        "(cu_seqlens_k); in a varlen call each sequence's draft is its own last T "
                        "keys");
  EXPECT_TRUE(p.untouched());
  EXPECT_MASKATTN_ERROR(varlen_sequence(p.varlen, 1, Mask().tree(std::vector<int64_t>{-1, 0}), {}),
                        "tree[2]: the draft of T=2 tokens is longer than sequence 1's own Lk = 1");
}

TEST(Errors, E139_PackedShapesAndOptions) {
  Packed p;
  EXPECT_MASKATTN_ERROR(
      attention_varlen(TensorView(p.q.data(), {1, 5, 2, 4}), TensorView(p.k.data(), {5, 1, 4}),
                       TensorView(p.v.data(), {5, 1, 3}),
                       MutableTensorView(p.out.data(), {5, 2, 3}), p.varlen),
      "q has shape [1,5,2,4]; a varlen call expects [total_q, Hq, D]");
  EXPECT_MASKATTN_ERROR(
      attention_varlen(TensorView(p.q.data(), {5, 2, 4}), TensorView(p.k.data(), {5, 1, 4}),
                       TensorView(p.v.data(), {5, 1, 3}),
                       MutableTensorView(p.out.data(), {5, 3, 2}), p.varlen),
      "out has shape [5,3,2] but must be [5,2,3]");
  EXPECT_MASKATTN_ERROR(
      attention_varlen(TensorView(p.q.data(), {5, 2, 4}), TensorView(p.k.data(), {5, 1, 4}),
                       TensorView(p.v.data(), {5, 1, 3}),
                       MutableTensorView(p.out.data(), {5, 2, 3}), p.varlen, {}, {}, {},
                       MutableTensorView(p.lse.data(), {5, 2})),
      "lse has shape [5,2] but must be [2,5]");
  Options options;
  options.frame = Frame{0, 0, 10, 10};
  EXPECT_MASKATTN_ERROR(p.call(p.varlen, {}, options), "options.frame is set");
  EXPECT_TRUE(p.untouched());
}

}  // namespace
}  // namespace maskattn
