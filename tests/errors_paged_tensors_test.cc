// The bad-input catalogue's rows for attention over caller-owned pages (maskattn/paged_tensors.h;
// docs/errors.md E154–E156), compiled into the errors_test binary. Each call raises before
// writing anything.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "test_util.h"

namespace maskattn {
namespace {

// Two sequences (lengths 20 and 5) in a pool of 4 blocks of 16 positions, 2 kv heads, D = 8.
struct Pages {
  std::vector<float> keys = std::vector<float>(4 * 16 * 2 * 8, 0.25f);
  std::vector<float> values = std::vector<float>(4 * 16 * 2 * 8, 0.5f);
  std::vector<int32_t> table = {2, 0, 3, -1};  // [2][2]
  std::vector<float> q = std::vector<float>(2 * 4 * 3 * 8, 0.1f);
  std::vector<float> out = std::vector<float>(2 * 4 * 3 * 8, -7.0f);

  PagedTensors view() const {
    PagedTensors kv;
    kv.keys = TensorView(keys.data(), {4, 16, 2, 8});
    kv.values = TensorView(values.data(), {4, 16, 2, 8});
    kv.block_table = table.data();
    kv.table_columns = 2;
    kv.lengths = {20, 5};
    return kv;
  }
  TensorView qv() const { return TensorView(q.data(), {2, 4, 3, 8}); }
  MutableTensorView ov() { return MutableTensorView(out.data(), {2, 4, 3, 8}); }
};

TEST(Errors, E154_PagesThatDoNotFitEachOtherOrQ) {
  Pages p;
  PagedTensors kv = p.view();
  std::vector<uint16_t> half(p.values.size());
  kv.values = TensorView(half.data(), DType::f16, {4, 16, 2, 8});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "values have dtype f16 but keys f32; the two pools share one element type");
  kv = p.view();
  kv.values = TensorView(p.values.data(), {2, 16, 2, 8});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "keys and values differ in [num_blocks,block_size,Hkv] (keys [4,16,2,8], "
                        "values [2,16,2,8])");
  kv = p.view();
  kv.keys = TensorView(p.keys.data(), {8, 8, 2, 8});
  kv.values = TensorView(p.values.data(), {8, 8, 2, 8});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "block_size 8 must be a positive multiple of 16");
  kv = p.view();
  kv.keys = TensorView(p.keys.data(), {4, 16, 2, 8}, {256, 16, 1, 2});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()), "the last axis must have stride 1");
  kv = p.view();
  kv.keys = TensorView(p.keys.data(), {4, 16, 3, 8}, {256, 16, 0, 1});
  kv.values = TensorView(p.values.data(), {4, 16, 3, 8}, {256, 16, 0, 1});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "q [2,4,3,8] does not fit pools of 3 kv heads of dim 8");
  kv = p.view();
  kv.keys = TensorView(p.keys.data(), {4, 16, 8});
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "keys has shape [4,16,8]; expected [num_blocks,block_size,Hkv,D]");
  EXPECT_EQ(p.out[0], -7.0f);
}

TEST(Errors, E155_BlockTableAndLengthsThatDoNotHoldTheSequences) {
  Pages p;
  PagedTensors kv = p.view();
  kv.lengths = {20};
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "lengths has 1 values but q has a batch of 2");
  kv.lengths = {33, 5};
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "lengths[0] = 33 must be in [0, table_columns·block_size] = [0, 32]");
  kv.lengths = {20, -1};
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()), "lengths[1] = -1 must be in");
  kv.lengths = {20, 17};  // the second block of sequence 1 is −1
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "block_table[1][1] = -1 is not a block of the pools [0, 4) but holds "
                        "positions of a sequence of length 17");
  p.table[1] = 4;
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), p.view(), p.ov()),
                        "block_table[0][1] = 4 is not a block of the pools [0, 4)");
  kv = p.view();
  kv.block_table = nullptr;
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), kv, p.ov()),
                        "block_table is null but lengths[0] = 20");
  EXPECT_EQ(p.out[0], -7.0f);
}

TEST(Errors, E156_QueryLengthsOutsideLq) {
  Pages p;
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), p.view(), p.ov(), {3}),
                        "query_lengths has 1 values but q [2,4,3,8] has a batch of 2");
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), p.view(), p.ov(), {3, 4}),
                        "query_lengths[1] = 4 must be in [0, Lq] = [0, 3] (q [2,4,3,8])");
  EXPECT_MASKATTN_ERROR(attention_paged(p.qv(), p.view(), p.ov(), {-1, 2}),
                        "query_lengths[0] = -1 must be in [0, Lq] = [0, 3]");
  EXPECT_EQ(p.out[0], -7.0f);
}

// The tree rule of attention_paged (E148) holds over caller-owned pages too: every sequence must
// hold the draft's T positions.
TEST(Errors, E148_PagedTensorsDraftTrees) {
  Pages p;
  EXPECT_MASKATTN_ERROR(
      attention_paged(p.qv(), p.view(), p.ov(), {}, Mask().tree({-1, 0, 1, 2, 3, 4})),
      "attention_paged(PagedTensors): lengths[1] = 5, fewer than the 6 draft tokens of tree[6]: "
      "each sequence's draft is its own last T positions, already appended");
  EXPECT_EQ(p.out[0], -7.0f);
}

}  // namespace
}  // namespace maskattn
