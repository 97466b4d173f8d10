// The Mask builder: each method checks what it can without knowing the problem size and appends one
// component. Checks that need B, Hq, Lq or Lk happen in resolve_mask() at the attention call.
#include "maskattn/mask.h"

#include <algorithm>
#include <utility>

#include "mask/scan_cache.h"
#include "maskattn/error.h"

namespace maskattn {

HeadSet::HeadSet(std::initializer_list<int64_t> heads) : HeadSet(std::vector<int64_t>(heads)) {}

HeadSet::HeadSet(std::vector<int64_t> heads) : all_(false) {
  std::vector<int64_t> sorted = std::move(heads);
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty()) throw Error("head set is empty: a component must apply to some head");
  if (sorted.front() < 0) {
    throw Error("head set contains a negative head index (" + std::to_string(sorted.front()) + ")");
  }
  for (int64_t head : sorted) {
    if (!ranges_.empty() && head <= ranges_.back().second) {
      ranges_.back().second = std::max(ranges_.back().second, head + 1);
    } else {
      ranges_.emplace_back(head, head + 1);
    }
  }
}

HeadSet HeadSet::range(int64_t first, int64_t end) {
  if (first < 0 || end <= first) {
    throw Error("head range [" + std::to_string(first) + ", " + std::to_string(end) +
                ") is empty or negative");
  }
  HeadSet set;
  set.all_ = false;
  set.ranges_.emplace_back(first, end);
  return set;
}

bool HeadSet::contains(int64_t head) const {
  if (all_) return true;
  for (const auto& [first, end] : ranges_) {
    if (head < first) return false;
    if (head < end) return true;
  }
  return false;
}

int64_t HeadSet::max_head() const {
  return all_ ? -1 : ranges_.back().second - 1;
}

std::string HeadSet::to_string() const {
  if (all_) return "";
  std::string text = "@heads=";
  for (size_t n = 0; n < ranges_.size(); ++n) {
    const auto [first, end] = ranges_[n];
    if (n > 0) text += ',';
    text += std::to_string(first);
    if (end - first >= 2) {
      // Two heads are listed, longer runs are written as a range.
      text += end - first == 2 ? ',' : '-';
      text += std::to_string(end - 1);
    }
  }
  return text;
}

namespace {

std::string bound_string(int64_t bound) {
  return bound == kUnbounded ? "inf" : std::to_string(bound);
}

void require_rank(const Array<int64_t>& values, int rank, const std::string& what,
                  const char* layout) {
  if (values.rank() != rank) {
    throw Error(what + " has shape " + shape_string(values.shape()) + "; expected " + layout);
  }
}

template <typename T>
void require_binary(const Array<T>& values, const std::string& what) {
  for (int64_t n = 0; n < values.numel(); ++n) {
    const auto value = values.values()[n];
    if (value != 0 && value != 1) {
      throw Error(what + " must hold only 0 and 1, found " + std::to_string(value) +
                  " at flat index " + std::to_string(n));
    }
  }
}

template <typename T>
void require_dense(const Array<T>& values, const std::string& what) {
  if (values.empty()) throw Error(what + " is an empty array (no shape, no values)");
  if (values.rank() > 4) {
    throw Error(what + " shape " + shape_string(values.shape()) +
                " has rank > 4; it must broadcast to [B,Hq,Lq,Lk]");
  }
}

}  // namespace

Mask& Mask::add(Component component, std::string label) {
  scan_cache_ = new_scan_cache();  // classifications of the old component list
  components_.push_back(std::move(component));
  labels_.push_back(std::move(label));
  return *this;
}

Mask& Mask::label_last(std::string label) {
  if (!labels_.empty()) labels_.back() = std::move(label);
  return *this;
}

Mask& Mask::causal(HeadSet heads) {
  return add(component::Window{kUnbounded, 0, heads}, "causal");
}

Mask& Mask::causal(Alignment alignment, HeadSet heads) {
  set_alignment(alignment);
  return causal(std::move(heads));
}

Mask& Mask::window(int64_t left, int64_t right, HeadSet heads) {
  const std::string label = "window(" + bound_string(left) + "," + bound_string(right) + ")";
  if (left < 0 || right < 0) {
    throw Error(label + ": window sides must be ≥ 0 (use kUnbounded for an unbounded side; " +
                "negative values do not mean 'unbounded' here)");
  }
  return add(component::Window{left, right, std::move(heads)}, label);
}

Mask& Mask::sliding_window(int64_t keys, HeadSet heads) {
  if (keys < 1) {
    throw Error("sliding_window(" + std::to_string(keys) +
                "): the window must hold at least 1 key (it counts the query's own position); " +
                "for no window, add no window component");
  }
  window(keys - 1, 0, std::move(heads));
  return label_last("sliding_window(" + std::to_string(keys) + ")");
}

Mask& Mask::chunk(int64_t size, HeadSet heads) {
  if (size < 1) throw Error("chunk(" + std::to_string(size) + "): chunk size must be ≥ 1");
  return add(component::Chunk{size, std::move(heads)}, "chunk(" + std::to_string(size) + ")");
}

Mask& Mask::add_padding(Side side, component::Padding::Form form, Array<int64_t> values,
                        int64_t pad_id, const char* name) {
  using Form = component::Padding::Form;
  if (form == Form::lengths || form == Form::starts) {
    require_rank(values, 1, name, "[B]");
    for (int64_t n = 0; n < values.numel(); ++n) {
      if (values.values()[n] < 0) {
        throw Error(std::string(name) + "[" + std::to_string(n) +
                    "] = " + std::to_string(values.values()[n]) + " is negative");
      }
    }
  } else {
    require_rank(values, 2, name, side == Side::key ? "[B,Lk]" : "[B,Lq]");
    if (form == Form::keep) require_binary(values, name);
  }
  return add(component::Padding{side, form, std::move(values), pad_id}, name);
}

Mask& Mask::key_lengths(std::vector<int64_t> lengths) {
  const int64_t count = static_cast<int64_t>(lengths.size());
  return add_padding(Side::key, component::Padding::Form::lengths,
                     Array<int64_t>({count}, std::move(lengths)), 0, "key_lengths");
}
Mask& Mask::key_starts(std::vector<int64_t> starts) {
  const int64_t count = static_cast<int64_t>(starts.size());
  return add_padding(Side::key, component::Padding::Form::starts,
                     Array<int64_t>({count}, std::move(starts)), 0, "key_starts");
}
Mask& Mask::key_keep(Array<int64_t> keep) {
  return add_padding(Side::key, component::Padding::Form::keep, std::move(keep), 0, "key_keep");
}
Mask& Mask::key_pad_id(Array<int64_t> token_ids, int64_t pad_id) {
  return add_padding(Side::key, component::Padding::Form::token_ids, std::move(token_ids), pad_id,
                     "key_pad_id");
}
Mask& Mask::query_lengths(std::vector<int64_t> lengths) {
  const int64_t count = static_cast<int64_t>(lengths.size());
  return add_padding(Side::query, component::Padding::Form::lengths,
                     Array<int64_t>({count}, std::move(lengths)), 0, "query_lengths");
}
Mask& Mask::query_starts(std::vector<int64_t> starts) {
  const int64_t count = static_cast<int64_t>(starts.size());
  return add_padding(Side::query, component::Padding::Form::starts,
                     Array<int64_t>({count}, std::move(starts)), 0, "query_starts");
}
Mask& Mask::query_keep(Array<int64_t> keep) {
  return add_padding(Side::query, component::Padding::Form::keep, std::move(keep), 0, "query_keep");
}
Mask& Mask::query_pad_id(Array<int64_t> token_ids, int64_t pad_id) {
  return add_padding(Side::query, component::Padding::Form::token_ids, std::move(token_ids), pad_id,
                     "query_pad_id");
}

Mask& Mask::segments(Array<int64_t> ids, HeadSet heads) {
  require_rank(ids, 2, "segments", "[B,L]");
  Array<int64_t> copy = ids;
  return add(component::Segments{std::move(copy), std::move(ids), true, std::move(heads)},
             "segments");
}

Mask& Mask::segments(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads) {
  require_rank(query_ids, 2, "query segments", "[B,Lq]");
  require_rank(key_ids, 2, "key segments", "[B,Lk]");
  return add(component::Segments{std::move(query_ids), std::move(key_ids), false, std::move(heads)},
             "segments");
}

Mask& Mask::spans(Array<int64_t> ids, HeadSet heads) {
  require_rank(ids, 2, "spans", "[B,L]");
  Array<int64_t> copy = ids;
  return add(component::Spans{std::move(copy), std::move(ids), true, std::move(heads)}, "spans");
}

Mask& Mask::spans(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads) {
  require_rank(query_ids, 2, "query spans", "[B,Lq]");
  require_rank(key_ids, 2, "key spans", "[B,Lk]");
  return add(component::Spans{std::move(query_ids), std::move(key_ids), false, std::move(heads)},
             "spans");
}

Mask& Mask::prefix_lm(int64_t length, HeadSet heads) {
  if (length < 0) throw Error("prefix_lm(" + std::to_string(length) + "): length must be ≥ 0");
  return add(component::Prefix{length, std::move(heads)},
             "prefix_lm(" + std::to_string(length) + ")");
}

namespace {

// Global-token ids as [rows, L]: a rank-1 [L] array becomes [1, L] (the same tokens in every
// sequence).
Array<int64_t> global_id_rows(Array<int64_t> ids, const char* what, const char* layout) {
  if (ids.rank() == 1) return Array<int64_t>({1, ids.dim(0)}, ids.values());
  require_rank(ids, 2, what, layout);
  return ids;
}

}  // namespace

Mask& Mask::global_tokens(Array<int64_t> ids, HeadSet heads) {
  Array<int64_t> rows = global_id_rows(std::move(ids), "global_tokens", "[B,L] or [L]");
  Array<int64_t> copy = rows;
  return add(component::GlobalTokens{std::move(copy), std::move(rows), true, std::move(heads)},
             "global_tokens");
}

Mask& Mask::global_tokens(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads) {
  return add(
      component::GlobalTokens{
          global_id_rows(std::move(query_ids), "query global_tokens", "[B,Lq] or [Lq]"),
          global_id_rows(std::move(key_ids), "key global_tokens", "[B,Lk] or [Lk]"), false,
          std::move(heads)},
      "global_tokens");
}

Mask& Mask::block_sparse(Array<uint8_t> layout, int64_t block_q, int64_t block_k) {
  const std::string label =
      "block_sparse(" + std::to_string(block_q) + "," + std::to_string(block_k) + ")";
  if (block_q < 1 || block_k < 1) {
    throw Error(label + ": block sizes must be ≥ 1 (block_q = " + std::to_string(block_q) +
                ", block_k = " + std::to_string(block_k) + ")");
  }
  if (layout.empty() || layout.rank() < 2 || layout.rank() > 4) {
    throw Error(label + ": layout has shape " + shape_string(layout.shape()) +
                "; expected [nQ,nK], [H,nQ,nK] or [B,H,nQ,nK]");
  }
  require_binary(layout, label + " layout");
  return add(component::BlockSparse{std::move(layout), block_q, block_k}, label);
}

Mask& Mask::keep(Array<uint8_t> keep) {
  require_dense(keep, "keep mask");
  require_binary(keep, "keep mask");
  return add(component::DenseBool{component::DenseBool::Polarity::keep, std::move(keep)},
             "keep mask");
}

Mask& Mask::blocked(Array<uint8_t> blocked) {
  require_dense(blocked, "blocked mask");
  require_binary(blocked, "blocked mask");
  return add(component::DenseBool{component::DenseBool::Polarity::blocked, std::move(blocked)},
             "blocked mask");
}

Mask& Mask::additive(Array<float> values) {
  require_dense(values, "additive mask");
  return add(component::DenseAdditive{std::move(values)}, "additive mask");
}

Mask& Mask::predicate(component::PairPredicate allows, std::string name) {
  if (!allows) throw Error("predicate '" + name + "' is empty (no callable)");
  std::string label = name;
  return add(component::Predicate{std::move(allows), std::move(name)}, std::move(label));
}

Mask& Mask::program(Program program) {
  if (program.kind() != ProgramKind::mask) {
    throw Error("Mask::program: `" + program.text() +
                "` is a score program (a number); a mask needs a mask program (a bool): "
                "give it to ScoreMods::program instead");
  }
  std::string label = "program `" + program.text() + "`";
  return add(component::ProgramMask{std::move(program)}, std::move(label));
}

Mask& Mask::program(std::string_view text, std::vector<ProgramTable> tables) {
  return program(Program::mask(text, std::move(tables)));
}

Mask& Mask::set_alignment(Alignment alignment) {
  if (alignment_is_set_ && alignment_ != alignment) {
    throw Error("mask alignment set to both bottom-right and top-left; a mask has one alignment");
  }
  alignment_ = alignment;
  alignment_is_set_ = true;
  return *this;
}

Mask operator&(Mask a, const Mask& b) {
  if (b.alignment_is_set_) a.set_alignment(b.alignment_);
  for (size_t n = 0; n < b.components_.size(); ++n) a.add(b.components_[n], b.labels_[n]);
  return a;
}

std::string Mask::describe() const {
  if (components_.empty()) return "none";
  std::string text;
  for (size_t n = 0; n < components_.size(); ++n) {
    if (n > 0) text += " & ";
    text += labels_[n];
    std::visit(
        [&](const auto& part) {
          if constexpr (requires { part.heads; }) text += part.heads.to_string();
        },
        components_[n]);
  }
  if (alignment_ == Alignment::top_left) text += " (top-left)";
  return text;
}

}  // namespace maskattn
