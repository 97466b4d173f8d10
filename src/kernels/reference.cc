#include "kernels/reference.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <optional>
#include <vector>

#include "core/dropout.h"
#include "core/element.h"
#include "core/store_f32.h"
#include "kernels/score_chain.h"
#include "maskattn/memory.h"

namespace maskattn::detail::reference {

namespace {

constexpr double kNegInf = -INFINITY;

// Every element type widens exactly to f32, hence to f64.
double element(const TensorView& t, int64_t offset) {
  return load_float(t, offset);
}

// Reads n elements starting at `offset`, `stride` apart, widened to f64.
void load_row(const TensorView& t, int64_t offset, int64_t stride, int64_t n, double* out) {
  for (int64_t d = 0; d < n; ++d) out[d] = element(t, offset + d * stride);
}

// Rounds once, to nearest even, into the view's dtype.
void store(const MutableTensorView& t, int64_t offset, double value) {
  switch (t.dtype()) {
    case DType::f32:
      static_cast<float*>(t.mutable_data())[offset] = float_from_double(value);
      break;
    case DType::f16:
      static_cast<float16*>(t.mutable_data())[offset] = float16_from_double(value);
      break;
    case DType::bf16:
      static_cast<bfloat16*>(t.mutable_data())[offset] = bfloat16_from_double(value);
      break;
  }
}

struct RowScratch {
  explicit RowScratch(const Problem& p)
      : q_row(p.head_dim),
        k_row(p.head_dim),
        scores(p.k_len),
        weights(p.k_len),
        dropout(p.dropout.on ? p.k_len : 0),
        out_row(p.value_dim) {}
  std::vector<double> q_row, k_row;  // [D]
  std::vector<double> scores;        // [Lk]
  std::vector<double> weights;       // [Lk]
  std::vector<double> dropout;       // [Lk] with dropout: 0 dropped, 1/(1 − p') kept
  std::vector<double> out_row;       // [Dv]
};

// Runs fn(b, h, i, scratch) for every query row, rows split across threads. Rows are independent,
// so the result does not depend on the thread count. The first exception thrown by a user callable
// (predicate, score_fn) is rethrown on the calling thread.
template <typename RowFn>
void for_each_row(const Problem& p, RowFn&& fn) {
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  if (rows == 0) return;
  const int requested = p.threads > 0 ? p.threads : omp_get_max_threads();
  const int threads = static_cast<int>(std::min<int64_t>(requested, rows));
  require_memory(8.0 * threads * (2.0 * p.k_len + 2.0 * p.head_dim + p.value_dim),
                 "the reference kernel for q " + p.q.shape_string() + ", k " + p.k.shape_string());
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  const auto record = [&] {
#pragma omp critical(maskattn_reference_failure)
    if (!failure) failure = std::current_exception();
    failed = true;
  };
#pragma omp parallel num_threads(threads)
  {
    // Every thread must reach the worksharing loop, even one whose scratch allocation failed.
    std::optional<RowScratch> scratch;
    try {
      scratch.emplace(p);
    } catch (...) {
      record();
    }
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const int64_t i = row % p.q_len;
      const int64_t h = (row / p.q_len) % p.q_heads;
      const int64_t b = row / (p.q_len * p.q_heads);
      try {
        fn(b, h, i, *scratch);
      } catch (...) {
        record();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// The final score of an allowed pair (score_chain.h); −inf when the threshold hides it.
double modified_score(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j, double s) {
  return detail::modified_score(*p.mods, *p.mask, p.mask->has_additive(), b, h, i, j, s);
}

// Fills scratch.scores[j] for row (b, h, i). At ScoreStage::final, hidden pairs are −inf and their
// keys are never read.
void row_scores(const Problem& p, int64_t b, int64_t h, int64_t i, ScoreStage stage,
                RowScratch& scratch) {
  const int64_t kv_h = p.kv_head(h);
  load_row(p.q, p.q.offset({b, h, i, 0}), p.q.stride(3), p.head_dim, scratch.q_row.data());
  for (int64_t j = 0; j < p.k_len; ++j) {
    if (stage == ScoreStage::final && !p.mask->allowed(b, h, i, j)) {
      scratch.scores[j] = kNegInf;
      continue;
    }
    load_row(p.k, p.k.offset({b, kv_h, j, 0}), p.k.stride(3), p.head_dim, scratch.k_row.data());
    double dot = 0.0;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += scratch.q_row[d] * scratch.k_row[d];
    const double s = p.scale * dot;
    scratch.scores[j] = stage == ScoreStage::scaled ? s : modified_score(p, b, h, i, j, s);
  }
}

// With dropout, scratch.dropout[j] = the factor pair (b, h, i, j) multiplies its weight by
// (core/dropout.h's definition, at the pair's global rows); nothing without dropout.
void row_dropout(const Problem& p, int64_t b, int64_t h, int64_t i, RowScratch& scratch) {
  if (!p.dropout.on) return;
  const int64_t q = i + p.mask->q_origin(), k0 = p.mask->k_origin();
  for (int64_t j = 0; j < p.k_len; ++j) {
    scratch.dropout[j] = dropout_keeps(p.dropout, b, h, q, j + k0) ? p.dropout.keep_scale : 0.0;
  }
}

// Whether dropout drops pair j of the row: its value is then not read. Not in a NaN row, which
// stays NaN whatever is dropped (as in the fused kernels).
bool dropped(const Problem& p, const RowScratch& scratch, int64_t j) {
  return p.dropout.on && scratch.dropout[j] == 0.0 && !std::isnan(scratch.weights[j]);
}

// The weight pair j contributes to the output: P_ij, times its dropout factor.
double output_weight(const Problem& p, const RowScratch& scratch, int64_t j) {
  return p.dropout.on ? scratch.weights[j] * scratch.dropout[j] : scratch.weights[j];
}

// weights = softmax(scores) with the sink logit (if any) in the denominator; returns the LSE.
// A row whose every score is −inf (and no sink) gets weights 0 and LSE −inf: the fully-hidden
// rule, never (−inf) − (−inf) = NaN. A NaN score makes the row's allowed weights, its output and
// its LSE NaN (IEEE propagation); hidden pairs keep weight 0.
double row_softmax(const Problem& p, int64_t h, RowScratch& scratch) {
  const double sink = p.mods->sinks != nullptr ? p.mods->sinks[h] : kNegInf;
  double row_max = sink;
  bool has_nan = false;
  for (int64_t j = 0; j < p.k_len; ++j) {
    has_nan |= std::isnan(scratch.scores[j]);
    if (scratch.scores[j] > row_max) row_max = scratch.scores[j];
  }
  if (has_nan) {  // hidden pairs keep weight 0 even here
    for (int64_t j = 0; j < p.k_len; ++j) {
      scratch.weights[j] = scratch.scores[j] == kNegInf ? 0.0 : NAN;
    }
    return NAN;
  }
  if (row_max == kNegInf) {
    for (int64_t j = 0; j < p.k_len; ++j) scratch.weights[j] = 0.0;
    return kNegInf;
  }
  double denominator = std::exp(sink - row_max);  // 0 without a sink
  for (int64_t j = 0; j < p.k_len; ++j) {
    scratch.weights[j] = std::exp(scratch.scores[j] - row_max);
    denominator += scratch.weights[j];
  }
  for (int64_t j = 0; j < p.k_len; ++j) scratch.weights[j] /= denominator;
  return row_max + std::log(denominator);
}

}  // namespace

void forward(const Problem& p, const MutableTensorView& out, const MutableTensorView& lse) {
  if (out.numel() == 0 && lse.is_null()) return;  // e.g. Dv = 0: nothing to write
  for_each_row(p, [&](int64_t b, int64_t h, int64_t i, RowScratch& scratch) {
    row_scores(p, b, h, i, ScoreStage::final, scratch);
    const double row_lse = row_softmax(p, h, scratch);
    row_dropout(p, b, h, i, scratch);
    // O = Σ_j P_ij·V_j over allowed keys only: values at hidden positions are never read, so
    // garbage or NaN in padded slots cannot leak into the result; nor are dropped pairs' values.
    std::fill(scratch.out_row.begin(), scratch.out_row.end(), 0.0);
    const int64_t kv_h = p.kv_head(h);
    for (int64_t j = 0; j < p.k_len; ++j) {
      if (scratch.scores[j] == kNegInf || dropped(p, scratch, j)) continue;
      const double weight = output_weight(p, scratch, j);
      const int64_t v_offset = p.v.offset({b, kv_h, j, 0});
      for (int64_t d = 0; d < p.value_dim; ++d) {
        scratch.out_row[d] += weight * element(p.v, v_offset + d * p.v.stride(3));
      }
    }
    const int64_t out_offset = out.offset({b, h, i, 0});
    for (int64_t d = 0; d < p.value_dim; ++d) {
      store(out, out_offset + d * out.stride(3), scratch.out_row[d]);
    }
    if (!lse.is_null()) store(lse, lse.offset({b, h, i, 0}), row_lse);
  });
}

void forward_f64(const Problem& p, double* out) {
  for_each_row(p, [&](int64_t b, int64_t h, int64_t i, RowScratch& scratch) {
    row_scores(p, b, h, i, ScoreStage::final, scratch);
    row_softmax(p, h, scratch);
    row_dropout(p, b, h, i, scratch);
    double* row = out + ((b * p.q_heads + h) * p.q_len + i) * p.value_dim;
    std::fill(row, row + p.value_dim, 0.0);
    const int64_t kv_h = p.kv_head(h);
    for (int64_t j = 0; j < p.k_len; ++j) {
      if (scratch.scores[j] == kNegInf || dropped(p, scratch, j)) continue;
      const double weight = output_weight(p, scratch, j);
      const int64_t v_offset = p.v.offset({b, kv_h, j, 0});
      for (int64_t d = 0; d < p.value_dim; ++d) {
        row[d] += weight * element(p.v, v_offset + d * p.v.stride(3));
      }
    }
  });
}

namespace {

// One (b, kv head) of the backward: the rows of every query head sharing kv head g, in order,
// each adding into this pair's own dK and dV (f64, [Lk][D] and [Lk][Dv]).
struct BackwardScratch {
  explicit BackwardScratch(const Problem& p)
      : row(p),
        s0(p.k_len),
        dout_row(p.value_dim),
        o_row(p.value_dim),
        dq_row(p.head_dim),
        dk(p.k_len * p.head_dim),
        dv(p.k_len * p.value_dim) {}
  RowScratch row;
  std::vector<double> s0;        // [Lk] scale·q·k before any modifier (softcap's derivative)
  std::vector<double> dout_row;  // [Dv]
  std::vector<double> o_row;     // [Dv]
  std::vector<double> dq_row;    // [D]
  std::vector<double> dk, dv;
};

// dS through a score program at the pair: ×∂program/∂s (f32, the program's arithmetic; the
// product in f64), and dS·∂program/∂table into the wanted tables' sums.
double through_program(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j, double s0,
                       double dS, double* const* dtables) {
  const ResolvedMods& mods = *p.mods;
  const float s_in = static_cast<float>(
      detail::program_input_score(mods, *p.mask, p.mask->has_additive(), b, h, i, j, s0));
  const ProgramTile pair = mods.program_tile(b, h, i, 1, j, 1);
  if (dtables != nullptr) {
    float table_ds = static_cast<float>(dS);
    mods.program->score_tile_backward(pair, &s_in, &table_ds, dtables);
  }
  float slope = 1.0f;
  mods.program->score_tile_backward(pair, &s_in, &slope, nullptr);
  return dS * slope;
}

// One query row (b, h, i) of the backward: recomputes its forward, adds its terms to the kv
// head's dK and dV (f64, in scratch), and stores dQ_i.
void backward_row(const Problem& p, const TensorView& dout, const Gradients& grads, int64_t b,
                  int64_t h, int64_t i, BackwardScratch& scratch, double* dbias, double* dsinks,
                  double* const* dtables) {
  const ResolvedMods& mods = *p.mods;
  const int64_t g = p.kv_head(h);
  RowScratch& row = scratch.row;
  // Forward, recomputed: s0 (scaled), s (final, −inf when hidden), P, the dropout factors, O_i.
  row_scores(p, b, h, i, ScoreStage::scaled, row);
  std::copy(row.scores.begin(), row.scores.end(), scratch.s0.begin());
  for (int64_t j = 0; j < p.k_len; ++j) {
    row.scores[j] =
        p.mask->allowed(b, h, i, j) ? modified_score(p, b, h, i, j, scratch.s0[j]) : kNegInf;
  }
  const double lse = row_softmax(p, h, row);
  row_dropout(p, b, h, i, row);
  std::fill(scratch.dq_row.begin(), scratch.dq_row.end(), 0.0);
  const bool has_keys =
      std::any_of(row.scores.begin(), row.scores.end(), [](double s) { return s != kNegInf; });
  if (has_keys) {
    load_row(dout, dout.offset({b, h, i, 0}), dout.stride(3), p.value_dim, scratch.dout_row.data());
    std::fill(scratch.o_row.begin(), scratch.o_row.end(), 0.0);
    for (int64_t j = 0; j < p.k_len; ++j) {
      if (row.scores[j] == kNegInf || dropped(p, row, j)) continue;
      const double weight = output_weight(p, row, j);
      load_row(p.v, p.v.offset({b, g, j, 0}), p.v.stride(3), p.value_dim, row.out_row.data());
      for (int64_t e = 0; e < p.value_dim; ++e) scratch.o_row[e] += weight * row.out_row[e];
    }
    // D_i = Σ_e dO_ie·O_ie = Σ_j P_ij·dP_ij: the softmax Jacobian's rank-one term (O and dP both
    // with the dropout factors Z_ij/(1 − p'), so the identity holds under dropout too).
    double D = 0.0;
    for (int64_t e = 0; e < p.value_dim; ++e) D += scratch.dout_row[e] * scratch.o_row[e];
    load_row(p.q, p.q.offset({b, h, i, 0}), p.q.stride(3), p.head_dim, row.q_row.data());
    for (int64_t j = 0; j < p.k_len; ++j) {
      if (row.scores[j] == kNegInf) continue;  // hidden: no gradient flows
      const double P = row.weights[j];
      const double factor = p.dropout.on ? row.dropout[j] : 1.0;
      const bool read_value = !dropped(p, row, j);  // a dropped pair's value is not read
      if (read_value) {
        load_row(p.v, p.v.offset({b, g, j, 0}), p.v.stride(3), p.value_dim, row.out_row.data());
      }
      double dP = 0.0;  // dP_ij = factor·dO_i·V_j
      for (int64_t e = 0; e < p.value_dim && read_value; ++e) {
        dP += scratch.dout_row[e] * row.out_row[e];
        scratch.dv[j * p.value_dim + e] += P * factor * scratch.dout_row[e];  // dV_j += P'_ij·dO_i
      }
      dP *= factor;
      double dS = P * (dP - D);  // ∂L/∂s_ij, s the final score (softmax backward)
      if (mods.program != nullptr) dS = through_program(p, b, h, i, j, scratch.s0[j], dS, dtables);
      if (dbias != nullptr) dbias[mods.bias_offset(b, h, i, j)] += dS;
      if (mods.softcap) {  // s = cap·tanh(s0/cap)  ⇒  ∂s/∂s0 = 1 − tanh²(s0/cap)
        const double t = std::tanh(scratch.s0[j] / *mods.softcap);
        dS *= 1.0 - t * t;
      }
      load_row(p.k, p.k.offset({b, g, j, 0}), p.k.stride(3), p.head_dim, row.k_row.data());
      for (int64_t d = 0; d < p.head_dim; ++d) {
        scratch.dq_row[d] += p.scale * dS * row.k_row[d];               // dQ_i += scale·dS·K_j
        scratch.dk[j * p.head_dim + d] += p.scale * dS * row.q_row[d];  // dK_j += scale·dS·Q_i
      }
    }
    // A sink is a logit σ_h in the denominator with no value: ∂L/∂σ_h = −Σ_i P_i,sink·D_i.
    if (dsinks != nullptr && mods.sinks != nullptr) {
      dsinks[h] -= std::exp(static_cast<double>(mods.sinks[h]) - lse) * D;
    }
  }
  const int64_t dq_offset = grads.dq.offset({b, h, i, 0});
  for (int64_t d = 0; d < p.head_dim; ++d) {
    store(grads.dq, dq_offset + d * grads.dq.stride(3), scratch.dq_row[d]);
  }
}

// One (b, kv head g): the rows of every query head sharing it, in order, then its dK and dV.
void backward_kv_head(const Problem& p, const TensorView& dout, const Gradients& grads, int64_t b,
                      int64_t g, BackwardScratch& scratch, double* dbias, double* dsinks,
                      double* const* dtables) {
  std::fill(scratch.dk.begin(), scratch.dk.end(), 0.0);
  std::fill(scratch.dv.begin(), scratch.dv.end(), 0.0);
  const int64_t group = p.q_heads / p.kv_heads;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i = 0; i < p.q_len; ++i) {
      backward_row(p, dout, grads, b, h, i, scratch, dbias, dsinks, dtables);
    }
  }
  for (int64_t j = 0; j < p.k_len; ++j) {
    for (int64_t d = 0; d < p.head_dim; ++d) {
      store(grads.dk, grads.dk.offset({b, g, j, d}), scratch.dk[j * p.head_dim + d]);
    }
    for (int64_t e = 0; e < p.value_dim; ++e) {
      store(grads.dv, grads.dv.offset({b, g, j, e}), scratch.dv[j * p.value_dim + e]);
    }
  }
}

}  // namespace

void backward(const Problem& p, const TensorView& dout, const Gradients& grads) {
  // Table gradients of a score program: one f64 sum per element, like dbias.
  std::vector<std::vector<double>> dtables;
  std::vector<double*> dtable_pointers;
  bool any_table = false;
  if (p.mods->program != nullptr && !grads.dtables.empty()) {
    dtables.resize(grads.dtables.size());
    for (size_t t = 0; t < grads.dtables.size(); ++t) {
      if (grads.dtables[t].is_null()) continue;
      dtables[t].assign(grads.dtables[t].numel(), 0.0);
      any_table = true;
    }
    for (std::vector<double>& table : dtables) {
      dtable_pointers.push_back(table.empty() ? nullptr : table.data());
    }
  }
  const bool shared_outputs = !grads.dbias.is_null() || !grads.dsinks.is_null() || any_table;
  std::vector<double> dbias, dsinks;
  if (!grads.dbias.is_null()) dbias.assign(grads.dbias.numel(), 0.0);
  if (!grads.dsinks.is_null()) dsinks.assign(p.q_heads, 0.0);
  const int64_t pairs = p.batch * p.kv_heads;
  const int requested = p.threads > 0 ? p.threads : omp_get_max_threads();
  const int threads = shared_outputs ? 1 : static_cast<int>(std::min<int64_t>(requested, pairs));
  require_memory(8.0 * std::max(threads, 1) *
                         (3.0 * p.k_len + 2.0 * p.head_dim + 3.0 * p.value_dim +
                          static_cast<double>(p.k_len) * (p.head_dim + p.value_dim)) +
                     8.0 * static_cast<double>(grads.dbias.is_null() ? 0 : grads.dbias.numel()),
                 "attention_backward (reference kernel) for q " + p.q.shape_string() + ", k " +
                     p.k.shape_string());
  std::exception_ptr failure;
#pragma omp parallel num_threads(std::max(threads, 1))
  {
    std::optional<BackwardScratch> scratch;
    try {
      scratch.emplace(p);
    } catch (...) {
#pragma omp critical(maskattn_reference_failure)
      if (!failure) failure = std::current_exception();
    }
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      if (!scratch) continue;
      try {
        backward_kv_head(p, dout, grads, pair / p.kv_heads, pair % p.kv_heads, *scratch,
                         dbias.empty() ? nullptr : dbias.data(),
                         dsinks.empty() ? nullptr : dsinks.data(),
                         any_table ? dtable_pointers.data() : nullptr);
      } catch (...) {
#pragma omp critical(maskattn_reference_failure)
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
  // dbias is laid out as the bias array is (row-major); the view may have any strides.
  for (int64_t n = 0; n < static_cast<int64_t>(dbias.size()); ++n) {
    int64_t rest = n, offset = 0;
    for (int axis = grads.dbias.rank() - 1; axis >= 0; --axis) {
      offset += (rest % grads.dbias.size(axis)) * grads.dbias.stride(axis);
      rest /= grads.dbias.size(axis);
    }
    store(grads.dbias, offset, dbias[n]);
  }
  for (int64_t h = 0; h < static_cast<int64_t>(dsinks.size()); ++h) {
    store(grads.dsinks, h * grads.dsinks.stride(0), dsinks[h]);
  }
  for (size_t t = 0; t < dtables.size(); ++t) {
    if (dtables[t].empty()) continue;
    const std::vector<float> values(dtables[t].begin(), dtables[t].end());
    detail::store_f32(values.data(), grads.dtables[t], grads.accumulate);
  }
}

void weights(const Problem& p, const MutableTensorView& weights) {
  for_each_row(p, [&](int64_t b, int64_t h, int64_t i, RowScratch& scratch) {
    row_scores(p, b, h, i, ScoreStage::final, scratch);
    row_softmax(p, h, scratch);
    row_dropout(p, b, h, i, scratch);
    const int64_t offset = weights.offset({b, h, i, 0});
    for (int64_t j = 0; j < p.k_len; ++j) {
      store(weights, offset + j * weights.stride(3), output_weight(p, scratch, j));
    }
  });
}

void scores(const Problem& p, ScoreStage stage, const MutableTensorView& scores) {
  for_each_row(p, [&](int64_t b, int64_t h, int64_t i, RowScratch& scratch) {
    row_scores(p, b, h, i, stage, scratch);
    const int64_t offset = scores.offset({b, h, i, 0});
    for (int64_t j = 0; j < p.k_len; ++j) {
      store(scores, offset + j * scores.stride(3), scratch.scores[j]);
    }
  });
}

}  // namespace maskattn::detail::reference
