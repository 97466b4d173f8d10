// Which unit computes the products (attention.h: Products), per CPU and per call; and the table
// that finds each unit's description (product_unit.h), one row per Products value.
//
// The rule: bf16 inputs take AMX where the CPU has it and Linux grants it; else vdpbf16ps when it
// is measurably faster than f32 FMA on this core (AMD Zen 4/5: 2×; Intel: half rate, so a bf16
// call converts to f32 instead); else f32. f16 and f32 inputs take f32 products everywhere: AMX
// has no f16 input on the CPUs we target, and converting f16 to bf16 would drop 3 mantissa bits.
// Whatever the unit, the tile kernel's arithmetic depends on it and on the shapes only, never on
// the thread count.
#include <hwy/targets.h>

#include <cpuid.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "core/names.h"
#include "kernels/amx.h"
#include "kernels/bf16_dot.h"
#include "kernels/product_unit.h"
#include "kernels/products.h"
#include "maskattn/cpu.h"
#include "maskattn/error.h"

namespace maskattn {

namespace {

// The table of product units (product_unit.h): one row per unit, each defined in its own file.
struct UnitRow {
  Products products;
  const detail::fused::ProductUnit* unit;
};
constexpr UnitRow kUnits[] = {
    {Products::f32, &detail::fused::kF32Unit},
    {Products::bf16_dot, &detail::fused::kBf16DotUnit},
    {Products::amx, &detail::fused::kAmxUnit},
};

constexpr double kBf16DotMinSpeedup = 1.2;  // vdpbf16ps must beat f32 FMA by this much

bool bf16_dot_pays() {
  return detail::fused::bf16_dot_available() &&
         detail::fused::bf16_dot_speedup() >= kBf16DotMinSpeedup;
}

Products automatic_bf16() {
  if (detail::fused::amx_available()) return Products::amx;
  return bf16_dot_pays() ? Products::bf16_dot : Products::f32;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

bool cpuid_leaf7_edx_bit(unsigned bit) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (d & (1u << bit)) != 0;
}

}  // namespace

const char* products_name(Products products) {
  if (products == Products::automatic) return "auto";
  for (const UnitRow& row : kUnits) {
    if (row.products == products) return row.unit->name;
  }
  return "?";
}

Products parse_products(const std::string& name, const std::string& what) {
  // "auto", then the table's units in their order: a new row's name is accepted with no edit here.
  std::array<Products, std::size(kUnits) + 1> choices{Products::automatic};
  for (size_t n = 0; n < std::size(kUnits); ++n) choices[n + 1] = kUnits[n].products;
  return detail::parse_name(name, what, "product unit", choices, products_name);
}

Products tile_products(DType dtype, int64_t head_dim, int64_t value_dim, bool contiguous_rows,
                       Products requested) {
  requested = detail::requested_products(requested);
  if (dtype != DType::bf16) return Products::f32;
  Products unit = requested == Products::automatic ? automatic_bf16() : requested;
  const auto fits = [&](Products p) {
    return detail::fused::product_unit(p).fits(head_dim, value_dim, contiguous_rows);
  };
  if (unit == Products::amx && !fits(unit)) {
    unit = bf16_dot_pays() ? Products::bf16_dot : Products::f32;
  }
  if (unit == Products::bf16_dot && !fits(unit)) unit = Products::f32;
  return unit;
}

CpuReport cpu_report() {
  CpuReport r;
  r.model = cpu_model();
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  r.simd_target = hwy::TargetName(targets & -targets);  // the best: the lowest bit
  r.avx512 = __builtin_cpu_supports("avx512f") != 0;
  r.avx512_bf16 = detail::fused::bf16_dot_available();
  r.avx512_fp16 = cpuid_leaf7_edx_bit(23);
  r.amx_bf16 = cpuid_leaf7_edx_bit(22) && cpuid_leaf7_edx_bit(24);
  r.amx_permitted = detail::fused::amx_available();
  if (r.avx512_bf16) {
    char text[96];
    std::snprintf(text, sizeof text, "vdpbf16ps at %.2fx the f32 FMA rate (needs %.2fx)",
                  detail::fused::bf16_dot_speedup(), kBf16DotMinSpeedup);
    r.bf16_probe = text;
  }
  r.bf16 = automatic_bf16();
  return r;
}

namespace detail {

const fused::ProductUnit& fused::product_unit(Products products) {
  for (const UnitRow& row : kUnits) {
    if (row.products == products) return *row.unit;
  }
  throw Error(std::string("no product unit for products = ") + products_name(products));
}

Products requested_products(Products requested) {
  if (requested == Products::automatic) {
    const char* variable = std::getenv("MASKATTN_PRODUCTS");
    if (variable != nullptr && *variable != '\0') {
      requested = parse_products(variable, "environment variable MASKATTN_PRODUCTS");
    }
  }
  if (requested == Products::bf16_dot && !fused::bf16_dot_available()) {
    throw Error(
        "products = bf16-dot, but this CPU has no AVX512-BF16 (vdpbf16ps); maskattn info lists "
        "what it has");
  }
  if (requested == Products::amx && !fused::amx_available()) {
    throw Error(
        "products = amx, but AMX-BF16 is not usable here (the CPU lacks it, or Linux refused this "
        "process the tile state); maskattn info lists what the CPU has");
  }
  return requested;
}

}  // namespace detail
}  // namespace maskattn
