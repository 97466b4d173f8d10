// The f32 product unit (product_unit.h): every input widened to f32, the products on f32 FMA.
// Every CPU has it, and every dtype and stride takes it; the bf16 units fall back to it.
//
// Design. Per call, K and V that are not already f32 with contiguous rows are converted once into
// contiguous f32 copies (the tile kernel reads every key and value tile once per query block, so
// converting per tile would repeat the work Lq/64 times). Per block, the queries are loaded as Qᵀ
// with the scale applied once here rather than to every score later (unused columns 0). Per tile,
// the two register-blocked products of tile_products-inl.h run on the rows in place, on a partial
// tile's active rows alone when the driver found them (`active_rows`).
//
// Backward: the five products of a tile pair are product-inl.h's register-blocked one, on the
// operands the backward driver packs for every key tile (scale·Kᵀ, Vᵀ, K's rows) and Q, dO rows
// in place; a guarded pair's (inputs with inf or NaN) skip zero weights. Every unit's guarded
// pairs, and every pair of a unit without backward products (bf16-dot), run here.
//
// The products are compiled once per SIMD target (Highway) like the kernels that call them; the
// table's entries reach the best target through HWY_DYNAMIC_DISPATCH, one indirect call per tile
// or tile pair.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/f32_fma.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>
#include <vector>

#include "core/reused.h"
#include "kernels/convert-inl.h"
#include "kernels/fused_backward_block.h"
#include "kernels/fused_block.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/product-inl.h"
#include "kernels/product_unit.h"
#include "kernels/tile_products-inl.h"
#include "kernels/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

#ifdef MASKATTN_HAVE_TRANSPOSE16
// Sixteen f32 queries' dims [d0, d0 + 16), scaled, into Qᵀ's columns [d0, d0 + 16) at lanes
// [i0, i0 + 16), through doubles: each product is (double) q · scale rounded to f32, as the scalar
// path computes it, for a scale that is not an f32 (F32BeginBlock multiplies in f32 otherwise).
HWY_INLINE void TransposeScaled16InDouble(const float* q, int64_t row_stride, double scale,
                                          float* q_t) {
  const hn::ScalableTag<float> df;
  const hn::Half<decltype(df)> dh;
  const hn::Repartition<double, decltype(df)> dd;
  const auto scale_d = hn::Set(dd, scale);
  __m512 r[16];
  for (int i = 0; i < 16; ++i) {
    const auto row = hn::LoadU(df, q + i * row_stride);
    const auto low = hn::PromoteTo(dd, hn::LowerHalf(dh, row));
    const auto high = hn::PromoteTo(dd, hn::UpperHalf(dh, row));
    r[i] = hn::Combine(df, hn::DemoteTo(dh, hn::Mul(high, scale_d)),
                       hn::DemoteTo(dh, hn::Mul(low, scale_d)))
               .raw;
  }
  Transpose16(r);
  StoreRows16(r, q_t, kTileQ);
}
#endif

// Qᵀ of the block, scaled (unused columns 0). A whole block of f32 rows is transposed 16 × 16 in
// registers (AVX-512): loading each row and storing its values one by one, 64 apart, cost a band
// mask's block of 5 tiles about a tenth of its time.
void F32BeginBlock(const Context& c, const Block& blk, Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t dim = p.head_dim;
#ifdef MASKATTN_HAVE_TRANSPOSE16
  if (p.q.dtype() == DType::f32 && p.q.stride(3) == 1 && blk.q_count == kTileQ && dim % 16 == 0) {
    const float* q =
        static_cast<const float*>(p.q.data()) + p.q.offset({blk.b, blk.h, blk.q_first, 0});
    const int64_t stride = p.q.stride(2);
    // A scale that is an f32 (1/8 for D = 64) multiplies in f32: the product of two f32 is exact
    // in double, so both round once, to the same bits as the scalar path's.
    const bool f32_scale = static_cast<double>(static_cast<float>(p.scale)) == p.scale;
    const __m512 scale = _mm512_set1_ps(static_cast<float>(p.scale));
    for (int64_t i0 = 0; i0 < kTileQ; i0 += 16) {
      for (int64_t d0 = 0; d0 < dim; d0 += 16) {
        float* q_t = scratch.q_t + d0 * kTileQ + i0;
        if (f32_scale) {
          TransposeScaledSquare(q + i0 * stride + d0, stride, scale, q_t, kTileQ);
        } else {
          TransposeScaled16InDouble(q + i0 * stride + d0, stride, p.scale, q_t);
        }
      }
    }
    return;
  }
#endif
  std::memset(scratch.q_t, 0, dim * kTileQ * sizeof(float));
  for (int64_t i = 0; i < blk.q_count; ++i) {
    float* row = scratch.q_rows + i * dim;
    LoadRow(p.q, p.q.offset({blk.b, blk.h, blk.q_first + i, 0}), p.q.stride(3), dim, row);
    for (int64_t d = 0; d < dim; ++d) {
      scratch.q_t[d * kTileQ + i] = static_cast<float>(row[d] * p.scale);
    }
  }
}

// Sᵀ = K·(scale·Qᵀ); with `active`, only the scores each lane block reads.
void F32Scores(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
               const ActiveRows* active, Scratch& scratch) {
  const Problem& p = *c.problem;
  int64_t k_stride = 0;
  const float* k =
      KVTileRows(p.k, p.pages, true, blk.b, g, j0, rows, p.head_dim, scratch.k, k_stride);
  if (active != nullptr) {
    ScoresActive(k, k_stride, rows, p.head_dim, scratch.q_t, *active, scratch.s, &scratch.prefetch);
  } else {
    Scores(k, k_stride, rows, p.head_dim, scratch.q_t, scratch.s, &scratch.prefetch);
  }
}

// Oᵀ = α·Oᵀ + Vᵀ·Pᵀ for a finite V tile (zero weights multiplied, not skipped).
void F32Accumulate(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                   const ActiveRows* active, Scratch& scratch) {
  const Problem& p = *c.problem;
  int64_t v_stride = 0;
  const float* v =
      KVTileRows(p.v, p.pages, false, blk.b, g, j0, rows, p.value_dim, scratch.v, v_stride);
  if (active != nullptr) {
    AccumulateActive<false>(v, v_stride, p.value_dim, scratch.s, scratch.alpha, *active, scratch.o,
                            &scratch.prefetch);
  } else {
    Accumulate<false>(v, v_stride, rows, p.value_dim, scratch.s, scratch.alpha, scratch.o,
                      &scratch.prefetch);
  }
}

// ---- backward: the five products of fused_backward_block.cc's essay (product-inl.h) -----------

constexpr int64_t T = kBackwardTile;

void ProductGuarded(bool guarded, Guard kind, const float* a, int64_t a_row, int64_t a_col,
                    int64_t inner, const float* b, int64_t b_stride, int64_t width, bool accumulate,
                    float* c, int64_t c_stride, int64_t rows) {
  if (!guarded) {
    Product<Guard::none>(a, a_row, a_col, inner, b, b_stride, width, accumulate, c, c_stride, rows);
  } else if (kind == Guard::a) {
    Product<Guard::a>(a, a_row, a_col, inner, b, b_stride, width, accumulate, c, c_stride, rows);
  } else {
    Product<Guard::b>(a, a_row, a_col, inner, b, b_stride, width, accumulate, c, c_stride, rows);
  }
}

// S = Q·(scale·K)ᵀ with scale·Kᵀ packed per key tile by the driver.
void F32BackwardScores(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const float* q = c.q.row(pair.b, pair.h, pair.q_first);
  Product<Guard::none>(q, c.q.stride_l, 1, c.problem->head_dim, sc.k_t, T, T, false, sc.s, T,
                       pair.q_count);
}

// dP = dO·Vᵀ with Vᵀ packed per key tile by the driver.
void F32BackwardDp(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const float* dout = c.dout.row(pair.b, pair.h, pair.q_first);
  Product<Guard::none>(dout, c.dout.stride_l, 1, c.problem->value_dim, sc.v_t, T, T, false, sc.ds,
                       T, pair.q_count);
}

// dV_j += Σ_i P_ij·dO_i   dK_j += Σ_i dS_ij·Q_i   dQ_chunk,i += Σ_j dS_ij·K_j; a guarded pair's
// products skip zero weights.
void F32BackwardAccumulate(const BackwardContext& c, const BackwardItem& item,
                           const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const float* q = c.q.row(pair.b, pair.h, pair.q_first);
  const float* dout = c.dout.row(pair.b, pair.h, pair.q_first);
  const bool guarded = pair.guarded;
  ProductGuarded(guarded, Guard::a, sc.s, 1, T, pair.q_count, dout, c.dout.stride_l, c.dv_width,
                 true, sc.dv, c.dv_width, pair.rows);
  ProductGuarded(guarded, Guard::a, sc.ds, 1, T, pair.q_count, q, c.q.stride_l, c.dq_width, true,
                 sc.dk, c.dq_width, pair.rows);
  float* dq = c.dq_partial +
              (((item.chunk * p.batch + pair.b) * p.q_heads + pair.h) * p.q_len + pair.q_first) *
                  c.dq_width;
  ProductGuarded(guarded, Guard::a, sc.ds, T, 1, pair.rows, sc.k_source, sc.k_source_stride,
                 c.dq_width, true, dq, c.dq_width, pair.q_count);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail::fused {

HWY_EXPORT(F32BeginBlock);
HWY_EXPORT(F32Scores);
HWY_EXPORT(F32Accumulate);
HWY_EXPORT(F32BackwardScores);
HWY_EXPORT(F32BackwardDp);
HWY_EXPORT(F32BackwardAccumulate);

namespace {

struct F32Unit;  // tag of this unit's reused() buffers

bool fits(int64_t, int64_t, bool) {
  return true;
}

// K or V not f32 with contiguous rows: converted once per call (a paged cache's rows are decoded
// per tile instead, kv_pages.h).
bool converts(const Problem& p) {
  if (p.pages != nullptr) return false;
  return p.k.dtype() != DType::f32 || p.k.stride(3) != 1 || p.v.stride(3) != 1;
}

double call_bytes(const Problem& p) {
  const double keys = static_cast<double>(p.k.size(0)) * p.k.size(1) * p.k_len;
  return converts(p) ? 4.0 * keys * (p.head_dim + p.value_dim) : 0.0;
}

// K and V replaced by contiguous f32 copies (in a buffer this thread keeps).
const void* prepare(Problem& p) {
  if (!converts(p)) return nullptr;
  std::vector<float>& kv = reused<float, F32Unit>();
  const int64_t keys = p.k.size(0) * p.k.size(1) * p.k_len;
  kv.resize(keys * (p.head_dim + p.value_dim));
  convert_to_f32(p.k, kv.data(), p.threads);
  convert_to_f32(p.v, kv.data() + keys * p.head_dim, p.threads);
  p.k = TensorView(kv.data(), {p.batch, p.kv_heads, p.k_len, p.head_dim});
  p.v = TensorView(kv.data() + keys * p.head_dim, {p.batch, p.kv_heads, p.k_len, p.value_dim});
  return nullptr;
}

void begin_block(const Context& c, const Block& blk, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(F32BeginBlock)(c, blk, scratch);
}

void scores(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
            const ActiveRows* active, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(F32Scores)(c, blk, g, j0, rows, active, scratch);
}

void accumulate(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                const ActiveRows* active, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(F32Accumulate)(c, blk, g, j0, rows, active, scratch);
}

void backward_scores(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  HWY_DYNAMIC_DISPATCH(F32BackwardScores)(c, pair, sc);
}

void backward_dp(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  HWY_DYNAMIC_DISPATCH(F32BackwardDp)(c, pair, sc);
}

void backward_accumulate(const BackwardContext& c, const BackwardItem& item,
                         const BackwardPair& pair, BackwardScratch& sc) {
  HWY_DYNAMIC_DISPATCH(F32BackwardAccumulate)(c, item, pair, sc);
}

}  // namespace

const ProductUnit kF32Unit = {
    .name = "f32",
    .fits = fits,
    .thread_bytes = nullptr,  // its operands are the drivers' f32 tiles
    .backward_thread_bytes = nullptr,
    .call_bytes = call_bytes,
    .prepare = prepare,
    .begin_block = begin_block,
    .end_block = nullptr,
    .scores = scores,
    .accumulate = accumulate,
    .active_rows = true,
    .raw_scores = nullptr,
    .raw_softmax_step = nullptr,
    .accumulate_weights = nullptr,
    .backward_fits = nullptr,
    .backward_call_bytes = nullptr,
    .backward_prepare = nullptr,
    .begin_key_tile = nullptr,
    .end_key_tile = nullptr,
    .backward_scores = backward_scores,
    .backward_weights = nullptr,
    .backward_dp = backward_dp,
    .backward_accumulate = backward_accumulate,
};

}  // namespace maskattn::detail::fused
#endif  // HWY_ONCE
