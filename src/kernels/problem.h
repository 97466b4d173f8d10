// The validated parameters of one attention call. attention() builds it once; kernels trust it.
#pragma once

#include <cstdint>

#include "core/dropout.h"
#include "kernels/kv_pages.h"
#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"
#include "maskattn/attention.h"

namespace maskattn::detail {

// Letters used everywhere: B batch, Hq query heads, Hkv kv heads, Lq queries, Lk keys,
// D query/key head dim, Dv value head dim.
struct Problem {
  TensorView q;  // [B, Hq, Lq, D]
  TensorView k;  // [B, Hkv, Lk, D]
  TensorView v;  // [B, Hkv, Lk, Dv], or null when only scores/weights are wanted
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, k_len = 0, head_dim = 0, value_dim = 0;
  double scale = 1.0;
  const ResolvedMask* mask = nullptr;
  const ResolvedMods* mods = nullptr;
  int threads = 0;  // 0 = OpenMP default
  // The product unit asked for (MASKATTN_PRODUCTS applied, checked against the CPU); the kernel
  // picks the unit per call with maskattn::tile_products (cpu.h).
  Products products = Products::automatic;
  // Attention dropout (core/dropout.h), resolved against the whole problem; off by default.
  DropoutRule dropout;
  // K and V of a paged cache (kernels/kv_pages.h): read through block tables; k and v are then
  // shape-only views of zeros. Null: k and v hold the keys and values.
  const KVPages* pages = nullptr;

  // GQA/MQA: query heads [g·r, (g+1)·r) share kv head g, r = Hq / Hkv.
  int64_t kv_head(int64_t h) const { return h / (q_heads / kv_heads); }
};

}  // namespace maskattn::detail
