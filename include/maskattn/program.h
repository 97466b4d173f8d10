// Masks and score modifiers as programs (issue 25, first piece): a small expression language in
// the textual form of PyTorch's FlexAttention mask_mod / score_mod bodies, compiled to a typed,
// constant-folded IR and evaluated either one pair at a time (the reference) or one tile of up to
// 64 × 64 pairs at a time (what the kernels call). Mask::program and ScoreMods::program take them
// (docs/semantics.md §16).
//
// The language, in one paragraph. Identifiers b, h, q, kv are the int64 batch, head, query and key
// positions; s is the f32 score (score programs only). Integer literals are int64, literals with
// a '.' or an exponent are f32. Captured tables are indexed with 1 to 3 int64 expressions:
// doc[q], rel[h, q - kv + 4096]. Operators, loosest first, as in Python: one comparison
// (== != < <= > >=; a < b < c is an error), | (or), & (and) on bools, + -, * / // %, unary - and
// ~ (not, on bools). / is true division (f32); // and % are Python's floor division and modulo on
// int64 (an int64 divisor of 0 is an Error at evaluation). Functions: where(c, a, b), min, max,
// abs, exp, log, tanh, sigmoid, and floor(x) (f32 → int64, rounding down; NaN → 0, beyond int64
// saturates). Where an operation mixes int64 and f32 the int64 side becomes f32. Int64 arithmetic
// wraps (two's complement); f32 arithmetic is IEEE single precision, the same in both evaluators.
// Evaluation is eager: both branches of where and every table read are evaluated, so an index out
// of range in an untaken branch is still an Error (as torch.where evaluates both sides).
//
// A mask program has type bool; a score program has type f32 (an int64 result is promoted).
// Every bad program is a maskattn::Error naming the column, the construct, and the tables.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace maskattn {

enum class ProgramTableType : uint8_t { int64, int32, float32, boolean /* one uint8_t, 0 or 1 */ };

// A captured table: a name and a borrowed view (no copy; the memory must outlive the Program).
// Element (i0, i1, i2) is at data + Σ ik · strides[k] elements; 1 to 3 sizes, strides in elements.
// An int32 table reads as int64, a boolean table as bool (any non-zero byte is true), float32 as
// f32.
struct ProgramTable {
  std::string name;
  const void* data = nullptr;
  ProgramTableType type = ProgramTableType::int64;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: contiguous (row-major) for sizes
  // Optional: keeps the memory alive as long as the Program (a Python array, an owned vector).
  std::shared_ptr<const void> owner;

  // A borrowed contiguous view of int64, int32, float or bool (uint8_t 0/1) data.
  template <class T>
  static ProgramTable borrow(std::string name, const T* data, std::vector<int64_t> sizes) {
    return ProgramTable{std::move(name), data, type_of<T>(), std::move(sizes), {}, {}};
  }
  // A table that owns its values (contiguous, row-major for sizes).
  template <class T>
  static ProgramTable own(std::string name, std::vector<T> values, std::vector<int64_t> sizes) {
    auto owned = std::make_shared<const std::vector<T>>(std::move(values));
    ProgramTable table = borrow(std::move(name), owned->data(), std::move(sizes));
    table.owner = owned;
    return table;
  }

 private:
  template <class T>
  static constexpr ProgramTableType type_of() {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t> ||
                      std::is_same_v<T, float> || std::is_same_v<T, uint8_t>,
                  "a program table holds int64, int32, float or uint8_t (bool) elements");
    if constexpr (std::is_same_v<T, int32_t>) return ProgramTableType::int32;
    if constexpr (std::is_same_v<T, float>) return ProgramTableType::float32;
    if constexpr (std::is_same_v<T, uint8_t>) return ProgramTableType::boolean;
    return ProgramTableType::int64;
  }
};

// The problem a program is evaluated over, in global rows: b < batch, h < heads, q < q_len,
// kv < k_len (the Mask's or ScoreMods' whole problem, mask.h's Frame included).
struct ProgramDomain {
  int64_t batch = 1, heads = 1, q_len = 0, k_len = 0;
};

// Where the elements of a score tile are: the pair (query q0 + i, key kv0 + j) is at
// s[j * row_stride + i] (key rows: the forward kernel's Sᵀ) or s[i * row_stride + j] (query rows:
// the backward kernel's S). 1 ≤ nq, nk ≤ 64.
struct ProgramTile {
  int64_t b = 0, h = 0, q0 = 0, nq = 1, kv0 = 0, nk = 1;
  bool query_rows = false;
  int64_t row_stride = 0;  // 0: packed (nq with key rows, nk with query rows)
};

enum class ProgramKind : uint8_t { mask, score };

namespace program {
struct ProgramIr;  // src/program/ir.h
}  // namespace program

class Program {
 public:
  // Compile a mask program (type bool) or a score program (type f32). Throws maskattn::Error.
  static Program mask(std::string_view text, std::vector<ProgramTable> tables = {});
  static Program score(std::string_view text, std::vector<ProgramTable> tables = {});

  ProgramKind kind() const;
  // The canonical text: every literal folded, parenthesised only where needed; it compiles back to
  // the same program (and the same text).
  std::string text() const;
  // The number of IR nodes after folding (for tests and curiosity).
  int64_t node_count() const;
  // The tables, as given (strides filled in).
  const std::vector<ProgramTable>& tables() const;
  // Whether the result depends on b, on h, on s (a mask program never does).
  bool depends_on_batch() const;
  bool depends_on_head() const;
  bool depends_on_score() const;

  // Proves, by interval arithmetic over the domain (and each table's value range), that no
  // evaluation anywhere in it can index outside a table or divide by zero, so that kernels may
  // evaluate tiles without checks and never fail half-way. Throws Error (E128) naming the table,
  // the index and its possible range otherwise: a program that could read out of range is refused
  // before any evaluation, whichever pairs a mask would have hidden. Sound (a program that passes
  // never raises on the domain, for the tables' contents at the time of the check) and exact for
  // affine indices such as q - kv + 63; a where's value is ranged on the pairs that take each
  // branch (where(abs(q - kv) < 8, abs(q - kv), …) needs no clamp), though every read inside
  // either branch must be in range everywhere. An empty domain passes.
  void check(const ProgramDomain& domain) const;

  // The scalar reference, one pair at a time.
  bool allows(int64_t b, int64_t h, int64_t q, int64_t kv) const;
  float score(float s, int64_t b, int64_t h, int64_t q, int64_t kv) const;

  // One tile: queries [q0, q0 + nq) × keys [kv0, kv0 + nk) of (b, h), 1 ≤ nq, nk ≤ 64.
  // mask_tile writes bits[0, nk): bit i of bits[j] is set iff query q0 + i may see key kv0 + j
  // (src/mask/tile_mask.h's layout). score_tile maps s[j * nq + i] (key-major [nk][nq], the score
  // of query q0 + i against key kv0 + j) in place. Both agree exactly with allows / score, and
  // allocate nothing once the calling thread has evaluated a tile of the program's size.
  void mask_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                 uint64_t* bits) const;
  void score_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                  float* s) const;
  // score_tile on any layout (ProgramTile).
  void score_tile(const ProgramTile& tile, float* s) const;
  // The backward of score_tile (reverse mode over the IR): `s` holds the scores that entered
  // score_tile (its input, not its output), `ds` holds ∂L/∂output and receives ∂L/∂input, in the
  // tile's layout. Pairs whose ∂L/∂output is exactly 0 (hidden pairs) get 0 and contribute nothing
  // (no 0·inf = NaN). For each float32 table t with table_grads[t] != nullptr (a zeroed or
  // accumulating row-major buffer of the table's element count, in doubles), adds ∂L/∂table: the
  // sum over the tile's pairs of ∂L/∂output · ∂output/∂t[index], in a fixed order (key rows, then
  // queries), so the result does not depend on which thread evaluates which tile, nor on the
  // layout. table_grads may be null (no table gradients). Derivatives follow PyTorch: abs'(0) = 0,
  // min/max give a tie half to each side, where gives all to the taken side; to_f32, floor and
  // comparisons stop the gradient. Adjoints are f64, rounded once into ds.
  void score_tile_backward(const ProgramTile& tile, const float* s, float* ds,
                           double* const* table_grads) const;

 private:
  explicit Program(std::shared_ptr<const program::ProgramIr> ir);
  std::shared_ptr<const program::ProgramIr> ir_;
};

}  // namespace maskattn
