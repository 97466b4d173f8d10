// attention_varlen_backward(): attention_backward() per sequence, planned as the forward is
// (varlen.cc's essay; plan.h).
//
// dq, dk and dv are rows of the packed tensors, and each row belongs to exactly one sequence
// (the offsets partition both axes), so each sequence's call writes its own rows and nothing is
// summed across sequences: the rows are those of attention_backward() on the sequence alone. A
// sequence with no queries still gets its call, which writes dk = dv = 0 for its keys (no query
// sees them), so every row of every output is written.
//
// The gradients of parameters shared by every sequence — the sinks [Hq], the bias (which
// broadcasts against the padded batch) and a score program's float tables — are sums over the
// sequences. Each sequence's call writes its own part into a buffer of its own, and the parts are
// added afterwards in sequence order, in f64, then rounded once: the same bits whatever thread
// computed which part.
#include <string>
#include <utility>
#include <vector>

#include "core/store_f32.h"
#include "mask/restrict.h"
#include "maskattn/error.h"
#include "maskattn/varlen.h"
#include "validate.h"
#include "varlen/plan.h"
#include "varlen/varlen_checks.h"

namespace maskattn {

namespace {

using varlen_detail::key_length;
using varlen_detail::query_length;
using varlen_detail::sequence_rows;
using varlen_detail::whole_rows;

MutableTensorView whole_output(const MutableTensorView& t) {
  const TensorView view = whole_rows(t);
  return MutableTensorView(t.mutable_data(), t.dtype(), view.sizes(), view.strides());
}

// out and dout [total_q, Hq, Dv] in q's dtype, lse [Hq, total_q] f32 (E139, E10).
void check_saved(const TensorView& q, const TensorView& v, const TensorView& out,
                 const TensorView& lse, const TensorView& dout) {
  const std::string qv = "q " + q.shape_string() + " and v " + v.shape_string();
  for (const auto& [t, name] : {std::pair{&out, "out"}, {&dout, "dout"}}) {
    varlen_detail::check_packed(*t, name, "[total_q, Hq, Dv]");
    varlen_detail::check_packed_shape(*t, {q.size(0), q.size(1), v.size(2)}, name, qv);
    if (t->dtype() != q.dtype()) {
      throw Error(std::string(name) + " has dtype " + dtype_name(t->dtype()) + " but must be " +
                  dtype_name(q.dtype()));
    }
  }
  if (lse.is_null()) varlen_fail("lse is a null view; expected [Hq, total_q]");
  varlen_detail::check_packed_shape(lse, {q.size(1), q.size(0)}, "lse",
                                    "q " + q.shape_string() + ": [Hq, total_q]");
  if (lse.dtype() != DType::f32) {
    throw Error(std::string("lse has dtype ") + dtype_name(lse.dtype()) + " but must be f32");
  }
}

// dq, dk, dv: the packed shapes of q, k, v, in q's dtype or f32; dsinks, dbias, dtables as
// attention_backward() wants them (they are whole, not per sequence).
void check_gradients(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Gradients& grads, const ScoreMods& mods) {
  for (const auto& [t, input, name] :
       {std::tuple{&grads.dq, &q, "dq"}, {&grads.dk, &k, "dk"}, {&grads.dv, &v, "dv"}}) {
    varlen_detail::check_packed(*t, name, "the packed shape of its input");
    varlen_detail::check_packed_shape(*t, input->sizes(), name,
                                      std::string(name + 1) + " " + input->shape_string());
    detail::require_result(whole_output(*t), whole_rows(*input).sizes(), q.dtype(), name,
                           std::string(name + 1) + " " + input->shape_string());
  }
  if (mods.score_fn) {
    throw Error(
        "attention_varlen_backward: mods.score_fn is an opaque callable with no derivative; the "
        "backward supports softcap, alibi_slopes, bias, a score program (mods.program), threshold "
        "and sinks");
  }
  if (!grads.dsinks.is_null()) {
    if (mods.sinks.empty()) throw Error("grads.dsinks is given but mods.sinks is not set");
    detail::require_output(grads.dsinks, {q.size(1)}, DType::f32, "dsinks",
                           "q " + q.shape_string() + " heads");
  }
  if (!grads.dbias.is_null()) {
    if (!mods.bias) throw Error("grads.dbias is given but mods.bias is not set");
    detail::require_output(grads.dbias, mods.bias->shape(), DType::f32, "dbias",
                           "bias " + shape_string(mods.bias->shape()));
  }
  if (grads.dtables.empty()) return;
  const size_t tables = mods.program ? mods.program->tables().size() : 0;
  if (grads.dtables.size() != tables) {
    throw Error("grads.dtables has " + std::to_string(grads.dtables.size()) +
                " views but mods.program has " + std::to_string(tables) +
                " tables: give one per table, null for those without a gradient");
  }
  for (size_t t = 0; t < tables; ++t) {
    if (grads.dtables[t].is_null()) continue;
    const ProgramTable& table = mods.program->tables()[t];
    detail::require_output(grads.dtables[t], Dims(table.sizes.begin(), table.sizes.end()),
                           DType::f32, "dtables[" + std::to_string(t) + "]", "table " + table.name);
  }
}

void check_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, const TensorView& dout,
                    const Varlen& varlen, const Gradients& grads, const Mask& mask,
                    const ScoreMods& mods, const Options& options) {
  const detail::Problem p = varlen_detail::check_inputs(q, k, v, varlen, options);
  check_saved(q, v, out, lse, dout);
  check_gradients(q, k, v, grads, mods);
  varlen_detail::NamedViews outputs = {{&grads.dq, "dq"},
                                       {&grads.dk, "dk"},
                                       {&grads.dv, "dv"},
                                       {&grads.dsinks, "dsinks"},
                                       {&grads.dbias, "dbias"}};
  for (size_t t = 0; t < grads.dtables.size(); ++t) {
    outputs.emplace_back(&grads.dtables[t], "dtables[" + std::to_string(t) + "]");
  }
  varlen_detail::check_outputs_disjoint(
      outputs, {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}, {&dout, "dout"}});
  varlen_detail::check_mask(p, varlen, mask, mods, options);
  if (options.check_finite) {
    detail::check_finite_inputs(p, mask, mods);
    detail::require_finite(dout, "dout");
  }
}

// The per-sequence parts of the shared gradients (dsinks, dbias, dtables): part[i] holds
// sequence i's, in one buffer per sequence and tensor.
struct SharedParts {
  std::vector<std::vector<std::vector<float>>> part;  // [sequence][tensor]

  // The views sequence i's call writes its parts into (null where nothing is wanted).
  void attach(int64_t i, const Gradients& whole, const ScoreMods& restricted, Gradients& into) {
    std::vector<std::vector<float>>& own = part[i];
    own.assign(2 + whole.dtables.size(), {});
    const auto view = [&](size_t n, const Dims& dims) {
      own[n].assign(static_cast<size_t>(checked_numel(dims, "gradient part")), 0.0f);
      return MutableTensorView(own[n].data(), dims);
    };
    if (!whole.dsinks.is_null()) into.dsinks = view(0, whole.dsinks.sizes());
    if (!whole.dbias.is_null()) into.dbias = view(1, restricted.bias->shape());
    for (size_t t = 0; t < whole.dtables.size(); ++t) {
      into.dtables.push_back(whole.dtables[t].is_null() ? MutableTensorView()
                                                        : view(2 + t, whole.dtables[t].sizes()));
    }
  }
};

// Sums the parts in sequence order (f64) and stores them once, added when grads.accumulate.
void reduce_parts(const SharedParts& parts, const Varlen& varlen, const Gradients& grads,
                  const ScoreMods& mods) {
  std::vector<const MutableTensorView*> targets = {&grads.dsinks, &grads.dbias};
  for (const MutableTensorView& table : grads.dtables) targets.push_back(&table);
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n]->is_null()) continue;
    std::vector<double> sum(static_cast<size_t>(targets[n]->numel()), 0.0);
    for (int64_t i = 0; i < varlen.batch(); ++i) {
      const std::vector<float>& part = parts.part[i][n];
      if (n == 1) {
        detail::add_restricted_bias(mods.bias->shape(), i, query_length(varlen, i),
                                    key_length(varlen, i), part.data(), sum.data());
      } else {
        for (size_t e = 0; e < sum.size(); ++e) sum[e] += part[e];
      }
    }
    const std::vector<float> rounded(sum.begin(), sum.end());
    detail::store_f32(rounded.data(), *targets[n], grads.accumulate);
  }
}

}  // namespace

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const Varlen& varlen, const Gradients& grads, const Mask& mask,
                               const ScoreMods& mods, const Options& options) {
  check_backward(q, k, v, out, lse, dout, varlen, grads, mask, mods, options);
  const varlen_detail::Plan plan = varlen_detail::plan_sequences(varlen, q.size(1), options);
  SharedParts parts;
  parts.part.resize(static_cast<size_t>(varlen.batch()));
  varlen_detail::run_plan(plan, options, [&](int64_t i, int threads) {
    const int64_t lq = query_length(varlen, i), lk = key_length(varlen, i);
    const int64_t q0 = varlen.cu_seqlens_q[i], k0 = varlen.cu_seqlens_k[i];
    SequenceProblem s = varlen_detail::sequence_problem(varlen, i, mask, mods, options);
    s.options.threads = threads;
    Gradients own(sequence_rows(grads.dq, q0, lq), sequence_rows(grads.dk, k0, lk),
                  sequence_rows(grads.dv, k0, lk));
    own.accumulate = grads.accumulate;
    parts.attach(i, grads, s.mods, own);
    attention_backward(sequence_rows(q, q0, lq), sequence_rows(k, k0, lk), sequence_rows(v, k0, lk),
                       sequence_rows(out, q0, lq), varlen_detail::sequence_lse(lse, q0, lq),
                       sequence_rows(dout, q0, lq), own, s.mask, s.mods, s.options);
  });
  reduce_parts(parts, varlen, grads, mods);
}

}  // namespace maskattn
