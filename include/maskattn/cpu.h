// What this CPU offers the kernels, and which unit computes the products of each dtype
// (attention.h: Products). `maskattn info` prints this report.
#pragma once

#include <cstdint>
#include <string>

#include "maskattn/attention.h"
#include "maskattn/dtype.h"

namespace maskattn {

struct CpuReport {
  std::string model;        // /proc/cpuinfo's "model name", or "unknown"
  std::string simd_target;  // Highway's target for the SIMD kernels here (AVX3_SPR, AVX3_ZEN4, …)
  bool avx512 = false;
  bool avx512_bf16 = false;    // vdpbf16ps
  bool avx512_fp16 = false;    // reported for completeness; the kernels do not use it
  bool amx_bf16 = false;       // CPUID says AMX-TILE and AMX-BF16, and the OS enabled the tiles
  bool amx_permitted = false;  // Linux granted this process the tile data (arch_prctl)
  // Without AMX, vdpbf16ps's speed decides between it and f32 products; CPUID cannot tell (fast
  // on AMD Zen, half rate on Intel), so it is measured once (≈ 0.1 ms). Empty when not measured.
  std::string bf16_probe;
  // The automatic choice per input dtype (MASKATTN_PRODUCTS not applied).
  Products f32 = Products::f32, f16 = Products::f32, bf16 = Products::f32;
};
CpuReport cpu_report();

const char* products_name(Products products);  // "auto", "f32", "bf16-dot", "amx"
// The inverse of products_name; an Error for any other text, naming `what` (an option, a
// variable).
Products parse_products(const std::string& name, const std::string& what);

// The unit the fused tile kernel takes for inputs of `dtype` with these head dims, as `requested`
// (automatic: MASKATTN_PRODUCTS if set, else this CPU's fastest). `contiguous_rows`: Q, K and V
// rows are contiguous in memory.
Products tile_products(DType dtype, int64_t head_dim, int64_t value_dim, bool contiguous_rows,
                       Products requested = Products::automatic);

}  // namespace maskattn
