// Catalogue rows of attention dropout (docs/errors.md E135).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dropout.h"
#include "test_util.h"

namespace maskattn {
namespace {

using detail::resolve_dropout;

TEST(Errors, E135_DropoutOutsideItsDomain) {
  const MaskShape shape{1, 1, 8, 8};
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{1.5, 0, 0}, shape),
                        "dropout.p = 1.5 must be in [0, 1]");
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{NAN, 0, 0}, shape),
                        "dropout.p = nan must be in [0, 1]");
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{-0.1, 0, 0}, shape),
                        "dropout.p = -0.1 must be in [0, 1]");
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{0.1, 0, uint64_t{1} << 32}, shape),
                        "dropout.offset = 4294967296 must be below 2^32");
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{0.1, 0, 0}, {1, 1, 8, int64_t{1} << 36}),
                        "dropout: Lk = 68719476736 leaves the 32-bit words of the Philox counter");
  EXPECT_MASKATTN_ERROR(resolve_dropout(Dropout{0.1, 0, 0}, {int64_t{1} << 20, 1 << 13, 8, 8}),
                        "dropout: B·Hq = 1048576·8192 leaves");
  // Through attention() and attention_backward(): the call raises before writing anything.
  const test::RandomProblem p(1, 1, 1, 4, 4, 8, 8, 1);
  std::vector<float> out(32, -7.0f), dq(32), dk(32), dv(32), lse(4);
  Options options;
  options.dropout.p = 2.0;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(),
                                  MutableTensorView(out.data(), {1, 1, 4, 8}), {}, {}, options),
                        "dropout.p = 2 must be in [0, 1]");
  EXPECT_EQ(out[0], -7.0f);
  options.dropout = Dropout{0.5, 1, uint64_t{1} << 40};
  const TensorView o(out.data(), {1, 1, 4, 8});
  EXPECT_MASKATTN_ERROR(
      attention_backward(p.qv(), p.kv(), p.vv(), o, TensorView(lse.data(), {1, 1, 4}), o,
                         Gradients{MutableTensorView(dq.data(), {1, 1, 4, 8}),
                                   MutableTensorView(dk.data(), {1, 1, 4, 8}),
                                   MutableTensorView(dv.data(), {1, 1, 4, 8})},
                         {}, {}, options),
      "dropout.offset = 1099511627776 must be below 2^32");
}

}  // namespace
}  // namespace maskattn
