// Dense keep / blocked / additive masks: polarity and NumPy broadcasting to [B, Hq, Lq, Lk].
#include <cmath>

#include "test_util.h"

namespace maskattn {
namespace {

using test::grid;
using Rows = std::vector<std::string>;

TEST(DenseKeep, PaddingRowBroadcastsFromB111S) {
  // HF-style key padding as a [B,1,1,S] bool tensor.
  const Mask mask = Mask().keep(Array<uint8_t>({2, 1, 1, 4}, {1, 1, 0, 0, 1, 1, 1, 0}));
  const MaskShape shape = {2, 3, 2, 4};
  EXPECT_EQ(grid(mask, shape, 0, 2), (Rows{"11..", "11.."}));
  EXPECT_EQ(grid(mask, shape, 1, 0), (Rows{"111.", "111."}));
}

TEST(DenseBlocked, IsTheOppositePolarity) {
  const Array<uint8_t> upper({3, 3}, {0, 1, 1, 0, 0, 1, 0, 0, 0});  // triu(ones, 1): the seeds
  EXPECT_EQ(grid(Mask().blocked(upper), {1, 1, 3, 3}), grid(Mask().causal(), {1, 1, 3, 3}));
  EXPECT_EQ(grid(Mask().keep(upper), {1, 1, 3, 3}), (Rows{".11", "..1", "..."}));
}

TEST(DenseBroadcast, EveryAxisMayBeOneOrFull) {
  const int64_t B = 2, H = 3, Lq = 2, Lk = 3;
  const int64_t full[4] = {B, H, Lq, Lk};
  for (int pattern = 0; pattern < 16; ++pattern) {
    for (int rank = 1; rank <= 4; ++rank) {
      Dims shape;
      for (int axis = 4 - rank; axis < 4; ++axis) {
        shape.push_back((pattern >> axis) & 1 ? full[axis] : 1);
      }
      const int64_t count = checked_numel(shape, "test");
      std::vector<uint8_t> values(count);
      for (int64_t n = 0; n < count; ++n) values[n] = (n * 7 + 3) % 5 < 3;
      const Array<uint8_t> allowed =
          allowed_pairs(Mask().keep(Array<uint8_t>(shape, values)), {B, H, Lq, Lk});
      // Broadcast by hand: index each source axis with 0 where its size is 1.
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < Lq; ++i) {
            for (int64_t j = 0; j < Lk; ++j) {
              const int64_t index[4] = {b, h, i, j};
              int64_t flat = 0;
              for (int axis = 4 - rank; axis < 4; ++axis) {
                const int64_t size = shape[axis - (4 - rank)];
                flat = flat * size + (size == 1 ? 0 : index[axis]);
              }
              const int64_t n = ((b * H + h) * Lq + i) * Lk + j;
              ASSERT_EQ(allowed.values()[n], values[flat])
                  << "shape " << shape_string(shape) << " at " << b << h << i << j;
            }
          }
        }
      }
    }
  }
}

TEST(DenseBroadcast, ScalarMaskBroadcastsEverywhere) {
  EXPECT_EQ(grid(Mask().keep(Array<uint8_t>({}, {0})), {1, 1, 2, 2}), (Rows{"..", ".."}));
}

TEST(DenseBroadcast, MismatchNamesBothShapes) {
  const Mask mask = Mask().keep(Array<uint8_t>({8, 256}, std::vector<uint8_t>(8 * 256, 1)));
  EXPECT_MASKATTN_ERROR(allowed_pairs(mask, {8, 12, 256, 256}),
                        "keep mask shape [8,256] does not broadcast to scores [8,12,256,256]");
  // Through attention() with real tensors.
  std::vector<float> q(8 * 12 * 256), v(8 * 12 * 256), out(8 * 12 * 256);
  const TensorView qv(q.data(), {8, 12, 256, 1});
  EXPECT_MASKATTN_ERROR(attention(qv, qv, TensorView(v.data(), {8, 12, 256, 1}),
                                  MutableTensorView(out.data(), {8, 12, 256, 1}), mask),
                        "keep mask shape [8,256] does not broadcast to scores [8,12,256,256]");
  // An (N, L, S) mask with H > 1 aligns N with H and fails (pytorch#177482): said plainly.
  const Mask nls = Mask().keep(Array<uint8_t>({2, 4, 4}, std::vector<uint8_t>(32, 1)));
  EXPECT_MASKATTN_ERROR(allowed_pairs(nls, {2, 3, 4, 4}), "[2,4,4]", "[2,3,4,4]");
}

TEST(DenseAdditive, MinusInfinityHidesFiniteValuesDoNot) {
  const float inf = INFINITY;
  const Mask mask = Mask().additive(Array<float>({2, 2}, {0, -inf, -1e9f, 0}));
  EXPECT_EQ(grid(mask, {1, 1, 2, 2}), (Rows{"1.", "11"}));
}

TEST(DenseAdditive, FiniteValuesAreAddedExactly) {
  // Scores of the worked example's last row [0.5, 0.5, 1.0] plus [-2, 0, -1e9]: the weights are
  // softmax([-1.5, 0.5, 1 - 1e9]) computed in f64, and the -1e9 key is not hidden, it just gets
  // exp(-1e9) = 0 in f64 arithmetic.
  const std::vector<float> x = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0};
  const TensorView q(x.data() + 8, {1, 1, 1, 4});
  const TensorView k(x.data(), {1, 1, 3, 4});
  std::vector<float> weights(3);
  attention_weights(q, k, MutableTensorView(weights.data(), {1, 1, 1, 3}),
                    Mask().additive(Array<float>({3}, {-2.0f, 0.0f, -1e9f})));
  const double e0 = std::exp(-1.5), e1 = std::exp(0.5), e2 = std::exp(1.0 - 1e9);
  EXPECT_FLOAT_EQ(weights[0], static_cast<float>(e0 / (e0 + e1 + e2)));
  EXPECT_FLOAT_EQ(weights[1], static_cast<float>(e1 / (e0 + e1 + e2)));
  EXPECT_EQ(weights[2], 0.0f);
}

TEST(DenseAdditive, RowOfFiniteSentinelsGetsUniformWeightsNotZeros) {
  // Every key of the row carries -1e9: softmax is shift-invariant, so nothing is hidden. This is
  // documented behaviour (docs/semantics.md): only -inf and structured components hide.
  const std::vector<float> x = {1, 0, 0, 1};
  const TensorView q(x.data(), {1, 1, 2, 2});
  std::vector<float> with_sentinel(4), without(4);
  attention_weights(q, q, MutableTensorView(with_sentinel.data(), {1, 1, 2, 2}),
                    Mask().additive(Array<float>({2, 2}, {-1e9f, -1e9f, 0, 0})));
  attention_weights(q, q, MutableTensorView(without.data(), {1, 1, 2, 2}));
  EXPECT_NEAR(with_sentinel[0], without[0], 1e-7);
  EXPECT_NEAR(with_sentinel[1], without[1], 1e-7);
  EXPECT_GT(with_sentinel[0], 0.5f);
}

TEST(DenseAdditive, SeveralAdditiveMasksSum) {
  const std::vector<float> x = {0, 0};
  const TensorView q(x.data(), {1, 1, 1, 1});
  const TensorView k(x.data(), {1, 1, 2, 1});
  std::vector<float> weights(2);
  attention_weights(q, k, MutableTensorView(weights.data(), {1, 1, 1, 2}),
                    Mask()
                        .additive(Array<float>({2}, {1.0f, 0.0f}))
                        .additive(Array<float>({1, 2}, {1.0f, 0.0f})));
  EXPECT_FLOAT_EQ(weights[0], static_cast<float>(std::exp(2.0) / (std::exp(2.0) + 1.0)));
}

}  // namespace
}  // namespace maskattn
