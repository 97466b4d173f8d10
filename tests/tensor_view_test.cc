// Strided views: contiguous strides, [B,L,H,D] layouts, rank and stride checks.
#include "test_util.h"

namespace maskattn {
namespace {

TEST(TensorView, ContiguousViewHasRowMajorStrides) {
  std::vector<float> data(2 * 3 * 4 * 5);
  const TensorView view(data.data(), {2, 3, 4, 5});
  EXPECT_EQ(view.strides(), (Dims{60, 20, 5, 1}));
  EXPECT_EQ(view.numel(), 120);
  EXPECT_EQ(view.dtype(), DType::f32);
  EXPECT_EQ(view.offset({1, 2, 3, 4}), 119);
  EXPECT_EQ(view.shape_string(), "[2,3,4,5]");
  EXPECT_FALSE(view.is_null());
  EXPECT_TRUE(TensorView().is_null());
}

TEST(TensorView, BlhdLayoutIsSeenAsBhld) {
  std::vector<float16> data(2 * 7 * 3 * 4);
  const TensorView view = TensorView::from_blhd(data.data(), 2, 7, 3, 4);
  EXPECT_EQ(view.sizes(), (Dims{2, 3, 7, 4}));
  // Element (b=1, h=2, l=5, d=3) lives at ((1·7 + 5)·3 + 2)·4 + 3 in the [B,L,H,D] buffer.
  EXPECT_EQ(view.offset({1, 2, 5, 3}), ((1 * 7 + 5) * 3 + 2) * 4 + 3);
  EXPECT_EQ(view.dtype(), DType::f16);
}

TEST(TensorView, RankThreeViewForLse) {
  std::vector<float> data(24);
  MutableTensorView lse(data.data(), {2, 3, 4});
  EXPECT_EQ(lse.rank(), 3);
  EXPECT_EQ(lse.offset({1, 1, 1, 99}), 12 + 4 + 1);  // the 4th index is ignored
  EXPECT_EQ(lse.mutable_data(), data.data());
}

TEST(TensorView, RejectsBadRanksAndStrideCounts) {
  float x = 0;
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{}), "rank 0");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{1, 1, 1, 1, 1}), "[1,1,1,1,1]", "rank 5");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{2, 2}, Dims{1}), "[2,2]", "1 strides");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{2, -1}), "negative");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{1ll << 40, 1ll << 40}), "more elements than int64");
}

}  // namespace
}  // namespace maskattn
