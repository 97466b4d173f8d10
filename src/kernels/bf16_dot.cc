#include "kernels/bf16_dot.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/reused.h"
#include "kernels/fused_block.h"
#include "kernels/product_unit.h"

namespace maskattn::detail::fused {

#define MASKATTN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

static_assert(kTileQ == 64, "the bf16 kernels hold a block of queries in 4 vectors of 16");

// Lane order that interleaves the first 16 bf16 of a vector with the second 16:
// [a0, b0, a1, b1, …] from [a0 … a15, b0 … b15].
MASKATTN_BF16_TARGET __m512i interleave_halves() {
  alignas(64) uint16_t index[32];
  for (int n = 0; n < 16; ++n) {
    index[2 * n] = static_cast<uint16_t>(n);
    index[2 * n + 1] = static_cast<uint16_t>(16 + n);
  }
  return _mm512_load_si512(index);
}

// Seconds for `iterations` rounds of 16 independent vdpbf16ps (16 × 64 flop) or f32 FMA
// (16 × 32 flop) chains: 16 chains hide either instruction's latency on every core we know.
template <bool kBf16>
MASKATTN_BF16_TARGET double dot_loop_seconds(int64_t iterations) {
  __m512 acc[16];
  for (int n = 0; n < 16; ++n) acc[n] = _mm512_set1_ps(0.001f * static_cast<float>(n));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, y), b = _mm512_cvtne2ps_pbh(y, x);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
    for (auto& chain : acc) {
      if constexpr (kBf16) {
        chain = _mm512_dpbf16_ps(chain, a, b);
      } else {
        chain = _mm512_fmadd_ps(chain, x, y);
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512 sum = acc[0];
  for (int n = 1; n < 16; ++n) sum = _mm512_add_ps(sum, acc[n]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0];  // the chains' results are used
  (void)sink;
  return seconds;
}

double measure_bf16_dot_speedup() {
  constexpr int64_t kIterations = 4000;  // ≈ 30 µs per loop
  double dot = 1e30, fma = 1e30;
  for (int round = 0; round < 3; ++round) {  // best of three, alternating: the clock ramps up
    fma = std::min(fma, dot_loop_seconds<false>(kIterations));
    dot = std::min(dot, dot_loop_seconds<true>(kIterations));
  }
  return (64.0 / dot) / (32.0 / fma);
}

}  // namespace

double bf16_dot_speedup() {
  static const double speedup = bf16_dot_available() ? measure_bf16_dot_speedup() : 0.0;
  return speedup;
}

bool bf16_dot_available() {
  static const bool available = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512bf16");
  return available;
}

void bf16_pack_queries(const uint16_t* rows, int64_t row_stride, int64_t count, int64_t dim,
                       uint32_t* q_pairs) {
  std::memset(q_pairs, 0, (dim / 2) * kTileQ * sizeof(uint32_t));
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t* row = rows + i * row_stride;
    for (int64_t p = 0; p < dim / 2; ++p) {
      uint32_t pair;
      std::memcpy(&pair, row + 2 * p, sizeof pair);
      q_pairs[p * kTileQ + i] = pair;
    }
  }
}

MASKATTN_BF16_TARGET void bf16_scores(const uint16_t* k, int64_t k_stride, int64_t rows,
                                      int64_t dim, const uint32_t* q_pairs, float scale, float* s) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  const int64_t pairs = dim / 2;
  int64_t r = 0;
  // 4 key rows × 4 query vectors: 16 accumulators, as in the f32 kernel.
  for (; r + 4 <= rows; r += 4) {
    __m512 acc[4][4];
    for (auto& row : acc) {
      for (auto& vector : row) vector = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; ++p) {
      const uint32_t* q = q_pairs + p * kTileQ;
      const __m512bh q0 = (__m512bh)_mm512_loadu_si512(q),
                     q1 = (__m512bh)_mm512_loadu_si512(q + 16);
      const __m512bh q2 = (__m512bh)_mm512_loadu_si512(q + 32),
                     q3 = (__m512bh)_mm512_loadu_si512(q + 48);
      for (int n = 0; n < 4; ++n) {
        uint32_t pair;
        std::memcpy(&pair, k + (r + n) * k_stride + 2 * p, sizeof pair);
        const __m512bh key = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[n][0] = _mm512_dpbf16_ps(acc[n][0], key, q0);
        acc[n][1] = _mm512_dpbf16_ps(acc[n][1], key, q1);
        acc[n][2] = _mm512_dpbf16_ps(acc[n][2], key, q2);
        acc[n][3] = _mm512_dpbf16_ps(acc[n][3], key, q3);
      }
    }
    for (int n = 0; n < 4; ++n) {
      for (int c = 0; c < 4; ++c) {
        _mm512_storeu_ps(s + (r + n) * kTileQ + 16 * c, _mm512_mul_ps(acc[n][c], scale_v));
      }
    }
  }
  for (; r < rows; ++r) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t p = 0; p < pairs; ++p) {
      uint32_t pair;
      std::memcpy(&pair, k + r * k_stride + 2 * p, sizeof pair);
      const __m512bh key = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < 4; ++c) {
        acc[c] = _mm512_dpbf16_ps(acc[c], key,
                                  (__m512bh)_mm512_loadu_si512(q_pairs + p * kTileQ + 16 * c));
      }
    }
    for (int c = 0; c < 4; ++c)
      _mm512_storeu_ps(s + r * kTileQ + 16 * c, _mm512_mul_ps(acc[c], scale_v));
  }
}

MASKATTN_BF16_TARGET void bf16_pack_weights(const float* s, int64_t rows, uint32_t* p_pairs) {
  const __m512i order = interleave_halves();
  for (int64_t t = 0; t < (rows + 1) / 2; ++t) {
    const float* first = s + 2 * t * kTileQ;
    const bool has_second = 2 * t + 1 < rows;
    for (int c = 0; c < 4; ++c) {
      const __m512 a = _mm512_loadu_ps(first + 16 * c);
      const __m512 b = has_second ? _mm512_loadu_ps(first + kTileQ + 16 * c) : _mm512_setzero_ps();
      // Round to nearest even ([b | a] halves), then interleave into per-query pairs.
      const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      _mm512_storeu_si512(p_pairs + t * kTileQ + 16 * c, _mm512_permutexvar_epi16(order, halves));
    }
  }
}

MASKATTN_BF16_TARGET void bf16_pack_values(const uint16_t* v, int64_t v_stride, int64_t rows,
                                           int64_t value_dim, uint32_t* v_pairs) {
  // [a0, b0, a1, b1, …] from the low halves of a and b (indices ≥ 32 pick from b).
  alignas(64) uint16_t index[32];
  for (int n = 0; n < 16; ++n) {
    index[2 * n] = static_cast<uint16_t>(n);
    index[2 * n + 1] = static_cast<uint16_t>(32 + n);
  }
  const __m512i pairs = _mm512_load_si512(index);
  for (int64_t t = 0; t < (rows + 1) / 2; ++t) {
    const uint16_t* first = v + 2 * t * v_stride;
    const uint16_t* second = 2 * t + 1 < rows ? first + v_stride : nullptr;
    int64_t e = 0;
    for (; e + 16 <= value_dim; e += 16) {
      // 16 values of each row (masked loads: nothing past the row is read), interleaved.
      const __m512i a = _mm512_maskz_loadu_epi16(0xFFFF, first + e);
      const __m512i b =
          second != nullptr ? _mm512_maskz_loadu_epi16(0xFFFF, second + e) : _mm512_setzero_si512();
      _mm512_storeu_si512(v_pairs + t * value_dim + e, _mm512_permutex2var_epi16(a, pairs, b));
    }
    for (; e < value_dim; ++e) {
      const uint32_t low = first[e], high = second != nullptr ? second[e] : 0;
      v_pairs[t * value_dim + e] = low | (high << 16);
    }
  }
}

MASKATTN_BF16_TARGET void bf16_accumulate(const uint32_t* v_pairs, int64_t rows, int64_t value_dim,
                                          const uint32_t* p_pairs, const float* alpha, float* o) {
  const int64_t pairs = (rows + 1) / 2;
  const __m512 a0 = _mm512_loadu_ps(alpha), a1 = _mm512_loadu_ps(alpha + 16);
  const __m512 a2 = _mm512_loadu_ps(alpha + 32), a3 = _mm512_loadu_ps(alpha + 48);
  int64_t e = 0;
  for (; e + 4 <= value_dim; e += 4) {
    __m512 acc[4][4];
    for (int n = 0; n < 4; ++n) {
      float* row = o + (e + n) * kTileQ;
      acc[n][0] = _mm512_mul_ps(a0, _mm512_loadu_ps(row));
      acc[n][1] = _mm512_mul_ps(a1, _mm512_loadu_ps(row + 16));
      acc[n][2] = _mm512_mul_ps(a2, _mm512_loadu_ps(row + 32));
      acc[n][3] = _mm512_mul_ps(a3, _mm512_loadu_ps(row + 48));
    }
    for (int64_t t = 0; t < pairs; ++t) {
      const uint32_t* w = p_pairs + t * kTileQ;
      const __m512bh p0 = (__m512bh)_mm512_loadu_si512(w),
                     p1 = (__m512bh)_mm512_loadu_si512(w + 16);
      const __m512bh p2 = (__m512bh)_mm512_loadu_si512(w + 32),
                     p3 = (__m512bh)_mm512_loadu_si512(w + 48);
      for (int n = 0; n < 4; ++n) {
        const __m512bh value =
            (__m512bh)_mm512_set1_epi32(static_cast<int>(v_pairs[t * value_dim + e + n]));
        acc[n][0] = _mm512_dpbf16_ps(acc[n][0], value, p0);
        acc[n][1] = _mm512_dpbf16_ps(acc[n][1], value, p1);
        acc[n][2] = _mm512_dpbf16_ps(acc[n][2], value, p2);
        acc[n][3] = _mm512_dpbf16_ps(acc[n][3], value, p3);
      }
    }
    for (int n = 0; n < 4; ++n) {
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + (e + n) * kTileQ + 16 * c, acc[n][c]);
    }
  }
  for (; e < value_dim; ++e) {
    __m512 acc[4];
    const __m512 scales[4] = {a0, a1, a2, a3};
    for (int c = 0; c < 4; ++c)
      acc[c] = _mm512_mul_ps(scales[c], _mm512_loadu_ps(o + e * kTileQ + 16 * c));
    for (int64_t t = 0; t < pairs; ++t) {
      const __m512bh value =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(v_pairs[t * value_dim + e]));
      for (int c = 0; c < 4; ++c) {
        acc[c] = _mm512_dpbf16_ps(acc[c], value,
                                  (__m512bh)_mm512_loadu_si512(p_pairs + t * kTileQ + 16 * c));
      }
    }
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + e * kTileQ + 16 * c, acc[c]);
  }
}

}  // namespace maskattn::detail::fused

// ---- the product unit (product_unit.h) ------------------------------------------------------

namespace maskattn::detail::fused {

Bf16Operands bf16_operands(ScratchCarver& carve, int64_t head_dim) {
  return {carve.take<uint32_t>((head_dim + 1) / 2 * kTileQ),
          carve.take<uint32_t>(kTileK / 2 * kTileQ)};
}

void bf16_pack_block_queries(const Context& c, const Block& blk, Scratch& scratch) {
  const Problem& p = *c.problem;
  ScratchCarver carve(scratch.unit);
  bf16_pack_queries(
      static_cast<const uint16_t*>(p.q.data()) + p.q.offset({blk.b, blk.h, blk.q_first, 0}),
      p.q.stride(2), blk.q_count, p.head_dim, bf16_operands(carve, p.head_dim).q_pairs);
}

namespace {

struct Bf16DotUnit;  // tag of this unit's reused() buffers

bool fits(int64_t head_dim, int64_t, bool contiguous_rows) {
  return contiguous_rows && head_dim % 2 == 0;
}

double call_bytes(const Problem& p) {
  const double keys = static_cast<double>(p.k.size(0)) * p.k.size(1) * p.k_len;
  return 4.0 * (keys / 2 + p.batch * p.kv_heads) * p.value_dim;
}

int64_t thread_bytes(int64_t head_dim, int64_t) {
  ScratchCarver count(nullptr);
  bf16_operands(count, head_dim);
  return count.bytes();
}

Bf16Operands operands(const Context& c, const Scratch& scratch) {
  ScratchCarver carve(scratch.unit);
  return bf16_operands(carve, c.problem->head_dim);
}

// V's rows paired up once for all query blocks: [B, Hkv, ⌈Lk/2⌉, Dv] v_pairs.
const void* prepare(Problem& p) {
  std::vector<uint32_t>& pairs = reused<uint32_t, Bf16DotUnit>();
  const int64_t pair_rows = (p.k_len + 1) / 2;
  pairs.resize(p.batch * p.kv_heads * pair_rows * p.value_dim);
  const int threads = p.threads > 0 ? p.threads : omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      bf16_pack_values(static_cast<const uint16_t*>(p.v.data()) + p.v.offset({b, g, 0, 0}),
                       p.v.stride(2), p.k_len, p.value_dim,
                       pairs.data() + (b * p.kv_heads + g) * pair_rows * p.value_dim);
    }
  }
  return pairs.data();
}

void scores(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
            const ActiveRows*, Scratch& scratch) {
  const Problem& p = *c.problem;
  const uint16_t* k = static_cast<const uint16_t*>(p.k.data()) + p.k.offset({blk.b, g, j0, 0});
  bf16_scores(k, p.k.stride(2), rows, p.head_dim, operands(c, scratch).q_pairs,
              static_cast<float>(p.scale), scratch.s);
}

// P rounded to bf16 pairs, then O = α·O + P·V from the pairs packed per call (tiles start at even
// keys).
void accumulate(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                const ActiveRows*, Scratch& scratch) {
  const Problem& p = *c.problem;
  uint32_t* p_pairs = operands(c, scratch).p_pairs;
  bf16_pack_weights(scratch.s, rows, p_pairs);
  const uint32_t* v_pairs = static_cast<const uint32_t*>(c.prepared) +
                            ((blk.b * p.kv_heads + g) * ((p.k_len + 1) / 2) + j0 / 2) * p.value_dim;
  bf16_accumulate(v_pairs, rows, p.value_dim, p_pairs, scratch.alpha, scratch.o);
}

}  // namespace

const ProductUnit kBf16DotUnit = {
    .name = "bf16-dot",
    .fits = fits,
    .thread_bytes = thread_bytes,
    .backward_thread_bytes = nullptr,
    .call_bytes = call_bytes,
    .prepare = prepare,
    .begin_block = bf16_pack_block_queries,
    .end_block = nullptr,
    .scores = scores,
    .accumulate = accumulate,
    .active_rows = false,
    .raw_scores = nullptr,
    .raw_softmax_step = nullptr,
    .accumulate_weights = nullptr,
    // No backward products: a backward call takes the f32 unit's.
    .backward_fits = nullptr,
    .backward_call_bytes = nullptr,
    .backward_prepare = nullptr,
    .begin_key_tile = nullptr,
    .end_key_tile = nullptr,
    .backward_scores = nullptr,
    .backward_weights = nullptr,
    .backward_dp = nullptr,
    .backward_accumulate = nullptr,
};

}  // namespace maskattn::detail::fused
