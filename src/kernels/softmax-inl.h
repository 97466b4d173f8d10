// The online softmax of the forward kernels (FlashAttention-2's recurrence), compiled once per
// Highway target (the "-inl.h" convention). Per query row it keeps a running maximum m, a running
// denominator l and an unnormalised output O; each tile of scores S does
//
//     m' = max(m, rowmax S)      P = exp(S − m')      α = exp(m − m')
//     l' = α·l + rowsum P        O' = α·O + P·V       at the end: O / l,  LSE = m + log l
//
// Three rules make it total, and live here only:
// - start: a row has seen no key (m = −inf, l = 0), or its head's attention sink, a key of logit
//   σ_h and no value (m = σ_h, l = 1);
// - the −inf guard: a row whose maximum is still −inf subtracts 0 instead (UsedMax), so that
//   (−inf) − (−inf) = NaN never happens and hidden scores give weights of exactly 0;
// - the end (EndOfRow): a row that met a NaN or +inf score is NaN (the reference propagates
//   them); a row that saw no key has l = 0 and ends as O = 0, LSE = −inf; any other is O / l.
//
// The two forward kernels hold their rows differently, so the step comes in two layouts:
// SoftmaxStepColumns for the tile kernel (queries across the lanes: every reduction is an
// element-wise max or add down a column of whole vectors) and SoftmaxStepRow for the row kernel
// (the keys of one row across the lanes: horizontal reductions, few rows). They differ in their
// exp: the tile kernel's ExpNonPositive (simd-inl.h) is the cheaper one its throughput needs; the
// row kernel, memory-bound, uses Highway's Exp, so the two agree to a few ulps, not bitwise
// (documented in docs/semantics.md §9, tested against the reference in fused_test.cc).
#if defined(MASKATTN_KERNELS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_SOFTMAX_INL_H_
#undef MASKATTN_KERNELS_SOFTMAX_INL_H_
#else
#define MASKATTN_KERNELS_SOFTMAX_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/problem.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Rows [0, count) start with no key seen, or with the sink of head h when there is one and
// `with_sink` (false for a key chunk whose partial result is merged with the sink later).
HWY_INLINE void SoftmaxStart(const Problem& p, int64_t h, bool with_sink, float* row_max,
                             float* row_sum, float* poisoned, int64_t count) {
  const bool sink = with_sink && p.mods->sinks != nullptr;
  for (int64_t i = 0; i < count; ++i) {
    row_max[i] = sink ? p.mods->sinks[h] : -INFINITY;
    row_sum[i] = sink ? 1.0f : 0.0f;
    poisoned[i] = 0.0f;
  }
}

// The −inf guard: the maximum to subtract, 0 for a row that has seen only −inf.
HWY_INLINE float UsedMax(float m) {
  return m == -INFINITY ? 0.0f : m;
}
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF UsedMax(DF df, VF m) {
  return hn::IfThenZeroElse(hn::Eq(m, hn::Set(df, -INFINITY)), m);
}

// NaN and +inf are exactly the scores that are not below +inf: one compare flags both.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE hn::Mask<DF> PoisonedScores(DF df, VF s) {
  return hn::Not(hn::Lt(s, hn::Set(df, INFINITY)));
}

// SoftmaxStepColumns' step on whole columns (no active rows, no dropout): every vector of queries
// at once, so that the running maxima and sums of the vectors are independent chains. One vector's
// chain alone waits a max's or an add's latency per key (64 per tile, four times over); the
// vectors together fill those waits. Each lane still reduces its keys in order, j = 0, 1, …: the
// same bits as one vector at a time.
template <int64_t kLanes>
HWY_INLINE void SoftmaxStepWholeColumns(float* HWY_RESTRICT s, int64_t rows,
                                        float* HWY_RESTRICT row_max, float* HWY_RESTRICT row_sum,
                                        float* HWY_RESTRICT alpha, float* HWY_RESTRICT poisoned) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  constexpr size_t N = hn::MaxLanes(DF());
  constexpr size_t V = static_cast<size_t>(kLanes) / N;
  static_assert(V * N == static_cast<size_t>(kLanes), "whole vectors of queries");
  hn::Vec<DF> m[V], m_used[V], sum[V];
  hn::Mask<DF> bad[V];
  for (size_t v = 0; v < V; ++v) {
    m[v] = hn::LoadU(df, row_max + v * N);
    bad[v] = hn::Ne(hn::LoadU(df, poisoned + v * N), hn::Zero(df));
  }
  for (int64_t j = 0; j < rows; ++j) {
    for (size_t v = 0; v < V; ++v) {
      const auto x = hn::LoadU(df, s + j * kLanes + v * N);
      m[v] = hn::Max(m[v], x);
      bad[v] = hn::Or(bad[v], PoisonedScores(df, x));
    }
  }
  for (size_t v = 0; v < V; ++v) {
    m_used[v] = UsedMax(df, m[v]);
    sum[v] = hn::Zero(df);
  }
  for (int64_t j = 0; j < rows; ++j) {
    for (size_t v = 0; v < V; ++v) {
      float* at = s + j * kLanes + v * N;
      const auto w = ExpNonPositive(df, hn::Sub(hn::LoadU(df, at), m_used[v]));
      hn::StoreU(w, df, at);
      sum[v] = hn::Add(sum[v], w);
    }
  }
  for (size_t v = 0; v < V; ++v) {
    const auto a = ExpNonPositive(df, hn::Sub(hn::LoadU(df, row_max + v * N), m_used[v]));
    hn::StoreU(hn::MulAdd(a, hn::LoadU(df, row_sum + v * N), sum[v]), df, row_sum + v * N);
    hn::StoreU(m[v], df, row_max + v * N);
    hn::StoreU(a, df, alpha + v * N);
    hn::StoreU(hn::IfThenElseZero(bad[v], hn::Set(df, 1.0f)), df, poisoned + v * N);
  }
}

// Tile layout: s[j][i] for `rows` keys j and kLanes queries i (a multiple of the vector length).
// Scores become weights exp(s − m'); row_max, row_sum and alpha (the factor by which the old sum
// and output are rescaled) are updated per query, poisoned set for rows that met NaN or +inf.
// With `first`/`end`, queries [c·block, (c+1)·block) read only key rows [first[c], end[c]): the
// others are hidden for all of them, so they would add weights of exactly 0 (and change no max).
// With `keep` (attention dropout, kernels/dropout-inl.h: bit i of keep[j], query i kept for key
// j), the sum counts every weight and the weights stored are the kept ones: dropout acts on the
// normalised weights, so its zeros must not reach the denominator.
// Whole columns (no `first`, no `keep`) take SoftmaxStepWholeColumns: the same bits, faster.
template <int64_t kLanes>
HWY_INLINE void SoftmaxStepColumns(float* HWY_RESTRICT s, int64_t rows, float* HWY_RESTRICT row_max,
                                   float* HWY_RESTRICT row_sum, float* HWY_RESTRICT alpha,
                                   float* HWY_RESTRICT poisoned, const int64_t* first = nullptr,
                                   const int64_t* end = nullptr, int64_t block = kLanes,
                                   const uint64_t* keep = nullptr) {
  if (first == nullptr && keep == nullptr) {
    SoftmaxStepWholeColumns<kLanes>(s, rows, row_max, row_sum, alpha, poisoned);
    return;
  }
  using DF = hn::ScalableTag<float>;
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < static_cast<size_t>(kLanes); i += N) {
    const auto m_old = hn::LoadU(df, row_max + i);
    auto m = m_old;
    auto bad = hn::Ne(hn::LoadU(df, poisoned + i), hn::Zero(df));
    const int64_t j_first = first != nullptr ? first[i / block] : 0;
    const int64_t j_end = end != nullptr ? end[i / block] : rows;
    for (int64_t j = j_first; j < j_end; ++j) {
      const auto x = hn::LoadU(df, s + j * kLanes + i);
      m = hn::Max(m, x);
      bad = hn::Or(bad, PoisonedScores(df, x));
    }
    const auto m_used = UsedMax(df, m);
    const auto a = ExpNonPositive(df, hn::Sub(m_old, m_used));
    auto sum = hn::Zero(df);
    for (int64_t j = j_first; j < j_end; ++j) {
      const auto w = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + j * kLanes + i), m_used));
      hn::StoreU(keep != nullptr ? hn::IfThenElseZero(LanesKept(df, keep[j], i), w) : w, df,
                 s + j * kLanes + i);
      sum = hn::Add(sum, w);
    }
    hn::StoreU(hn::MulAdd(a, hn::LoadU(df, row_sum + i), sum), df, row_sum + i);
    hn::StoreU(m, df, row_max + i);
    hn::StoreU(a, df, alpha + i);
    hn::StoreU(hn::IfThenElseZero(bad, hn::Set(df, 1.0f)), df, poisoned + i);
  }
}

// Row layout: the scores of one row for kLanes keys (−inf past the tile's end) become weights;
// returns α, by which the caller rescales the row's output.
template <int64_t kLanes>
HWY_INLINE float SoftmaxStepRow(float* HWY_RESTRICT s, float& row_max, float& row_sum,
                                float& poisoned) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const size_t N = hn::Lanes(df);
  auto m = hn::Set(df, -INFINITY);
  bool bad = poisoned != 0.0f;
  for (size_t j = 0; j < static_cast<size_t>(kLanes); j += N) {
    const auto x = hn::LoadU(df, s + j);
    m = hn::Max(m, x);
    bad |= !hn::AllFalse(df, PoisonedScores(df, x));
  }
  const float m_old = row_max;
  const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(df, m)));
  const float m_used = UsedMax(m_new);
  const float a = std::exp(m_old - m_used);
  auto sum = hn::Zero(df);
  for (size_t j = 0; j < static_cast<size_t>(kLanes); j += N) {
    const auto w = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), hn::Set(df, m_used)));
    hn::StoreU(w, df, s + j);
    sum = hn::Add(sum, w);
  }
  row_sum = a * row_sum + hn::GetLane(hn::SumOfLanes(df, sum));
  row_max = m_new;
  poisoned = bad ? 1.0f : 0.0f;
  return a;
}

// How a row ends: its LSE, and either "divide the output by l" or "fill it with `fill`".
struct RowEnd {
  bool normalise = false;
  float fill = 0.0f;
  float lse = 0.0f;
};
HWY_INLINE RowEnd EndOfRow(float row_max, float row_sum, float poisoned) {
  if (poisoned != 0.0f) return {false, NAN, NAN};
  if (row_sum == 0.0f) return {false, 0.0f, -INFINITY};
  return {true, 0.0f, row_max + std::log(row_sum)};
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_SOFTMAX_INL_H_
