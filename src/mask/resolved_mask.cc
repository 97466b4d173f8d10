#include "mask/resolved_mask.h"

#include <cmath>
#include <string>

#include "mask/tree.h"
#include "maskattn/error.h"

namespace maskattn::detail {

namespace {

using Form = component::Padding::Form;

const char* side_name(Side side) {
  return side == Side::key ? "key" : "query";
}

void check_heads(const HeadSet& heads, const MaskShape& shape, const std::string& label) {
  if (heads.max_head() >= shape.q_heads) {
    throw Error(label + " applies to head " + std::to_string(heads.max_head()) +
                " but the query has Hq=" + std::to_string(shape.q_heads) + " heads");
  }
}

void check_padding(const component::Padding& padding, const MaskShape& shape,
                   const std::string& label) {
  const int64_t length = padding.side == Side::key ? shape.k_len : shape.q_len;
  const char* length_name = padding.side == Side::key ? "Lk" : "Lq";
  if (padding.form == Form::lengths || padding.form == Form::starts) {
    if (padding.values.dim(0) != shape.batch) {
      throw Error(label + " has " + std::to_string(padding.values.dim(0)) +
                  " entries but the batch has B=" + std::to_string(shape.batch));
    }
    for (int64_t b = 0; b < shape.batch; ++b) {
      if (padding.values.values()[b] > length) {
        throw Error(label + ": value " + std::to_string(padding.values.values()[b]) + " at [" +
                    std::to_string(b) + "] exceeds " + length_name + "=" + std::to_string(length));
      }
    }
  } else {
    const Dims expected = {shape.batch, length};
    if (padding.values.shape() != expected) {
      throw Error(label + " has shape " + shape_string(padding.values.shape()) + "; expected [B," +
                  length_name + "] = " + shape_string(expected));
    }
  }
}

void check_id_pair(const Array<int64_t>& query_ids, const Array<int64_t>& key_ids, bool shared,
                   const MaskShape& shape, const std::string& label) {
  if (shared && shape.q_len != shape.k_len) {
    throw Error(label + ": one id array for queries and keys needs Lq == Lk (got Lq=" +
                std::to_string(shape.q_len) + ", Lk=" + std::to_string(shape.k_len) +
                "); give query and key ids separately");
  }
  const Dims q_expected = {shape.batch, shape.q_len};
  const Dims k_expected = {shape.batch, shape.k_len};
  if (query_ids.shape() != q_expected) {
    throw Error(label + (shared ? " ids have shape " : " query ids have shape ") +
                shape_string(query_ids.shape()) +
                "; expected [B,Lq] = " + shape_string(q_expected));
  }
  if (key_ids.shape() != k_expected) {
    throw Error(label + " key ids have shape " + shape_string(key_ids.shape()) +
                "; expected [B,Lk] = " + shape_string(k_expected));
  }
}

void check_global_ids(const component::GlobalTokens& global, const MaskShape& shape,
                      const std::string& label) {
  if (global.shared && shape.q_len != shape.k_len) {
    throw Error(label + ": one id array for queries and keys needs Lq == Lk (got Lq=" +
                std::to_string(shape.q_len) + ", Lk=" + std::to_string(shape.k_len) +
                "); give query and key ids separately");
  }
  const auto check = [&](const Array<int64_t>& ids, int64_t length, const char* side,
                         const char* layout) {
    if ((ids.dim(0) != shape.batch && ids.dim(0) != 1) || ids.dim(1) != length) {
      throw Error(label + side + "ids have shape " + shape_string(ids.shape()) + "; expected " +
                  layout + " = " + shape_string({shape.batch, length}) + " (or [" +
                  std::to_string(length) + "] for every sequence)");
    }
  };
  check(global.query_ids, shape.q_len, global.shared ? " " : " query ",
        global.shared ? "[B,L]" : "[B,Lq]");
  if (!global.shared) check(global.key_ids, shape.k_len, " key ", "[B,Lk]");
}

// The layout's block counts must be exactly those of the lengths (or 1, broadcast): a layout built
// for another length would silently mean other pairs.
BroadcastStrides check_layout(const component::BlockSparse& sparse, const MaskShape& shape,
                              const std::string& label) {
  const Dims& dims = sparse.layout.shape();
  const int rank = static_cast<int>(dims.size());
  const auto check = [&](int64_t blocks, int64_t block, int64_t length, const char* side,
                         const char* length_name) {
    const int64_t needed = (length + block - 1) / block;
    if (blocks != needed && blocks != 1) {
      throw Error(label + ": layout " + shape_string(dims) + " has " + std::to_string(blocks) +
                  " " + side + " blocks of " + std::to_string(block) + ", but " + length_name +
                  "=" + std::to_string(length) + " needs ⌈" + std::to_string(length) + "/" +
                  std::to_string(block) + "⌉ = " + std::to_string(needed));
    }
  };
  check(dims[rank - 2], sparse.block_q, shape.q_len, "query", "Lq");
  check(dims[rank - 1], sparse.block_k, shape.k_len, "key", "Lk");
  const MaskShape grid = {shape.batch, shape.q_heads,
                          (shape.q_len + sparse.block_q - 1) / sparse.block_q,
                          (shape.k_len + sparse.block_k - 1) / sparse.block_k};
  try {
    return broadcast_to_scores(dims, grid, label + " layout");
  } catch (const Error&) {
    throw Error(label + ": layout shape " + shape_string(dims) +
                " does not broadcast to [B,Hq,nQ,nK] = " +
                shape_string({grid.batch, grid.q_heads, grid.q_len, grid.k_len}));
  }
}

// Program::check over the whole problem; a label other than the program's own (the CLI's
// "--mask SPEC") leads the message, so the user sees which argument it came from.
void check_program(const Program& program, const MaskShape& shape, const std::string& label) {
  try {
    program.check({shape.batch, shape.q_heads, shape.q_len, shape.k_len});
  } catch (const Error& error) {
    if (label.rfind("program `", 0) == 0) throw;
    throw Error(label + ": " + error.what());
  }
}

// A tree's parents are one row for every sequence or one per sequence, and its draft is the last
// T keys, so it needs T of them.
void check_tree(const component::Tree& tree, const MaskShape& shape, const std::string& label) {
  const int64_t rows = tree.parents.dim(0);
  if (rows != 1 && rows != shape.batch) {
    throw Error(label + ": parents have " + std::to_string(rows) +
                " rows (one tree per sequence) but the batch has B=" + std::to_string(shape.batch) +
                "; give [T] (every sequence) or [B,T]");
  }
  if (tree.size() > shape.k_len) {
    throw Error(label + ": the draft of T=" + std::to_string(tree.size()) +
                " tokens is longer than the keys, Lk=" + std::to_string(shape.k_len) +
                " (the draft is the last T keys, after the cached prefix)");
  }
}

}  // namespace

// The whole problem's shape: the call's, with the frame's totals. A frame must contain the call.
MaskShape framed_shape(const MaskShape& call, const Frame& frame) {
  if (call.batch < 0 || call.q_heads < 0 || call.q_len < 0 || call.k_len < 0) {
    throw Error("mask shape " + scores_shape_string(call) + " has a negative size");
  }
  const auto whole = [](int64_t offset, int64_t total, int64_t length, const char* offset_name,
                        const char* total_name, const char* length_name) {
    if (total == -1) {
      if (offset != 0) {
        throw Error(std::string("frame: ") + offset_name + "=" + std::to_string(offset) +
                    " needs " + total_name + " (the whole problem's length); " + total_name +
                    "=-1 means the call is the whole problem");
      }
      return length;
    }
    if (total < 0 || offset < 0 || offset > total - length) {
      throw Error(std::string("frame: rows [") + offset_name + ", " + offset_name + " + " +
                  length_name + ") = [" + std::to_string(offset) + ", " +
                  std::to_string(offset + length) + ") are not inside [0, " + total_name +
                  ") = [0, " + std::to_string(total) + ")");
    }
    return total;
  };
  return {call.batch, call.q_heads,
          whole(frame.q_offset, frame.q_total, call.q_len, "q_offset", "q_total", "Lq"),
          whole(frame.k_offset, frame.k_total, call.k_len, "k_offset", "k_total", "Lk")};
}

ResolvedMask::ResolvedMask(const Mask& mask, const MaskShape& call_shape, const Frame& frame)
    : shape_(call_shape), global_(framed_shape(call_shape, frame)), mask_(&mask) {
  q_origin_ = frame.q_offset;
  k_origin_ = frame.k_offset;
  // Components are checked, and positions computed, for the whole problem.
  const MaskShape& shape = global_;
  const component::Padding* lengths[2] = {nullptr, nullptr};  // [query, key]
  const component::Padding* starts[2] = {nullptr, nullptr};
  const auto& components = mask.components();
  for (size_t n = 0; n < components.size(); ++n) {
    const std::string& label = mask.labels()[n];
    const Component& part = components[n];
    if (const auto* window = std::get_if<component::Window>(&part)) {
      check_heads(window->heads, shape, label);
      windows_.push_back(window);
    } else if (const auto* chunk = std::get_if<component::Chunk>(&part)) {
      check_heads(chunk->heads, shape, label);
      chunks_.push_back(chunk);
    } else if (const auto* padding = std::get_if<component::Padding>(&part)) {
      check_padding(*padding, shape, label);
      const int side = padding->side == Side::key ? 1 : 0;
      const component::Padding** slot = padding->form == Form::lengths  ? &lengths[side]
                                        : padding->form == Form::starts ? &starts[side]
                                                                        : nullptr;
      if (slot != nullptr) {
        if (*slot != nullptr) {
          throw Error(label + ": " + side_name(padding->side) +
                      (padding->form == Form::lengths ? " lengths" : " starts") +
                      " given twice; they define positions, so give them once");
        }
        *slot = padding;
      }
      (padding->side == Side::key ? key_padding_ : query_padding_).push_back(padding);
    } else if (const auto* segments = std::get_if<component::Segments>(&part)) {
      check_id_pair(segments->query_ids, segments->key_ids, segments->shared, shape, label);
      check_heads(segments->heads, shape, label);
      segments_.push_back(segments);
    } else if (const auto* spans = std::get_if<component::Spans>(&part)) {
      check_id_pair(spans->query_ids, spans->key_ids, spans->shared, shape, label);
      check_heads(spans->heads, shape, label);
      spans_.push_back(spans);
    } else if (const auto* prefix = std::get_if<component::Prefix>(&part)) {
      check_heads(prefix->heads, shape, label);
      prefixes_.push_back(prefix);
    } else if (const auto* global = std::get_if<component::GlobalTokens>(&part)) {
      check_global_ids(*global, shape, label);
      check_heads(global->heads, shape, label);
      globals_.push_back(global);
    } else if (const auto* sparse = std::get_if<component::BlockSparse>(&part)) {
      layouts_.push_back({sparse, check_layout(*sparse, shape, label), n});
    } else if (const auto* dense = std::get_if<component::DenseBool>(&part)) {
      dense_bool_.push_back({dense->values.data(),
                             dense->polarity == component::DenseBool::Polarity::blocked,
                             broadcast_to_scores(dense->values.shape(), shape, label), n});
    } else if (const auto* additive = std::get_if<component::DenseAdditive>(&part)) {
      additive_.push_back({additive->values.data(), false,
                           broadcast_to_scores(additive->values.shape(), shape, label), n});
    } else if (const auto* predicate = std::get_if<component::Predicate>(&part)) {
      predicates_.push_back({predicate, n});
    } else if (const auto* program = std::get_if<component::ProgramMask>(&part)) {
      // Proven free of out-of-range reads over the whole problem before any evaluation, so the
      // kernels' tile evaluations cannot fail half-way through a call.
      check_program(program->program, shape, label);
      programs_.push_back({&program->program, n});
    } else if (const auto* tree = std::get_if<component::Tree>(&part)) {
      check_tree(*tree, shape, label);
      check_heads(tree->heads, shape, label);
      trees_.push_back(tree);
    }
  }

  resolve_positions(lengths, starts);
}

// Positions. Key starts (left padding) shift both sides so positions count from the first real
// token; the query's place among the keys depends on the alignment.
void ResolvedMask::resolve_positions(const component::Padding* const lengths[2],
                                     const component::Padding* const starts[2]) {
  const MaskShape& shape = global_;
  q_shift_.assign(shape.batch, 0);
  k_shift_.assign(shape.batch, 0);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t key_start = starts[1] ? starts[1]->values.values()[b] : 0;
    k_shift_[b] = -key_start;
    if (mask_->alignment() == Alignment::bottom_right) {
      // The last (real) query sits at the last (real) key.
      const bool ragged = lengths[0] != nullptr && lengths[1] != nullptr;
      const int64_t key_end = ragged ? lengths[1]->values.values()[b] : shape.k_len;
      const int64_t query_end = ragged ? lengths[0]->values.values()[b] : shape.q_len;
      q_shift_[b] = key_end - query_end - key_start;
    } else {
      // Self-attention (Lq == Lk): the queries are the keys' tokens, so they share the key
      // starts. Otherwise unpadded queries start at position 0.
      const int64_t default_start = shape.q_len == shape.k_len ? key_start : 0;
      const int64_t query_start = starts[0] ? starts[0]->values.values()[b] : default_start;
      q_shift_[b] = -query_start;
    }
  }
}

bool ResolvedMask::is_real(const component::Padding& padding, int64_t b, int64_t t) const {
  switch (padding.form) {
    case Form::lengths:
      return t < padding.values.values()[b];
    case Form::starts:
      return t >= padding.values.values()[b];
    case Form::keep:
      return padding.values.at(b, t) != 0;
    case Form::token_ids:
      return padding.values.at(b, t) != padding.pad_id;
  }
  return false;
}

bool ResolvedMask::has_relaxation(int64_t h) const {
  for (const component::Spans* spans : spans_) {
    if (spans->heads.contains(h)) return true;
  }
  for (const component::Prefix* prefix : prefixes_) {
    if (prefix->heads.contains(h)) return true;
  }
  for (const component::GlobalTokens* global : globals_) {
    if (global->heads.contains(h)) return true;
  }
  return false;
}

bool ResolvedMask::relaxed(int64_t b, int64_t h, int64_t i, int64_t j) const {
  for (const component::GlobalTokens* global : globals_) {
    if (!global->heads.contains(h)) continue;
    if (is_global(global->query_ids, b, i) || is_global(global->key_ids, b, j)) return true;
  }
  for (const component::Spans* spans : spans_) {
    if (!spans->heads.contains(h)) continue;
    const int64_t span = spans->query_ids.at(b, i);
    if (span != 0 && span == spans->key_ids.at(b, j)) return true;
  }
  const int64_t query_position = global_qpos(b, i);
  const int64_t key_position = global_kpos(b, j);
  for (const component::Prefix* prefix : prefixes_) {
    if (!prefix->heads.contains(h)) continue;
    if (query_position >= 0 && query_position < prefix->length && key_position >= 0 &&
        key_position < prefix->length) {
      return true;
    }
  }
  return false;
}

// Causal and window components bound the query–key distance; spans, prefix-LM and global tokens
// relax exactly these.
bool ResolvedMask::order_allows(int64_t b, int64_t h, int64_t i, int64_t j) const {
  const int64_t distance =
      global_qpos(b, i) - global_kpos(b, j);  // > 0: the key is in the query's past
  for (const component::Window* window : windows_) {
    if (!window->heads.contains(h)) continue;
    const bool inside = distance <= window->left && -distance <= window->right;
    if (!inside) return relaxed(b, h, i, j);
  }
  return true;
}

bool ResolvedMask::allowed_global(int64_t b, int64_t h, int64_t i, int64_t j) const {
  for (const component::Padding* padding : query_padding_) {
    if (!is_real(*padding, b, i)) return false;
  }
  for (const component::Padding* padding : key_padding_) {
    if (!is_real(*padding, b, j)) return false;
  }
  if (!order_allows(b, h, i, j)) return false;
  for (const component::Chunk* chunk : chunks_) {
    if (chunk->heads.contains(h) &&
        floor_div(global_qpos(b, i), chunk->size) != floor_div(global_kpos(b, j), chunk->size)) {
      return false;
    }
  }
  return trees_allow(b, h, i, j) && layouts_allow(b, h, i, j) && elementwise_global(b, h, i, j);
}

bool ResolvedMask::trees_allow(int64_t b, int64_t h, int64_t i, int64_t j) const {
  for (const component::Tree* tree : trees_) {
    if (!tree->heads.contains(h)) continue;
    if (!tree_allows(*tree, TreePlacement(*tree, global_.q_len, global_.k_len), b, i, j)) {
      return false;
    }
  }
  return true;
}

bool ResolvedMask::layouts_allow(int64_t b, int64_t h, int64_t i, int64_t j) const {
  for (const LayoutRef& layout : layouts_) {
    if (!layout.allows_block(b, h, i / layout.sparse->block_q, j / layout.sparse->block_k)) {
      return false;
    }
  }
  return true;
}

bool ResolvedMask::elementwise_global(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (!data_elementwise_global(b, h, i, j)) return false;
  for (const ProgramRef& ref : programs_) {
    if (!ref.program->allows(b, h, i, j)) return false;
  }
  return true;
}

bool ResolvedMask::data_elementwise_global(int64_t b, int64_t h, int64_t i, int64_t j) const {
  for (const component::Segments* segments : segments_) {
    if (segments->heads.contains(h) && segments->query_ids.at(b, i) != segments->key_ids.at(b, j)) {
      return false;
    }
  }
  for (const DenseRef& dense : dense_bool_) {
    const uint8_t value = static_cast<const uint8_t*>(dense.values)[dense.index.offset(b, h, i, j)];
    if ((value != 0) == dense.blocked) return false;
  }
  for (const DenseRef& dense : additive_) {
    const float value = static_cast<const float*>(dense.values)[dense.index.offset(b, h, i, j)];
    if (value == -INFINITY) return false;
  }
  for (const PredicateRef& ref : predicates_) {
    if (!ref.predicate->allows(b, h, i, j)) return false;
  }
  return true;
}

double ResolvedMask::additive(int64_t b, int64_t h, int64_t i, int64_t j) const {
  i += q_origin_;
  j += k_origin_;
  double sum = 0.0;
  for (const DenseRef& dense : additive_) {
    sum += static_cast<const float*>(dense.values)[dense.index.offset(b, h, i, j)];
  }
  return sum;
}

}  // namespace maskattn::detail
