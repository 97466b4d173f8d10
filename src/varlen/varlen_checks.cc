// The checks of a varlen call's own arguments (docs/errors.md E136–E139), and the views through
// which one sequence's rows are handed to attention() without a copy.
//
// The offsets are FlashAttention's: cu_seqlens_q = [0, Lq_0, Lq_0 + Lq_1, …, total_q]. A
// malformed array would make sequences overlap or leave rows unowned (and unwritten), so every
// property is checked, with the index of the first entry that breaks it.
#include <algorithm>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/dropout.h"
#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"
#include "maskattn/error.h"
#include "validate.h"
#include "varlen/plan.h"
#include "varlen/varlen_checks.h"

namespace maskattn {

void varlen_fail(const std::string& message) {
  throw Error(message);
}

namespace varlen_detail {

namespace {

std::string entries(const std::vector<int64_t>& offsets) {
  std::string text = "[";
  for (size_t n = 0; n < offsets.size() && n < 8; ++n) {
    if (n > 0) text += ',';
    text += std::to_string(offsets[n]);
  }
  return text + (offsets.size() > 8 ? ",…]" : "]");
}

// One offsets array: at least one entry, 0 first, non-decreasing (E136), the last = total (E137),
// no sequence longer than max_seqlen (E138).
void check_one(const std::vector<int64_t>& offsets, const char* side, int64_t total,
               int64_t max_seqlen, const char* rows_of) {
  const std::string name = std::string("cu_seqlens_") + side;
  if (offsets.empty()) {
    varlen_fail(name + " is empty; it holds B + 1 offsets starting at 0 (B sequences)");
  }
  if (offsets[0] != 0) {
    varlen_fail(name + " " + entries(offsets) + " starts at " + std::to_string(offsets[0]) +
                "; the first offset must be 0");
  }
  for (size_t n = 1; n < offsets.size(); ++n) {
    if (offsets[n] < offsets[n - 1]) {
      varlen_fail(name + " " + entries(offsets) + " decreases at [" + std::to_string(n) + "] (" +
                  std::to_string(offsets[n - 1]) + " then " + std::to_string(offsets[n]) +
                  "); offsets are cumulative lengths, non-decreasing");
    }
  }
  if (offsets.back() != total) {
    varlen_fail(name + " ends at " + std::to_string(offsets.back()) + " but " + rows_of + " has " +
                std::to_string(total) +
                " rows; the last offset is the total number of packed tokens");
  }
  if (max_seqlen < 0) {
    varlen_fail(std::string("max_seqlen_") + side + " = " + std::to_string(max_seqlen) +
                " is negative");
  }
  for (size_t n = 1; n < offsets.size(); ++n) {
    const int64_t length = offsets[n] - offsets[n - 1];
    if (length > max_seqlen) {
      varlen_fail("sequence " + std::to_string(n - 1) + " has L" + side + " = " +
                  std::to_string(length) + " (" + name + "[" + std::to_string(n) + "] − " + name +
                  "[" + std::to_string(n - 1) + "]) but max_seqlen_" + side + " = " +
                  std::to_string(max_seqlen) + "; max_seqlen bounds every sequence");
    }
  }
}

}  // namespace

void check_offsets(const Varlen& varlen, int64_t total_q, int64_t total_k) {
  check_one(varlen.cu_seqlens_q, "q", total_q, varlen.max_seqlen_q, "q");
  check_one(varlen.cu_seqlens_k, "k", total_k, varlen.max_seqlen_k, "k");
  if (varlen.cu_seqlens_q.size() != varlen.cu_seqlens_k.size()) {
    varlen_fail("cu_seqlens_q has " + std::to_string(varlen.cu_seqlens_q.size()) +
                " offsets (B = " + std::to_string(varlen.cu_seqlens_q.size() - 1) +
                ") but cu_seqlens_k has " + std::to_string(varlen.cu_seqlens_k.size()) +
                " (B = " + std::to_string(varlen.cu_seqlens_k.size() - 1) +
                "); sequence i owns queries and keys of both");
  }
}

void check_packed(const TensorView& t, const char* name, const char* layout) {
  if (t.is_null()) varlen_fail(std::string(name) + " is a null view; expected " + layout);
  if (t.rank() != 3) {
    varlen_fail(std::string(name) + " has shape " + t.shape_string() + "; a varlen call expects " +
                layout + " (sequences packed along the first axis)");
  }
}

void check_padding_value(const component::Padding& padding, int64_t i, int64_t length) {
  const int64_t value = padding.values.data()[i];
  if (value <= length) return;
  const bool query = padding.side == Side::query;
  const char* form = padding.form == component::Padding::Form::lengths ? "lengths" : "starts";
  varlen_fail(std::string(query ? "query_" : "key_") + form + "[" + std::to_string(i) +
              "] = " + std::to_string(value) + " exceeds sequence " + std::to_string(i) +
              "'s own " + (query ? "Lq" : "Lk") + " = " + std::to_string(length) + " (cu_seqlens_" +
              (query ? "q" : "k") +
              "); in a varlen call lengths and starts count the sequence's own tokens");
}

namespace {

// A draft tree is each sequence's own last T keys, so every sequence needs T of them.
void check_tree_fits(const component::Tree& tree, const std::string& label, const Varlen& varlen,
                     int64_t i) {
  const int64_t keys = key_length(varlen, i);
  if (tree.size() <= keys) return;
  varlen_fail(label + ": the draft of T=" + std::to_string(tree.size()) +
              " tokens is longer than sequence " + std::to_string(i) +
              "'s own Lk = " + std::to_string(keys) +
              " (cu_seqlens_k); in a varlen call each sequence's draft is its own last T keys");
}

}  // namespace

void check_sequence_values(const Mask& mask, const Varlen& varlen, int64_t only) {
  using Form = component::Padding::Form;
  const int64_t first = std::max<int64_t>(only, 0), end = only < 0 ? varlen.batch() : only + 1;
  for (size_t n = 0; n < mask.components().size(); ++n) {
    const Component& c = mask.components()[n];
    if (const auto* tree = std::get_if<component::Tree>(&c)) {
      for (int64_t i = first; i < end; ++i) check_tree_fits(*tree, mask.labels()[n], varlen, i);
    }
    const auto* padding = std::get_if<component::Padding>(&c);
    if (padding == nullptr || (padding->form != Form::lengths && padding->form != Form::starts) ||
        padding->values.numel() != varlen.batch()) {
      continue;
    }
    const auto& cu = padding->side == Side::query ? varlen.cu_seqlens_q : varlen.cu_seqlens_k;
    for (int64_t i = first; i < end; ++i) check_padding_value(*padding, i, cu[i + 1] - cu[i]);
  }
}

// The checks every varlen call makes on q, k, v, the offsets and the options; returns the packed
// problem as one [1, Hq, total_q, D] call (its sizes and the library's checks of the tensors).
detail::Problem check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                             const Varlen& varlen, const Options& options) {
  varlen_detail::check_options(options);
  varlen_detail::check_packed(q, "q", "[total_q, Hq, D]");
  varlen_detail::check_packed(k, "k", "[total_k, Hkv, D]");
  varlen_detail::check_packed(v, "v", "[total_k, Hkv, Dv]");
  varlen_detail::check_offsets(varlen, q.size(0), k.size(0));
  const TensorView whole_v = whole_rows(v);
  return detail::make_problem(whole_rows(q), whole_rows(k), &whole_v, options);
}

// A packed output of exactly `expected` ([total, H, D] or lse's [Hq, total_q]) (E139); then the
// library's dtype and overlap checks on it viewed whole.
void check_packed_shape(const TensorView& t, const Dims& expected, const char* name,
                        const std::string& from) {
  if (t.sizes() != expected) {
    varlen_fail(std::string(name) + " has shape " + t.shape_string() + " but must be " +
                shape_string(expected) + " (from " + from + ")");
  }
}

// The mask, the modifiers and the dropout resolved against the padded batch: every component's
// shape is checked as a call of that shape checks it, and the lengths and starts against each
// sequence (E138).
void check_mask(const detail::Problem& p, const Varlen& varlen, const Mask& mask,
                const ScoreMods& mods, const Options& options) {
  const MaskShape padded{varlen.batch(), p.q_heads, varlen.max_seqlen_q, varlen.max_seqlen_k};
  const detail::ResolvedMask resolved_mask(mask, padded);
  const detail::ResolvedMods resolved_mods(mods, padded, Frame{}, options.count_sinks);
  (void)detail::resolve_dropout(options.dropout, padded);
  varlen_detail::check_sequence_values(mask, varlen);
}

void check_outputs_disjoint(const NamedViews& outputs, const NamedViews& inputs) {
  for (size_t n = 0; n < outputs.size(); ++n) {
    if (outputs[n].first->is_null()) continue;
    detail::require_no_self_overlap(*outputs[n].first, outputs[n].second);
    for (const auto& [input, name] : inputs) {
      detail::require_disjoint(*outputs[n].first, outputs[n].second, *input, name);
    }
    for (size_t m = 0; m < n; ++m) {
      if (outputs[m].first->is_null()) continue;
      detail::require_disjoint(*outputs[n].first, outputs[n].second, *outputs[m].first,
                               outputs[m].second);
    }
  }
}

void check_options(const Options& options) {
  if (!options.frame.is_whole()) {
    varlen_fail(
        "options.frame is set, but a varlen call is a whole problem: each sequence is attended "
        "alone (frames slice one problem's rows; split a packed batch by its cu_seqlens instead)");
  }
}

TensorView sequence_rows(const TensorView& t, int64_t first, int64_t count) {
  const char* base = static_cast<const char*>(t.data());
  if (base != nullptr) base += first * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype()));
  return TensorView(base, t.dtype(), {1, t.size(1), count, t.size(2)},
                    {0, t.stride(1), t.stride(0), t.stride(2)});
}

MutableTensorView sequence_rows(const MutableTensorView& t, int64_t first, int64_t count) {
  const TensorView view = sequence_rows(static_cast<const TensorView&>(t), first, count);
  return MutableTensorView(const_cast<void*>(view.data()), view.dtype(), view.sizes(),
                           view.strides());
}

MutableTensorView sequence_lse(const TensorView& lse, int64_t first, int64_t count) {
  if (lse.is_null()) return {};
  auto* base = static_cast<float*>(const_cast<void*>(lse.data()));
  if (base != nullptr) base += first * lse.stride(1);
  return MutableTensorView(base, {1, lse.size(0), count}, {0, lse.stride(0), lse.stride(1)});
}

TensorView whole_rows(const TensorView& t) {
  return sequence_rows(t, 0, t.size(0));
}

}  // namespace varlen_detail
}  // namespace maskattn
