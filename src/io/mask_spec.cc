#include "maskattn/mask_spec.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/npy.h"

namespace maskattn {

namespace {

// Splits "a:b:c" into its parts (no limit).
std::vector<std::string> split_colons(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t colon = text.find(':', begin);
    parts.push_back(text.substr(begin, colon - begin));
    if (colon == std::string::npos) return parts;
    begin = colon + 1;
  }
}

class SpecParser {
 public:
  // `mask` is null for a modifier SPEC (--mod): then only modifiers are taken.
  SpecParser(const std::string& spec, Mask* mask, ScoreMods& mods, std::string label,
             const SpecOptions& options)
      : mask_(mask), mods_(mods), label_(std::move(label)), options_(options) {
    const size_t colon = spec.find(':');
    kind_ = spec.substr(0, colon);
    if (colon != std::string::npos) argument_ = spec.substr(colon + 1);
    has_argument_ = colon != std::string::npos;
  }

  void apply() {
    try {
      dispatch();
    } catch (const Error& error) {
      const std::string message = error.what();
      // Errors from the builder or the file reader get the spec in front; our own already have it.
      if (message.rfind(label_, 0) == 0) throw;
      throw Error(label_ + ": " + message);
    }
    if (added_component_) mask_->label_last(label_);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw Error(label_ + ": " + why); }

  void dispatch() {
    if (dispatch_modifier()) return;
    if (mask_ == nullptr) {
      fail(is_mask_kind(kind_) ? "'" + kind_ +
                                     "' is a mask SPEC; give it to --mask (--mod takes alibi, "
                                     "softcap, sinks, threshold, bias and expr)"
                               : "unknown kind '" + kind_ +
                                     "'; known modifiers: alibi, softcap, sinks, threshold, bias, "
                                     "expr");
    }
    dispatch_mask();
  }

  // The modifier kinds, and expr: as a score program under --mod. False: not one of them.
  bool dispatch_modifier() {
    if (kind_ == "alibi") {
      per_head_modifier(mods_.alibi_slopes, "alibi");
    } else if (kind_ == "sinks") {
      per_head_modifier(mods_.sinks, "sinks");
    } else if (kind_ == "softcap") {
      scalar_modifier(mods_.softcap, "softcap");
    } else if (kind_ == "threshold") {
      scalar_modifier(mods_.threshold, "threshold");
    } else if (kind_ == "bias") {
      if (mods_.bias) fail("bias given twice");
      mods_.bias = float_file(one());
    } else if (kind_ == "expr" && mask_ == nullptr) {
      score_program();
    } else {
      return false;
    }
    return true;
  }

  void dispatch_mask() {
    if (kind_ == "causal") return causal();
    if (kind_ == "window") return window();
    if (kind_ == "sliding-window") return component([&] { mask().sliding_window(integer(one())); });
    if (kind_ == "chunk") return component([&] { mask().chunk(integer(one())); });
    if (kind_ == "prefix") return component([&] { mask().prefix_lm(integer(one())); });
    if (kind_ == "key-lengths") return component([&] { mask().key_lengths(vector_file(one())); });
    if (kind_ == "key-starts") return component([&] { mask().key_starts(vector_file(one())); });
    if (kind_ == "key-keep") return component([&] { mask().key_keep(int_file(one(), 2)); });
    if (kind_ == "key-blocked") return component([&] { mask().key_keep(key_blocked(one())); });
    if (kind_ == "pad-id") return pad_id(Side::key);
    if (kind_ == "query-lengths") {
      return component([&] { mask().query_lengths(vector_file(one())); });
    }
    if (kind_ == "query-starts") return component([&] { mask().query_starts(vector_file(one())); });
    if (kind_ == "query-keep") return component([&] { mask().query_keep(int_file(one(), 2)); });
    if (kind_ == "query-pad-id") return pad_id(Side::query);
    if (kind_ == "segments" || kind_ == "spans") return id_pair();
    if (kind_ == "global") return global_tokens();
    if (kind_ == "block-sparse") return block_sparse();
    if (kind_ == "keep") return component([&] { mask().keep(bool_file(one())); });
    if (kind_ == "blocked") return component([&] { mask().blocked(bool_file(one())); });
    if (kind_ == "additive") return component([&] { mask().additive(float_file(one())); });
    if (kind_ == "expr") return mask_program();
    if (kind_ == "tree") return tree();
    fail("unknown kind '" + kind_ +
         "'; known: causal, window, sliding-window, chunk, prefix, key-lengths, key-starts, "
         "key-keep, key-blocked, pad-id, query-lengths, query-starts, query-keep, query-pad-id, "
         "segments, spans, global, block-sparse, keep, blocked, additive, expr, tree, alibi, "
         "softcap, sinks, threshold, bias");
  }

  static bool is_mask_kind(const std::string& kind) {
    for (const char* known :
         {"causal",     "window",       "sliding-window", "chunk",  "prefix",        "key-lengths",
          "key-starts", "key-keep",     "key-blocked",    "pad-id", "query-lengths", "query-starts",
          "query-keep", "query-pad-id", "segments",       "spans",  "global",        "block-sparse",
          "keep",       "blocked",      "additive",       "tree"}) {
      if (kind == known) return true;
    }
    return false;
  }

  template <typename Add>
  void component(Add&& add) {
    add();
    added_component_ = true;
  }

  // The single argument after "kind:".
  std::string one() const {
    if (!has_argument_ || argument_.empty()) fail("'" + kind_ + "' needs an argument");
    return argument_;
  }

  int64_t integer(const std::string& text) const {
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      fail("'" + text + "' is not an integer");
    }
    return value;
  }

  int64_t bound(const std::string& text) const {
    return text == "inf" ? kUnbounded : integer(text);
  }

  double real(const std::string& text) const {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || std::isnan(value)) {
      fail("'" + text + "' is not a number");
    }
    return value;
  }

  void causal() {
    if (!has_argument_ || argument_ == "bottom-right") {
      if (has_argument_) mask().set_alignment(Alignment::bottom_right);
      mask().causal();
    } else if (argument_ == "top-left") {
      mask().causal(Alignment::top_left);
    } else {
      fail("causal alignment '" + argument_ + "' is not 'top-left' or 'bottom-right'");
    }
    added_component_ = true;
  }

  void window() {
    const std::vector<std::string> sides = split_colons(one());
    if (sides.size() != 2) fail("window needs LEFT:RIGHT, e.g. window:128:0 or window:inf:0");
    component([&] { mask().window(bound(sides[0]), bound(sides[1])); });
  }

  void pad_id(Side side) {
    const std::string rest = one();
    const size_t colon = rest.find(':');
    if (colon == std::string::npos || colon + 1 == rest.size()) {
      fail(kind_ + " needs ID:FILE, e.g. " + kind_ + ":0:ids.npy");
    }
    const int64_t id = integer(rest.substr(0, colon));
    Array<int64_t> ids = int_file(rest.substr(colon + 1), 2);
    component([&] {
      if (side == Side::key)
        mask().key_pad_id(std::move(ids), id);
      else
        mask().query_pad_id(std::move(ids), id);
    });
  }

  // segments:FILE (shared ids, Lq == Lk) or segments:QFILE:KFILE; the same for spans.
  void id_pair() {
    const std::string rest = one();
    const size_t colon = rest.find(':');
    const bool segments = kind_ == "segments";
    if (colon == std::string::npos) {
      Array<int64_t> ids = int_file(rest, 2);
      component([&] {
        if (segments)
          mask().segments(std::move(ids));
        else
          mask().spans(std::move(ids));
      });
      return;
    }
    Array<int64_t> query_ids = int_file(rest.substr(0, colon), 2);
    Array<int64_t> key_ids = int_file(rest.substr(colon + 1), 2);
    component([&] {
      if (segments)
        mask().segments(std::move(query_ids), std::move(key_ids));
      else
        mask().spans(std::move(query_ids), std::move(key_ids));
    });
  }

  // global:FILE ([B,L] or [L] ids, ≠ 0 = global; Lq == Lk) or global:QFILE:KFILE.
  void global_tokens() {
    const std::string rest = one();
    const size_t colon = rest.find(':');
    if (colon == std::string::npos) {
      Array<int64_t> ids = global_file(rest, "[B,L] or [L]");
      component([&] { mask().global_tokens(std::move(ids)); });
      return;
    }
    Array<int64_t> query_ids = global_file(rest.substr(0, colon), "[B,Lq] or [Lq]");
    Array<int64_t> key_ids = global_file(rest.substr(colon + 1), "[B,Lk] or [Lk]");
    component([&] { mask().global_tokens(std::move(query_ids), std::move(key_ids)); });
  }

  // block-sparse:BQ:BK:FILE, the layout [nQ,nK], [H,nQ,nK] or [B,H,nQ,nK] of 0/1 or bools.
  void block_sparse() {
    const std::string rest = one();
    const size_t first = rest.find(':');
    const size_t second = first == std::string::npos ? first : rest.find(':', first + 1);
    if (second == std::string::npos || second + 1 == rest.size()) {
      fail(
          "block-sparse needs BQ:BK:FILE (block sizes in queries and keys, then the layout), "
          "e.g. block-sparse:64:64:layout.npy");
    }
    const int64_t block_q = block_size(rest.substr(0, first), "BQ");
    const int64_t block_k = block_size(rest.substr(first + 1, second - first - 1), "BK");
    const std::string path = rest.substr(second + 1);
    const NpyArray array = load(path);
    if (array.rank() < 2 || array.rank() > 4) {
      fail(path + " has shape " + shape_string(array.shape()) +
           "; a block-sparse layout is [nQ,nK], [H,nQ,nK] or [B,H,nQ,nK]");
    }
    Array<uint8_t> layout(dense_shape(array.shape()),
                          binary_values(array, path, "block-sparse layouts"));
    component([&] { mask().block_sparse(std::move(layout), block_q, block_k); });
  }

  int64_t block_size(const std::string& text, const char* name) const {
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 1) {
      fail(std::string("block size ") + name + " '" + text +
           "' is not a positive integer (block-sparse:BQ:BK:FILE)");
    }
    return value;
  }

  // tree:P0,P1,... (the parents inline, -1 for a root) or tree:FILE (a .npy of [T] or [B,T]
  // integers): a draft tree of speculative decoding over the last T keys.
  void tree() {
    const std::string rest = one();
    if (rest.find_first_not_of("-0123456789,") != std::string::npos) {
      const NpyArray array = load(rest);
      if (array.is_float()) {
        fail(rest + " has dtype " + npy_type_name(array.type()) +
             "; tree parents are integers (-1 for a root)");
      }
      Array<int64_t> parents(array.shape(), array.to_int64(rest));
      return component([&] { mask().tree(std::move(parents)); });
    }
    std::vector<int64_t> parents;
    size_t begin = 0;
    while (true) {
      const size_t comma = rest.find(',', begin);
      const std::string field = rest.substr(begin, comma - begin);
      if (field.empty()) {
        fail("tree needs its parents as comma-separated integers (-1 for a root), e.g. " +
             std::string("tree:-1,0,0,1,2, or a .npy file of [T] or [B,T] integers"));
      }
      parents.push_back(integer(field));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    component([&] { mask().tree(std::move(parents)); });
  }

  // expr:PROGRAM[:NAME=FILE]...: a mask program under --mask, a score program under --mod.
  void mask_program() {
    const auto [text, tables] = program_fields();
    Program program = compile(ProgramKind::mask, text, tables);
    component([&] { mask().program(std::move(program)); });
  }

  void score_program() {
    const auto [text, tables] = program_fields();
    Program program = compile(ProgramKind::score, text, tables);
    if (mods_.program) {
      fail("a second score program; a call takes one, so write both in one expression");
    }
    mods_.program = std::move(program);
  }

  // The program's text (the first field) and its tables (every further field, NAME=FILE).
  std::pair<std::string, std::vector<ProgramTable>> program_fields() const {
    const std::vector<std::string> fields = split_colons(one());
    if (fields[0].find_first_not_of(' ') == std::string::npos) {
      fail("expr needs a program before its tables, e.g. expr:q >= kv");
    }
    std::vector<ProgramTable> tables;
    for (size_t n = 1; n < fields.size(); ++n) tables.push_back(table(fields[n]));
    return {fields[0], std::move(tables)};
  }

  static Program compile_as(ProgramKind kind, const std::string& text,
                            const std::vector<ProgramTable>& tables) {
    return kind == ProgramKind::mask ? Program::mask(text, tables) : Program::score(text, tables);
  }

  // A program of `kind`. When it fails to compile but is a program of the other kind, the error
  // says which flag takes it rather than the type error the compiler found.
  Program compile(ProgramKind kind, const std::string& text,
                  const std::vector<ProgramTable>& tables) const {
    const ProgramKind other = kind == ProgramKind::mask ? ProgramKind::score : ProgramKind::mask;
    try {
      return compile_as(kind, text, tables);
    } catch (const Error&) {
      bool is_other_kind = true;
      try {
        compile_as(other, text, tables);
      } catch (const Error&) {
        is_other_kind = false;
      }
      if (!is_other_kind) throw;  // the compiler's error: the program is no good either way
    }
    fail(kind == ProgramKind::mask
             ? "`" + text +
                   "` is a score program (a number), not a mask program (a bool); give score "
                   "programs to --mod"
             : "`" + text +
                   "` is a mask program (a bool), not a score program (a number); give mask "
                   "programs to --mask");
  }

  // NAME=FILE: a table of the program from a .npy file of 1 to 3 dimensions. Bool stays bool,
  // int32 stays int32, other integers become int64 and floats float32, as the other SPECs read
  // their files (float64 rounds to nearest; values beyond float32 are refused).
  ProgramTable table(const std::string& field) const {
    const size_t equals = field.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == field.size()) {
      fail("table '" + field +
           "' is not NAME=FILE; after the program each ':' starts a table, e.g. "
           "expr:doc[q] == doc[kv]:doc=doc.npy");
    }
    const std::string name = field.substr(0, equals), path = field.substr(equals + 1);
    try {
      const NpyArray array = load(path);
      if (array.rank() < 1 || array.rank() > 3) {
        throw Error(path + " has shape " + shape_string(array.shape()) +
                    "; a program table has 1 to 3 dimensions");
      }
      std::vector<int64_t> sizes(array.shape().begin(), array.shape().end());
      switch (array.type()) {
        case NpyType::b1:
          return ProgramTable::own(name, array.bytes(), std::move(sizes));
        case NpyType::i4: {
          std::vector<int32_t> values(static_cast<size_t>(array.numel()));
          std::memcpy(values.data(), array.bytes().data(), array.bytes().size());
          return ProgramTable::own(name, std::move(values), std::move(sizes));
        }
        default:
          if (array.is_float()) {
            return ProgramTable::own(name, array.to_float32(path), std::move(sizes));
          }
          return ProgramTable::own(name, array.to_int64(path), std::move(sizes));
      }
    } catch (const Error& error) {
      fail("table " + name + ": " + error.what());
    }
  }

  void per_head_modifier(std::vector<float>& target, const char* name) {
    if (!target.empty()) fail(std::string(name) + " given twice");
    const std::string path = one();
    const NpyArray array = load(path);
    if (array.rank() != 1) {
      fail(std::string(name) + " file has shape " + shape_string(array.shape()) +
           "; expected [Hq]");
    }
    if (array.numel() == 0) fail(std::string(name) + " file is empty; expected [Hq] values");
    target = array.to_float32(path);
  }

  void scalar_modifier(std::optional<double>& target, const char* name) {
    if (target) fail(std::string(name) + " given twice");
    target = real(one());
  }

  NpyArray load(const std::string& path) const { return read_npy(path); }

  std::vector<int64_t> vector_file(const std::string& path) const {
    const NpyArray array = load(path);
    if (array.rank() != 1) {
      fail(path + " has shape " + shape_string(array.shape()) + "; expected [B]");
    }
    return array.to_int64(path);
  }

  Array<int64_t> int_file(const std::string& path, int rank) const {
    const NpyArray array = load(path);
    if (array.rank() != rank) {
      fail(path + " has shape " + shape_string(array.shape()) + "; expected rank " +
           std::to_string(rank) + (rank == 2 ? " [B,L]" : ""));
    }
    return Array<int64_t>(array.shape(), array.to_int64(path));
  }

  // Global-token ids: rank 1 (the same tokens in every sequence) or 2, integers or bools.
  Array<int64_t> global_file(const std::string& path, const char* layout) const {
    const NpyArray array = load(path);
    if (array.rank() != 1 && array.rank() != 2) {
      fail(path + " has shape " + shape_string(array.shape()) + "; global-token ids are " + layout +
           " (≠ 0 = global)");
    }
    return Array<int64_t>(array.shape(), array.to_int64(path));
  }

  // nn.MultiheadAttention's key_padding_mask polarity, [B,Lk] with 1 = padding, as key_keep.
  Array<int64_t> key_blocked(const std::string& path) const {
    const Array<int64_t> blocked = int_file(path, 2);
    std::vector<int64_t> keep(blocked.values().size());
    for (size_t n = 0; n < keep.size(); ++n) {
      const int64_t value = blocked.values()[n];
      if (value != 0 && value != 1) {
        fail(path + " holds " + std::to_string(value) + " at flat index " + std::to_string(n) +
             "; key-blocked masks hold only 0 and 1 (1 = padding)");
      }
      keep[n] = 1 - value;
    }
    return Array<int64_t>(blocked.shape(), std::move(keep));
  }

  Array<uint8_t> bool_file(const std::string& path) const {
    const NpyArray array = load(path);
    return Array<uint8_t>(dense_shape(array.shape()), binary_values(array, path, kind_ + " masks"));
  }

  // The elements of a bool or 0/1 integer array; `what` names the kind of array in messages.
  std::vector<uint8_t> binary_values(const NpyArray& array, const std::string& path,
                                     const std::string& what) const {
    if (array.is_float()) {
      fail(path + " has dtype " + npy_type_name(array.type()) + "; " + what +
           " are bool or 0/1 integers" +
           (what == "keep masks" || what == "blocked masks"
                ? " (for a float mask use additive:FILE)"
                : ""));
    }
    const std::vector<int64_t> values = array.to_int64(path);
    std::vector<uint8_t> flags(values.size());
    for (size_t n = 0; n < values.size(); ++n) {
      if (values[n] != 0 && values[n] != 1) {
        fail(path + " holds " + std::to_string(values[n]) + " at flat index " + std::to_string(n) +
             "; " + what + " hold only 0 and 1");
      }
      flags[n] = static_cast<uint8_t>(values[n]);
    }
    return flags;
  }

  Array<float> float_file(const std::string& path) const {
    const NpyArray array = load(path);
    return Array<float>(dense_shape(array.shape()), array.to_float32(path));
  }

  // With one-head inputs a 3-D dense file is [B, Lq, Lk]: insert the head axis.
  Dims dense_shape(Dims shape) const {
    if (options_.one_head_layout && shape.size() == 3) shape.insert(shape.begin() + 1, 1);
    return shape;
  }

  // The mask SPEC's mask; only mask SPECs (dispatch_mask) reach it, and they always have one.
  Mask& mask() const { return *mask_; }

  Mask* mask_;
  ScoreMods& mods_;
  std::string label_;
  SpecOptions options_;
  std::string kind_, argument_;
  bool has_argument_ = false;
  bool added_component_ = false;
};

}  // namespace

void apply_mask_spec(const std::string& spec, Mask& mask, ScoreMods& mods, const std::string& label,
                     const SpecOptions& options) {
  SpecParser(spec, &mask, mods, label.empty() ? "mask spec '" + spec + "'" : label, options)
      .apply();
}

void apply_mod_spec(const std::string& spec, ScoreMods& mods, const std::string& label,
                    const SpecOptions& options) {
  SpecParser(spec, nullptr, mods, label.empty() ? "modifier spec '" + spec + "'" : label, options)
      .apply();
}

const char* mask_spec_help() {
  return R"(Mask SPECs (repeat --mask; a pair is allowed iff every component allows it):
  causal                  kpos <= qpos, bottom-right aligned (the last query sits at the last key)
  causal:top-left         kpos <= qpos with qpos = i (PyTorch is_causal); sets the mask's alignment
  window:LEFT:RIGHT       qpos-LEFT <= kpos <= qpos+RIGHT, inclusive; 'inf' = unbounded side
  sliding-window:W        W keys including the query's own position (= window:W-1:0)
  chunk:C                 floor(qpos/C) == floor(kpos/C)
  prefix:P                positions [0,P) attend each other both ways (prefix-LM)
  key-lengths:FILE        [B] ints: keys j < len[b] are real (right padding)
  key-starts:FILE         [B] ints: keys j >= start[b] are real (left padding; positions shift)
  key-keep:FILE           [B,Lk] 0/1: 1 = real key (HF attention_mask)
  key-blocked:FILE        [B,Lk] 0/1: 1 = padding (PyTorch key_padding_mask)
  pad-id:ID:FILE          [B,Lk] token ids: keys whose id == ID are padding
  query-lengths:FILE      [B] ints: queries i >= len[b] are padding (their rows output 0)
  query-starts:FILE, query-keep:FILE, query-pad-id:ID:FILE   the other query padding forms
  segments:FILE           [B,L] ids (Lq == Lk): attend only within the same segment
  segments:QFILE:KFILE    [B,Lq] and [B,Lk] segment ids
  spans:FILE              [B,L] ids: equal non-zero ids attend both ways despite causal/window
  spans:QFILE:KFILE       [B,Lq] and [B,Lk] span ids
  global:FILE             [B,L] or [L] ids, != 0 = global (Longformer): a global query sees, and a
                          global key is seen by, every position causal/window would hide
  global:QFILE:KFILE      [B,Lq]/[Lq] and [B,Lk]/[Lk] global flags (a KV-cache step)
  block-sparse:BQ:BK:FILE layout [nQ,nK], [H,nQ,nK] or [B,H,nQ,nK] of 0/1: query i may attend key
                          j iff layout[..., i/BQ, j/BK] (indices); nQ = ceil(Lq/BQ) or 1, nK the
                          same (maskattn layout writes BigBird, strided and fixed layouts)
  keep:FILE               bool/0-1 array broadcasting to [B,Hq,Lq,Lk]: 1 = may attend
  blocked:FILE            bool/0-1 array broadcasting to [B,Hq,Lq,Lk]: 1 = hidden
  additive:FILE           float array broadcasting to [B,Hq,Lq,Lk], added; only -inf hides
  tree:P0,P1,...          a draft tree (speculative decoding) of T tokens, the last T keys and
  tree:FILE               queries: parents[t] in [-1, t), -1 = a root; a draft query sees the
                          prefix, its ancestors and itself; FILE: [T] or [B,T] integers
  expr:PROGRAM[:NAME=FILE]...
                          a mask program over b, h, q, kv (row indices, top-left), e.g.
                          'expr:(doc[q] == doc[kv]) & (q >= kv):doc=doc.npy'; each NAME=FILE is
                          a table, a .npy of 1-3 dims (docs/cli.md: Programs)
Modifier SPECs (repeat --mod; --mask takes them too, except expr:):
  alibi:FILE              [Hq] slopes: score -= slope[h]*|qpos-kpos|
  softcap:X               score = X*tanh(score/X), before masks and biases
  sinks:FILE              [Hq] sink logits that join each row's softmax denominator
  threshold:X             hide pairs whose final score is below X
  bias:FILE               float array broadcasting to [B,Hq,Lq,Lk], added to the scores
  expr:PROGRAM[:NAME=FILE]...
                          a score program of s (after softcap, ALiBi, bias and additive masks), b,
                          h, q, kv, e.g. 'expr:s - slope[h] * abs(q - kv):slope=slopes.npy'
)";
}

}  // namespace maskattn
