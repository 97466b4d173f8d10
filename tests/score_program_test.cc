// Score programs (ScoreMods::program) through the kernels: forward and backward against the f64
// reference and against the built-in modifiers they spell (softcap, ALiBi, a bias), the gradients
// of their tables against an independent route (a relative-bias table's gradient is the dense
// bias gradient summed along diagonals), and bits that do not depend on the thread count.
#include <cmath>

#include "forward_rule.h"
#include "test_util.h"

namespace maskattn {
namespace {

using Problem = test::RandomProblem;
using test::max_error;

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
  std::vector<std::vector<float>> dtables;
  std::vector<float> dbias;
};

// Forward and backward in f32 with `options`; dtables for every float table of mods.program.
Outputs run_both(const Problem& p, const Mask& mask, const ScoreMods& mods, Kernel kernel,
                 int threads = 0) {
  Options options;
  options.kernel = kernel;
  options.threads = threads;
  Outputs r;
  r.out.assign(p.B * p.Hq * p.Lq * p.Dv, 0.0f);
  r.lse.assign(p.B * p.Hq * p.Lq, 0.0f);
  const Dims o_shape = {p.B, p.Hq, p.Lq, p.Dv};
  const MutableTensorView lse(r.lse.data(), {p.B, p.Hq, p.Lq});
  attention(p.qv(), p.kv(), p.vv(), MutableTensorView(r.out.data(), o_shape), mask, mods, options,
            lse);
  const std::vector<float> dout = test::random_values(r.out.size(), 99);
  r.dq.assign(p.q.size(), 0.0f);
  r.dk.assign(p.k.size(), 0.0f);
  r.dv.assign(p.v.size(), 0.0f);
  Gradients grads{MutableTensorView(r.dq.data(), {p.B, p.Hq, p.Lq, p.D}),
                  MutableTensorView(r.dk.data(), {p.B, p.Hkv, p.Lk, p.D}),
                  MutableTensorView(r.dv.data(), {p.B, p.Hkv, p.Lk, p.Dv})};
  if (mods.bias) {
    r.dbias.assign(mods.bias->numel(), 0.0f);
    grads.dbias = MutableTensorView(r.dbias.data(), mods.bias->shape());
  }
  if (mods.program) {
    const std::vector<ProgramTable>& tables = mods.program->tables();
    r.dtables.resize(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      if (tables[t].type != ProgramTableType::float32) {
        grads.dtables.emplace_back();
        continue;
      }
      int64_t n = 1;
      for (const int64_t size : tables[t].sizes) n *= size;
      r.dtables[t].assign(n, 0.0f);
      grads.dtables.emplace_back(r.dtables[t].data(),
                                 Dims(tables[t].sizes.begin(), tables[t].sizes.end()));
    }
  }
  attention_backward(p.qv(), p.kv(), p.vv(), TensorView(r.out.data(), o_shape), lse,
                     TensorView(dout.data(), o_shape), grads, mask, mods, options);
  return r;
}

float scale_of(const std::vector<float>& values) {
  float m = 0.0f;
  for (const float x : values) m = std::max(m, std::fabs(x));
  return std::max(m, 1.0f);
}

// Fused against the reference: f32 arithmetic against f64, relative to the values' scale.
void expect_close(const Outputs& fused, const Outputs& reference, const std::string& what,
                  float tolerance = 2e-5f) {
  EXPECT_LE(max_error(fused.out, reference.out), tolerance * scale_of(reference.out)) << what;
  EXPECT_LE(max_error(fused.lse, reference.lse), tolerance * scale_of(reference.lse)) << what;
  EXPECT_LE(max_error(fused.dq, reference.dq), tolerance * scale_of(reference.dq)) << what;
  EXPECT_LE(max_error(fused.dk, reference.dk), tolerance * scale_of(reference.dk)) << what;
  EXPECT_LE(max_error(fused.dv, reference.dv), tolerance * scale_of(reference.dv)) << what;
  ASSERT_EQ(fused.dtables.size(), reference.dtables.size()) << what;
  for (size_t t = 0; t < fused.dtables.size(); ++t) {
    EXPECT_LE(max_error(fused.dtables[t], reference.dtables[t]),
              tolerance * scale_of(reference.dtables[t]))
        << what << " dtables[" << t << "]";
  }
}

struct Case {
  std::string name;
  ScoreMods mods;
};

// attention-gym's score_mod catalogue as programs, sized for p (tables owned by the programs).
std::vector<Case> catalogue(const Problem& p) {
  const int64_t span = p.Lq + p.Lk;  // q − kv + Lk − 1 covers [0, span − 1)
  std::vector<float> rel(p.Hq * span), gate(p.Hq), slopes(p.Hq);
  for (size_t n = 0; n < rel.size(); ++n) rel[n] = 0.3f * std::sin(0.37f * n);
  for (int64_t h = 0; h < p.Hq; ++h) {
    gate[h] = 0.5f + 0.25f * h;
    slopes[h] = std::pow(2.0f, -1.0f - h);
  }
  std::vector<int64_t> bucket(span);  // T5-style: log-spaced buckets of the distance
  for (int64_t n = 0; n < span; ++n) {
    const int64_t d = std::abs(n - (p.Lk - 1));
    bucket[n] = (n < p.Lk - 1 ? 0 : 8) + (d < 4 ? d : std::min<int64_t>(7, 4 + d / 16));
  }
  std::vector<float> bucket_bias(p.Hq * 16);
  for (size_t n = 0; n < bucket_bias.size(); ++n) bucket_bias[n] = 0.1f * std::cos(1.3f * n);
  const std::string shift = std::to_string(p.Lk - 1);
  const auto with = [](const std::string& text, std::vector<ProgramTable> tables = {}) {
    ScoreMods mods;
    mods.program = Program::score(text, std::move(tables));
    return mods;
  };
  return {
      {"softcap", with("20.0 * tanh(s / 20.0)")},
      {"alibi", with("s - slope[h] * abs(q - kv)", {ProgramTable::own("slope", slopes, {p.Hq})})},
      {"relative bias",
       with("s + rel[h, q - kv + " + shift + "]", {ProgramTable::own("rel", rel, {p.Hq, span})})},
      {"t5 buckets", with("s + bias[h, bucket[q - kv + " + shift + "]]",
                          {ProgramTable::own("bias", bucket_bias, {p.Hq, 16}),
                           ProgramTable::own("bucket", bucket, {span})})},
      {"gate", with("s * g[h]", {ProgramTable::own("g", gate, {p.Hq})})},
      {"branch", with("where(s > 0.0, s, s * 0.5)")},
      {"exp-log-sigmoid", with("s + 0.1 * log(1.0 + exp(-abs(s))) - sigmoid(s)")},
  };
}

TEST(ScoreProgram, CatalogueFusedMatchesTheReferenceForwardAndBackward) {
  for (const Problem& p : {Problem(2, 4, 2, 130, 130, 32, 16, 61),
                           Problem(1, 2, 1, 1, 150, 16, 16, 62),  // decode rows
                           Problem(1, 3, 3, 70, 45, 24, 8, 63)}) {
    for (const Mask& mask : {Mask(), Mask().causal()}) {
      for (const Case& c : catalogue(p)) {
        const std::string what = c.name + " " + mask.describe() + " Lq=" + std::to_string(p.Lq);
        expect_close(run_both(p, mask, c.mods, Kernel::fused),
                     run_both(p, mask, c.mods, Kernel::reference), what);
      }
    }
  }
}

TEST(ScoreProgram, EqualsTheBuiltInModifiersItSpells) {
  const Problem p(1, 3, 3, 90, 90, 16, 16, 64);
  const std::vector<Case> programs = catalogue(p);
  ScoreMods softcap;
  softcap.softcap = 20.0;
  ScoreMods alibi;
  for (int64_t h = 0; h < p.Hq; ++h) alibi.alibi_slopes.push_back(std::pow(2.0f, -1.0f - h));
  for (const auto& [program, builtin] :
       {std::pair{programs[0].mods, softcap}, std::pair{programs[1].mods, alibi}}) {
    const Outputs a = run_both(p, Mask().causal(), program, Kernel::reference);
    const Outputs b = run_both(p, Mask().causal(), builtin, Kernel::reference);
    // The program's arithmetic is f32; the built-ins' reference arithmetic is f64.
    EXPECT_LE(max_error(a.out, b.out), 1e-5f);
    EXPECT_LE(max_error(a.dq, b.dq), 1e-4f * scale_of(b.dq));
    EXPECT_LE(max_error(a.dk, b.dk), 1e-4f * scale_of(b.dk));
  }
}

// d rel[h, d] = Σ over the pairs on diagonal d of dbias[h, i, j]: the same gradient by the
// existing dense-bias route.
TEST(ScoreProgram, RelativeBiasGradientIsTheDenseBiasGradientAlongDiagonals) {
  const Problem p(1, 2, 1, 75, 75, 16, 16, 65);
  const std::vector<Case> programs = catalogue(p);
  const Case& relative = programs[2];
  const ProgramTable& table = relative.mods.program->tables()[0];
  const auto* rel = static_cast<const float*>(table.data);
  const int64_t span = table.sizes[1];
  std::vector<float> dense(p.Hq * p.Lq * p.Lk);
  for (int64_t h = 0; h < p.Hq; ++h) {
    for (int64_t i = 0; i < p.Lq; ++i) {
      for (int64_t j = 0; j < p.Lk; ++j) {
        dense[(h * p.Lq + i) * p.Lk + j] = rel[h * span + i - j + p.Lk - 1];
      }
    }
  }
  ScoreMods bias;
  bias.bias = Array<float>({p.Hq, p.Lq, p.Lk}, dense);
  for (const Kernel kernel : {Kernel::reference, Kernel::fused}) {
    const Outputs a = run_both(p, Mask().causal(), relative.mods, kernel);
    const Outputs b = run_both(p, Mask().causal(), bias, kernel);
    EXPECT_LE(max_error(a.out, b.out), 1e-6f);
    std::vector<float> along(p.Hq * span, 0.0f);
    for (int64_t h = 0; h < p.Hq; ++h) {
      for (int64_t i = 0; i < p.Lq; ++i) {
        for (int64_t j = 0; j < p.Lk; ++j) {
          along[h * span + i - j + p.Lk - 1] += b.dbias[(h * p.Lq + i) * p.Lk + j];
        }
      }
    }
    EXPECT_LE(max_error(a.dtables[0], along), 1e-5f);
  }
}

TEST(ScoreProgram, BitwiseForAnyThreadCount) {
  const Problem p(2, 4, 2, 200, 200, 32, 32, 66);
  for (const Case& c : catalogue(p)) {
    const Outputs one = run_both(p, Mask().causal(), c.mods, Kernel::fused, 1);
    const Outputs two = run_both(p, Mask().causal(), c.mods, Kernel::fused, 2);
    EXPECT_EQ(one.out, two.out) << c.name;
    EXPECT_EQ(one.dq, two.dq) << c.name;
    EXPECT_EQ(one.dk, two.dk) << c.name;
    EXPECT_EQ(one.dtables, two.dtables) << c.name;
  }
}

}  // namespace
}  // namespace maskattn
