// What the mask and the score modifiers mean for one batch entry attended alone: a sequence of
// a varlen call (varlen/varlen.cc).
//
// A varlen call packs B sequences with no padding, but its mask is written for the padded batch
// [B, Hq, max_seqlen_q, max_seqlen_k] the same sequences would form, because that is how every
// mask input of the library is shaped (lengths [B], keep vectors and segment ids [B, L], dense
// masks broadcasting to [B, Hq, Lq, Lk], programs over b, h, q, kv). Sequence i is batch entry i,
// and its own rows are the first Lq_i queries and the first Lk_i keys of that entry. So the mask
// of sequence i alone is the padded batch's mask *restricted* to entry i and cut to Lq_i × Lk_i,
// and this file builds it, one component at a time, with the public builders (so every check a
// mask gets at a call still applies to the restricted one):
//
//   - structured components without data (causal, window, chunk, prefix-LM) are copied: their
//     positions come from the call, i.e. from the sequence's own Lq_i and Lk_i (bottom-right
//     aligns its last query with its last key, as FlashAttention's varlen causal does);
//   - per-sequence values (lengths, starts) become the one value of entry i; the caller checks
//     first that it fits the sequence (varlen: E138) — a value beyond the sequence's own length
//     is an error rather than clamped, because with both query and key lengths the values also
//     move positions (docs/semantics.md §2) and clamping would move them;
//   - per-token arrays [B, L] become row i cut to the sequence's length (global-token rows [1, L]
//     are shared by every sequence, so they are only cut);
//   - dense arrays (keep, blocked, additive, the bias) and block-sparse layouts, which broadcast
//     against [B, Hq, Lq, Lk] (a layout against its block grid), take entry i on their batch axis
//     when they have one of size > 1, and cut their query and key axes unless those broadcast;
//   - a draft tree's parents [B, T] become row i ([1, T], every sequence's tree, is kept): the
//     draft is then the sequence's own last T keys and queries (docs/semantics.md §3), as causal
//     is aligned at its own end; the caller checks first that each sequence holds T keys (varlen:
//     E138);
//   - what sees the batch index (predicates, score_fn, programs) sees b = i: callables are
//     wrapped, programs that read b are recompiled with b replaced by (b + i).
#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "mask/restrict.h"

namespace maskattn::detail {

namespace {

// One axis of a cut: the source rows [first, first + count) of that axis are kept.
struct AxisCut {
  int64_t first = 0;
  int64_t count = 0;
};

// visit(n, offset) for each element n (row-major) of the sub-array of an array of `shape` given
// by one cut per axis; `offset` is the element's row-major offset in the whole array.
template <typename Visit>
void for_each_in_cut(const Dims& shape, const std::vector<AxisCut>& cuts, Visit&& visit) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> stride(rank, 1);
  int64_t total = 1;
  for (int axis = rank - 1; axis >= 0; --axis) {
    if (axis + 1 < rank) stride[axis] = stride[axis + 1] * shape[axis + 1];
    total *= cuts[axis].count;
  }
  std::array<int64_t, 4> index{};
  for (int64_t n = 0; n < total; ++n) {
    int64_t offset = 0;
    for (int axis = 0; axis < rank; ++axis)
      offset += (cuts[axis].first + index[axis]) * stride[axis];
    visit(n, offset);
    for (int axis = rank - 1; axis >= 0; --axis) {  // the next index, last axis fastest
      if (++index[axis] < cuts[axis].count) break;
      index[axis] = 0;
    }
  }
}

// The sub-array of `a` given by one cut per axis, copied row-major.
template <typename T>
Array<T> cut(const Array<T>& a, const std::vector<AxisCut>& cuts) {
  Dims shape;
  for (const AxisCut& axis : cuts) shape.push_back(axis.count);
  std::vector<T> values;
  for_each_in_cut(a.shape(), cuts,
                  [&](int64_t, int64_t offset) { values.push_back(a.data()[offset]); });
  return Array<T>(std::move(shape), std::move(values));
}

// The cut of an array of `shape` that broadcasts, aligned at its trailing axis, against
// [B, H, rows, columns]: entry i of a batch axis of size > 1, rows and columns cut to `rows` and
// `columns` unless they broadcast (size 1), heads kept.
std::vector<AxisCut> broadcast_cuts(const Dims& shape, int64_t i, int64_t rows, int64_t columns) {
  const int rank = static_cast<int>(shape.size());
  std::vector<AxisCut> cuts(rank);
  for (int axis = 0; axis < rank; ++axis) {
    const int target = 4 - rank + axis;  // 0 batch, 1 heads, 2 rows, 3 columns
    const int64_t size = shape[axis];
    cuts[axis] = {0, size};
    if (size == 1 || target == 1) continue;
    if (target == 0) cuts[axis] = {i, 1};
    if (target == 2) cuts[axis] = {0, rows};
    if (target == 3) cuts[axis] = {0, columns};
  }
  return cuts;
}

template <typename T>
Array<T> cut_broadcast(const Array<T>& a, int64_t i, int64_t rows, int64_t columns) {
  return cut(a, broadcast_cuts(a.shape(), i, rows, columns));
}

// Row i (or the shared row 0 of a [1, L] array) of a per-token [B, L] array, cut to `length`.
Array<int64_t> cut_row(const Array<int64_t>& a, int64_t i, int64_t length) {
  return cut(a, {{a.dim(0) == 1 ? 0 : i, 1}, {0, length}});
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A program with b replaced by (b + i): in a call on sequence i alone, b is 0.
Program shift_batch(const Program& program, int64_t i) {
  if (i == 0 || !program.depends_on_batch()) return program;
  const std::string text = program.text();
  std::string shifted;
  for (size_t n = 0; n < text.size();) {
    const auto is_word = [&](size_t at) {
      return at < text.size() && (std::isalnum(static_cast<unsigned char>(text[at])) != 0 ||
                                  text[at] == '_' || text[at] == '.');
    };
    if (text[n] == 'b' && (n == 0 || !is_word(n - 1)) && !is_word(n + 1)) {
      shifted += "(b + " + std::to_string(i) + ")";
      n += 1;
      continue;
    }
    const size_t start = n;  // copy a whole word (identifiers, numbers) or one other character
    while (is_word(n)) ++n;
    if (n == start) ++n;
    shifted.append(text, start, n - start);
  }
  return program.kind() == ProgramKind::mask ? Program::mask(shifted, program.tables())
                                             : Program::score(shifted, program.tables());
}

// Lengths and starts: entry i (the caller has checked that it fits the sequence).
int64_t sequence_value(const component::Padding& padding, int64_t i) {
  return padding.values.data()[i];
}

void add_padding(Mask& out, const component::Padding& padding, int64_t i, int64_t lq, int64_t lk) {
  using Form = component::Padding::Form;
  const bool query = padding.side == Side::query;
  const int64_t length = query ? lq : lk;
  switch (padding.form) {
    case Form::lengths: {
      const int64_t value = sequence_value(padding, i);
      query ? out.query_lengths({value}) : out.key_lengths({value});
      break;
    }
    case Form::starts: {
      const int64_t value = sequence_value(padding, i);
      query ? out.query_starts({value}) : out.key_starts({value});
      break;
    }
    case Form::keep:
      query ? out.query_keep(cut_row(padding.values, i, length))
            : out.key_keep(cut_row(padding.values, i, length));
      break;
    case Form::token_ids:
      query ? out.query_pad_id(cut_row(padding.values, i, length), padding.pad_id)
            : out.key_pad_id(cut_row(padding.values, i, length), padding.pad_id);
      break;
  }
}

// Appends component `c` of the padded batch's mask, restricted to sequence i (lq × lk).
void add_restricted(Mask& out, const Component& c, int64_t i, int64_t lq, int64_t lk) {
  namespace mc = component;
  if (const auto* w = std::get_if<mc::Window>(&c)) {
    out.window(w->left, w->right, w->heads);
  } else if (const auto* chunk = std::get_if<mc::Chunk>(&c)) {
    out.chunk(chunk->size, chunk->heads);
  } else if (const auto* padding = std::get_if<mc::Padding>(&c)) {
    add_padding(out, *padding, i, lq, lk);
  } else if (const auto* seg = std::get_if<mc::Segments>(&c)) {
    out.segments(cut_row(seg->query_ids, i, lq), cut_row(seg->key_ids, i, lk), seg->heads);
  } else if (const auto* spans = std::get_if<mc::Spans>(&c)) {
    out.spans(cut_row(spans->query_ids, i, lq), cut_row(spans->key_ids, i, lk), spans->heads);
  } else if (const auto* prefix = std::get_if<mc::Prefix>(&c)) {
    out.prefix_lm(prefix->length, prefix->heads);
  } else if (const auto* global = std::get_if<mc::GlobalTokens>(&c)) {
    out.global_tokens(cut_row(global->query_ids, i, lq), cut_row(global->key_ids, i, lk),
                      global->heads);
  } else if (const auto* sparse = std::get_if<mc::BlockSparse>(&c)) {
    out.block_sparse(cut_broadcast(sparse->layout, i, ceil_div(lq, sparse->block_q),
                                   ceil_div(lk, sparse->block_k)),
                     sparse->block_q, sparse->block_k);
  } else if (const auto* dense = std::get_if<mc::DenseBool>(&c)) {
    Array<uint8_t> values = cut_broadcast(dense->values, i, lq, lk);
    dense->polarity == mc::DenseBool::Polarity::keep ? out.keep(std::move(values))
                                                     : out.blocked(std::move(values));
  } else if (const auto* additive = std::get_if<mc::DenseAdditive>(&c)) {
    out.additive(cut_broadcast(additive->values, i, lq, lk));
  } else if (const auto* predicate = std::get_if<mc::Predicate>(&c)) {
    out.predicate([allows = predicate->allows, i](int64_t b, int64_t h, int64_t q,
                                                  int64_t kv) { return allows(b + i, h, q, kv); },
                  predicate->name);
  } else if (const auto* program = std::get_if<mc::ProgramMask>(&c)) {
    out.program(shift_batch(program->program, i));
  } else if (const auto* tree = std::get_if<mc::Tree>(&c)) {
    out.tree(cut_row(tree->parents, i, tree->size()), tree->heads);
  }
}

}  // namespace

Mask restrict_mask(const Mask& mask, int64_t i, int64_t lq, int64_t lk) {
  Mask out;
  if (mask.alignment_is_set()) out.set_alignment(mask.alignment());
  for (size_t n = 0; n < mask.components().size(); ++n) {
    add_restricted(out, mask.components()[n], i, lq, lk);
    out.label_last(mask.labels()[n]);
  }
  return out;
}

void add_restricted_bias(const Dims& bias_shape, int64_t i, int64_t lq, int64_t lk,
                         const float* part, double* whole) {
  for_each_in_cut(bias_shape, broadcast_cuts(bias_shape, i, lq, lk),
                  [&](int64_t n, int64_t offset) { whole[offset] += part[n]; });
}

ScoreMods restrict_mods(const ScoreMods& mods, int64_t i, int64_t lq, int64_t lk) {
  ScoreMods out = mods;
  if (mods.bias) out.bias = cut_broadcast(*mods.bias, i, lq, lk);
  if (mods.score_fn) {
    out.score_fn = [fn = mods.score_fn, i](double s, int64_t b, int64_t h, int64_t q, int64_t kv) {
      return fn(s, b + i, h, q, kv);
    };
  }
  if (mods.program) out.program = shift_batch(*mods.program, i);
  return out;
}

}  // namespace maskattn::detail
