#include "ring/ring_checks.h"

#include "maskattn/error.h"
#include "ring/ring_rank.h"

namespace maskattn::dist::detail {
namespace {

std::string prefix(const char* who) {
  return std::string(who) + ": ";
}

void require_rank4(const char* who, const TensorView& t, const char* name, const char* layout) {
  if (t.is_null() || t.rank() != 4) {
    throw Error(prefix(who) + name + " has shape " + (t.is_null() ? "null" : t.shape_string()) +
                "; expected " + layout);
  }
}

// E115: a shard whose rows differ from what local_ranges() gives this rank.
void require_rows(const char* who, const TensorView& t, const char* name, int64_t rows,
                  const char* of_what) {
  if (t.size(2) != rows) {
    throw Error(prefix(who) + name + " " + t.shape_string() + " holds " +
                std::to_string(t.size(2)) + " rows but this rank's " + of_what + " are " +
                std::to_string(rows) + " rows (local_ranges)");
  }
}

// E119: a gradient view that does not fit its tensor.
void require_gradient(const char* who, const TensorView& g, const char* name,
                      const TensorView& like) {
  if (g.is_null() || g.sizes() != like.sizes() ||
      (g.dtype() != like.dtype() && g.dtype() != DType::f32)) {
    const std::string dtypes = like.dtype() == DType::f32
                                   ? std::string("f32")
                                   : std::string(dtype_name(like.dtype())) + " or f32";
    throw Error(prefix(who) + name + " is " + (g.is_null() ? "null" : g.shape_string()) + " " +
                dtype_name(g.dtype()) + "; it must be " + like.shape_string() + " " + dtypes);
  }
}

}  // namespace

void check_ring_options(const char* who, const RingOptions& options) {
  if (!options.base.frame.is_whole()) {
    throw Error(prefix(who) +
                "options.base.frame must be the default; the ring sets each call's frame");
  }
  if (!options.base.count_sinks) {
    throw Error(prefix(who) +
                "options.base.count_sinks must be true; the ring counts the sinks once per row");
  }
  if (options.layout != Layout::contiguous && options.layout != Layout::zigzag) {
    throw Error(prefix(who) + "unknown layout " + std::to_string(static_cast<int>(options.layout)));
  }
}

void check_forward_inputs(const char* who, const RingInputs& in, const Mask& mask,
                          const ScoreMods& mods, const RingOptions& options, int64_t q_rows,
                          int64_t k_rows, int64_t q_first, int64_t k_first, int64_t q_len,
                          int64_t k_len) {
  check_ring_options(who, options);
  require_rank4(who, in.q, "q", "[B,Hq,Lq,D]");
  require_rank4(who, in.k, "k", "[B,Hkv,Lk,D]");
  require_rank4(who, in.v, "v", "[B,Hkv,Lk,Dv]");
  require_rank4(who, in.out, "out", "[B,Hq,Lq,Dv]");
  require_rows(who, in.q, "q", q_rows, "query rows");
  require_rows(who, in.out, "out", q_rows, "query rows");
  require_rows(who, in.k, "k", k_rows, "key rows");
  require_rows(who, in.v, "v", k_rows, "key rows");
  if (in.out.dtype() != in.q.dtype()) {
    throw Error(prefix(who) + "out has dtype " + dtype_name(in.out.dtype()) + " but must be " +
                dtype_name(in.q.dtype()) + " (q's)");
  }
  if (!in.lse.is_null() && (in.lse.rank() != 3 || in.lse.size(2) != q_rows)) {
    throw Error(prefix(who) + "lse " + in.lse.shape_string() + " must be [B,Hq," +
                std::to_string(q_rows) + "] (this rank's query rows)");
  }
  // The probe: one query row against one key row, in the global frame, into scratch outputs.
  const TensorView q1 = row_slice(in.q, 0, 1), k1 = row_slice(in.k, 0, 1),
                   v1 = row_slice(in.v, 0, 1);
  F32Tensor out({in.q.size(0), in.q.size(1), 1, in.v.size(3)}, 0.0f);
  F32Tensor lse({in.q.size(0), in.q.size(1), 1}, 0.0f);
  Options probe = options.base;
  probe.frame = Frame{q_first, k_first, q_len, k_len};
  attention(q1, k1, v1, out.mutable_view(), mask, mods, probe, lse.mutable_view());
  if (!in.lse.is_null()) {
    if (in.lse.dtype() != DType::f32 || in.lse.size(0) != in.q.size(0) ||
        in.lse.size(1) != in.q.size(1)) {
      throw Error(prefix(who) + "lse is " + dtype_name(in.lse.dtype()) + " " +
                  in.lse.shape_string() + "; it must be f32 [B,Hq," + std::to_string(q_rows) + "]");
    }
  }
}

void check_backward_inputs(const char* who, const RingInputs& in, const Mask& mask,
                           const ScoreMods& mods, const RingOptions& options, int64_t q_rows,
                           int64_t k_rows, int64_t q_first, int64_t k_first, int64_t q_len,
                           int64_t k_len) {
  if (in.lse.is_null()) {
    throw Error(prefix(who) + "lse is required: the merged LSE the forward ring returned");
  }
  require_rank4(who, in.dout, "dout", "[B,Hq,Lq,Dv]");
  check_forward_inputs(who, in, mask, mods, options, q_rows, k_rows, q_first, k_first, q_len,
                       k_len);
  if (in.dout.sizes() != in.out.sizes() || in.dout.dtype() != in.out.dtype()) {
    throw Error(prefix(who) + "dout " + in.dout.shape_string() + " " + dtype_name(in.dout.dtype()) +
                " must have out's shape and dtype " + in.out.shape_string() + " " +
                dtype_name(in.out.dtype()));
  }
  require_gradient(who, in.grads.dq, "grads.dq", in.q);
  require_gradient(who, in.grads.dk, "grads.dk", in.k);
  require_gradient(who, in.grads.dv, "grads.dv", in.v);
  const Dims hq = {in.q.size(1)};
  if (!in.grads.dsinks.is_null() && (in.grads.dsinks.dtype() != DType::f32 ||
                                     in.grads.dsinks.sizes() != hq || mods.sinks.empty())) {
    throw Error(prefix(who) + "grads.dsinks " + in.grads.dsinks.shape_string() +
                " must be f32 [Hq] and needs mods.sinks");
  }
  if (!in.grads.dbias.is_null() && (!mods.bias || in.grads.dbias.dtype() != DType::f32 ||
                                    in.grads.dbias.sizes() != mods.bias->shape())) {
    throw Error(prefix(who) + "grads.dbias " + in.grads.dbias.shape_string() +
                " must be f32 with mods.bias's shape");
  }
  // The probe: the backward of one query row against one key row, into scratch gradients.
  F32Tensor dq({in.q.size(0), in.q.size(1), 1, in.q.size(3)}, 0.0f);
  F32Tensor dk({in.k.size(0), in.k.size(1), 1, in.k.size(3)}, 0.0f);
  F32Tensor dv({in.v.size(0), in.v.size(1), 1, in.v.size(3)}, 0.0f);
  F32Tensor dsinks, dbias;
  Gradients scratch{dq.mutable_view(), dk.mutable_view(), dv.mutable_view(), {}, {}, true};
  if (!in.grads.dbias.is_null()) {
    dbias = F32Tensor(mods.bias->shape(), 0.0f);
    scratch.dbias = dbias.mutable_view();
  }
  if (!in.grads.dsinks.is_null()) {
    dsinks = F32Tensor(hq, 0.0f);
    scratch.dsinks = dsinks.mutable_view();
  }
  Options probe = options.base;
  probe.frame = Frame{q_first, k_first, q_len, k_len};
  attention_backward(row_slice(in.q, 0, 1), row_slice(in.k, 0, 1), row_slice(in.v, 0, 1),
                     row_slice(in.out, 0, 1), row_slice(in.lse, 0, 1), row_slice(in.dout, 0, 1),
                     scratch, mask, mods, probe);
}

}  // namespace maskattn::dist::detail
