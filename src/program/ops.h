// Each operator's arithmetic, written once. A `with_*` function calls `use(f)` with `f` the
// operator as a plain function of element values (int64 for bool and int64 nodes, float for f32
// ones): the scalar evaluator (and so constant folding) calls f once per pair, the tile evaluator
// maps it over a whole tile. One definition, hence the same bits in all three (program.h promises
// that the two evaluators agree exactly). The tile evaluator's comparisons into bit rows are
// vector compares (tile_bits-inl.h), integer and IEEE comparisons with the same results, and its
// affine int64 nodes are kept only where no element wraps, so those too give the same values.
//
// The conversions to_f32 (int64 → f32) and floor (f32 → int64) change the element type; each
// evaluator handles them itself, as it does constants, variables, tables and where.
#pragma once

#include <cmath>
#include <cstdint>

#include "program/ir.h"

namespace maskattn::program {

// neg, abs and logical_not on an int64 (or bool) operand.
template <typename Use>
decltype(auto) with_int_unary(Op op, Use&& use) {
  switch (op) {
    case Op::neg:
      return use([](int64_t x) { return wrap_neg(x); });
    case Op::abs:
      return use([](int64_t x) { return wrap_abs(x); });
    default:  // logical_not
      return use([](int64_t x) -> int64_t { return x ^ 1; });
  }
}

// The binary operators on int64 (or bool) operands; comparisons give 0 or 1. `on_zero_divisor`
// is called with the dividend of a // or % by 0 and must throw.
template <typename OnZeroDivisor, typename Use>
decltype(auto) with_int_binary(Op op, const OnZeroDivisor& on_zero_divisor, Use&& use) {
  switch (op) {
    case Op::add:
      return use([](int64_t x, int64_t y) { return wrap_add(x, y); });
    case Op::sub:
      return use([](int64_t x, int64_t y) { return wrap_sub(x, y); });
    case Op::mul:
      return use([](int64_t x, int64_t y) { return wrap_mul(x, y); });
    case Op::floordiv:
      return use([&](int64_t x, int64_t y) {
        if (y == 0) on_zero_divisor(x);
        return floor_div(x, y);
      });
    case Op::mod:
      return use([&](int64_t x, int64_t y) {
        if (y == 0) on_zero_divisor(x);
        return floor_mod(x, y);
      });
    case Op::eq:
      return use([](int64_t x, int64_t y) -> int64_t { return x == y; });
    case Op::ne:
      return use([](int64_t x, int64_t y) -> int64_t { return x != y; });
    case Op::lt:
      return use([](int64_t x, int64_t y) -> int64_t { return x < y; });
    case Op::le:
      return use([](int64_t x, int64_t y) -> int64_t { return x <= y; });
    case Op::gt:
      return use([](int64_t x, int64_t y) -> int64_t { return x > y; });
    case Op::ge:
      return use([](int64_t x, int64_t y) -> int64_t { return x >= y; });
    case Op::logical_and:
      return use([](int64_t x, int64_t y) { return x & y; });
    case Op::logical_or:
      return use([](int64_t x, int64_t y) { return x | y; });
    case Op::min:
      return use([](int64_t x, int64_t y) { return y < x ? y : x; });
    default:  // max
      return use([](int64_t x, int64_t y) { return x < y ? y : x; });
  }
}

// The f32 → f32 unary operators: neg, abs, exp, log, tanh, sigmoid.
template <typename Use>
decltype(auto) with_f32_unary(Op op, Use&& use) {
  switch (op) {
    case Op::neg:
      return use([](float x) { return -x; });
    case Op::abs:
      return use([](float x) { return std::fabs(x); });
    case Op::exp:
      return use([](float x) { return math_f32(Op::exp, x); });
    case Op::log:
      return use([](float x) { return math_f32(Op::log, x); });
    case Op::tanh:
      return use([](float x) { return math_f32(Op::tanh, x); });
    default:  // sigmoid
      return use([](float x) { return math_f32(Op::sigmoid, x); });
  }
}

inline bool is_comparison(Op op) {
  return op == Op::eq || op == Op::ne || op == Op::lt || op == Op::le || op == Op::gt ||
         op == Op::ge;
}

// The f32 comparisons, giving 0 or 1 (int64).
template <typename Use>
decltype(auto) with_f32_comparison(Op op, Use&& use) {
  switch (op) {
    case Op::eq:
      return use([](float x, float y) -> int64_t { return x == y; });
    case Op::ne:
      return use([](float x, float y) -> int64_t { return x != y; });
    case Op::lt:
      return use([](float x, float y) -> int64_t { return x < y; });
    case Op::le:
      return use([](float x, float y) -> int64_t { return x <= y; });
    case Op::gt:
      return use([](float x, float y) -> int64_t { return x > y; });
    default:  // ge
      return use([](float x, float y) -> int64_t { return x >= y; });
  }
}

// The f32 → f32 binary operators: add, sub, mul, div, min, max.
template <typename Use>
decltype(auto) with_f32_arithmetic(Op op, Use&& use) {
  switch (op) {
    case Op::add:
      return use([](float x, float y) { return x + y; });
    case Op::sub:
      return use([](float x, float y) { return x - y; });
    case Op::mul:
      return use([](float x, float y) { return x * y; });
    case Op::div:
      return use([](float x, float y) { return x / y; });
    case Op::min:
      return use([](float x, float y) { return min_f32(x, y); });
    default:  // max
      return use([](float x, float y) { return max_f32(x, y); });
  }
}

}  // namespace maskattn::program
