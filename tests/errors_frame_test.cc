// The bad-input catalogue's rows for calls on a slice of a problem (docs/errors.md E127), and the
// f32 outputs half-precision inputs may use (E10, E76), compiled into errors_test so that its
// catalogue check sees them.
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/gradcheck.h"
#include "test_util.h"

namespace maskattn {
namespace {

// q [1,2,4,8], k/v [1,1,6,8] in f32, and bf16 copies.
struct Slice {
  std::vector<float> q = test::random_values(1 * 2 * 4 * 8, 11);
  std::vector<float> k = test::random_values(1 * 1 * 6 * 8, 12);
  std::vector<float> v = test::random_values(1 * 1 * 6 * 8, 13);
  std::vector<float> out = std::vector<float>(1 * 2 * 4 * 8);
  TensorView qv() const { return TensorView(q.data(), {1, 2, 4, 8}); }
  TensorView kv() const { return TensorView(k.data(), {1, 1, 6, 8}); }
  TensorView vv() const { return TensorView(v.data(), {1, 1, 6, 8}); }
  MutableTensorView outv() { return MutableTensorView(out.data(), {1, 2, 4, 8}); }
  void run(const Frame& frame) {
    Options options;
    options.frame = frame;
    attention(qv(), kv(), vv(), outv(), Mask().causal(), {}, options);
  }
};

TEST(Errors, E127_FrameOutsideTheWholeProblem) {
  Slice s;
  EXPECT_MASKATTN_ERROR(s.run({2, 0, 5, 6}),
                        "frame: rows [q_offset, q_offset + Lq) = [2, 6) are not inside [0, "
                        "q_total) = [0, 5)");
  EXPECT_MASKATTN_ERROR(s.run({0, -1, 4, 10}), "frame: rows [k_offset, k_offset + Lk) = [-1, 5)");
  EXPECT_MASKATTN_ERROR(s.run({0, 3, 4, -1}),
                        "frame: k_offset=3 needs k_total (the whole problem's length)");
  // Components are checked against the whole problem: key lengths of the slice are not enough.
  Options options;
  options.frame = {0, 6, 4, 12};
  EXPECT_MASKATTN_ERROR(
      attention(s.qv(), s.kv(), s.vv(), s.outv(), Mask().key_lengths({13}), {}, options),
      "exceeds Lk=12");
  std::vector<float> dout(s.out.size(), 1.0f);
  EXPECT_MASKATTN_ERROR(
      gradcheck(s.qv(), s.kv(), s.vv(), TensorView(dout.data(), {1, 2, 4, 8}), Mask(), {}, options),
      "gradcheck: options.frame must be the whole problem");
  EXPECT_MASKATTN_ERROR(any_allowed(Mask(), {1, 2, 4, 6}, {3, 0, 6, 6}),
                        "frame: rows [q_offset, q_offset + Lq) = [3, 7)");
}

TEST(Errors, E10_HalfPrecisionOutputIsItsDtypeOrF32) {
  Slice s;
  const auto bf16 = [](const std::vector<float>& values) {
    std::vector<bfloat16> rounded;
    for (const float x : values) rounded.push_back(bfloat16_from_float(x));
    return rounded;
  };
  const std::vector<bfloat16> q = bf16(s.q), k = bf16(s.k), v = bf16(s.v);
  std::vector<float16> wrong(s.out.size());
  EXPECT_MASKATTN_ERROR(
      attention(TensorView(q.data(), {1, 2, 4, 8}), TensorView(k.data(), {1, 1, 6, 8}),
                TensorView(v.data(), {1, 1, 6, 8}), MutableTensorView(wrong.data(), {1, 2, 4, 8})),
      "out has dtype f16 but must be bf16 (the inputs') or f32 (unrounded, for merging)");
  // f32 is accepted: the partial result of a split, rounded once when merged.
  EXPECT_NO_THROW(attention(TensorView(q.data(), {1, 2, 4, 8}), TensorView(k.data(), {1, 1, 6, 8}),
                            TensorView(v.data(), {1, 1, 6, 8}), s.outv()));
}

}  // namespace
}  // namespace maskattn
