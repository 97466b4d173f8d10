// The bad-input catalogue's row for programs in the wrong place (docs/errors.md E129): a score
// program as a mask, a mask program as a score modifier, a program beside score_fn, table
// gradients that do not fit the program.
#include "test_util.h"

namespace maskattn {
namespace {

TEST(Errors, E129_ProgramInTheWrongPlace) {
  const test::RandomProblem p(1, 1, 1, 8, 8, 8, 8, 67);
  std::vector<float> out(64), lse(8);
  const MutableTensorView out_view(out.data(), {1, 1, 8, 8});
  EXPECT_MASKATTN_ERROR(Mask().program(Program::score("s * 2.0")), "Mask::program", "score program",
                        "ScoreMods::program");
  ScoreMods mask_program;
  mask_program.program = Program::mask("q >= kv");
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(), out_view, {}, mask_program),
                        "ScoreMods::program", "mask program", "Mask::program");
  ScoreMods both;
  both.program = Program::score("s * 2.0");
  both.score_fn = [](double s, int64_t, int64_t, int64_t, int64_t) { return s; };
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(), out_view, {}, both), "score_fn",
                        "program", "both");

  // Table gradients: one view per table, float tables only, the table's shape.
  const std::vector<float> gate = {0.5f};
  const std::vector<int64_t> ids = {1};
  ScoreMods gated;
  gated.program = Program::score("s * g[h] + id[0]", {ProgramTable::borrow("g", gate.data(), {1}),
                                                      ProgramTable::borrow("id", ids.data(), {1})});
  attention(p.qv(), p.kv(), p.vv(), out_view, {}, gated, {},
            MutableTensorView(lse.data(), {1, 1, 8}));
  std::vector<float> dq(64), dk(64), dv(64), dg(1), wrong(2);
  const auto backward = [&](std::vector<MutableTensorView> dtables, const ScoreMods& mods) {
    Gradients grads{MutableTensorView(dq.data(), {1, 1, 8, 8}),
                    MutableTensorView(dk.data(), {1, 1, 8, 8}),
                    MutableTensorView(dv.data(), {1, 1, 8, 8})};
    grads.dtables = std::move(dtables);
    attention_backward(p.qv(), p.kv(), p.vv(), out_view, TensorView(lse.data(), {1, 1, 8}),
                       out_view, grads, {}, mods);
  };
  EXPECT_MASKATTN_ERROR(backward({MutableTensorView(dg.data(), {1})}, gated), "grads.dtables",
                        "1 views", "2 tables");
  EXPECT_MASKATTN_ERROR(
      backward({MutableTensorView(dg.data(), {1}), MutableTensorView(dg.data(), {1})}, gated),
      "dtables[1]", "'id'", "float32");
  EXPECT_MASKATTN_ERROR(backward({MutableTensorView(wrong.data(), {2}), {}}, gated), "dtables[0]",
                        "[2]", "[1]");
  EXPECT_MASKATTN_ERROR(backward({MutableTensorView(dg.data(), {1})}, {}), "grads.dtables",
                        "mods.program");
  EXPECT_NO_THROW(backward({MutableTensorView(dg.data(), {1}), {}}, gated));
}

}  // namespace
}  // namespace maskattn
