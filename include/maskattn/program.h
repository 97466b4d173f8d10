// Masks and score modifiers as programs (issue 25, first piece): a small expression language in
// the textual form of PyTorch's FlexAttention mask_mod / score_mod bodies, compiled to a typed,
// constant-folded IR and evaluated either one pair at a time (the reference) or one tile of up to
// 64 × 64 pairs at a time (what a kernel will call). Not yet reachable from Mask or ScoreMods.
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

  // The scalar reference, one pair at a time.
  bool allows(int64_t b, int64_t h, int64_t q, int64_t kv) const;
  float score(float s, int64_t b, int64_t h, int64_t q, int64_t kv) const;

  // One tile: queries [q0, q0 + nq) × keys [kv0, kv0 + nk) of (b, h), 1 ≤ nq, nk ≤ 64.
  // mask_tile writes bits[0, nk): bit i of bits[j] is set iff query q0 + i may see key kv0 + j
  // (src/mask/tile_mask.h's layout). score_tile maps s[j * nq + i] (key-major [nk][nq], the score
  // of query q0 + i against key kv0 + j) in place. Both agree exactly with allows / score.
  void mask_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                 uint64_t* bits) const;
  void score_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                  float* s) const;

 private:
  explicit Program(std::shared_ptr<const program::ProgramIr> ir);
  std::shared_ptr<const program::ProgramIr> ir_;
};

}  // namespace maskattn
