// The public entry points: attention(), attention_weights(), attention_scores(), allowed_pairs().
//
//   Q [B, Hq, Lq, D]   K [B, Hkv, Lk, D]   V [B, Hkv, Lk, Dv]   →   O [B, Hq, Lq, Dv]
//   LSE (optional) [B, Hq, Lq] f32: natural-log log-sum-exp of the row's softmax denominator.
//
// Q, K, V and O share one element type (f32, f16 or bf16). Hq % Hkv == 0; query head h reads
// kv head h / (Hq / Hkv) (GQA/MQA). A row with no allowed key gives O = 0, LSE = −inf (or the sink
// logit when there is a sink), weights 0 — never NaN, Lk = 0 included.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn {

enum class Kernel : uint8_t {
  automatic,  // the fused kernel (the only fast path today)
  reference,  // the f64 oracle: exact, slow, O(Lk) scratch per row
  fused,      // tiled, SIMD (runtime dispatch), skips what the mask hides, f32 accumulation
};
const char* kernel_name(Kernel kernel);  // "auto", "reference", "fused"
// The inverse of kernel_name; an Error for any other text, naming `what` (an option, an argument):
// `kernel = 'fast' is not a kernel: use auto, reference or fused` (errors.md E97).
Kernel parse_kernel(const std::string& name, const std::string& what);

// Which unit computes the fused kernels' products for bf16 inputs (f32 and f16 inputs always
// use f32 products: no CPU we target multiplies f16 with f32 accumulation faster). `automatic`
// takes this CPU's fastest (cpu.h says which, `maskattn info` prints it); the environment
// variable MASKATTN_PRODUCTS=auto|f32|bf16-dot|amx overrides `automatic`, for tests and
// benchmarks. Forcing a unit the CPU lacks is an Error; a shape a unit cannot take (AMX: D a
// multiple of 32, Dv of 16; both: rows contiguous in memory) runs on the next one.
enum class Products : uint8_t {
  automatic,
  f32,       // widen to f32 once per call, f32 FMA: every CPU
  bf16_dot,  // vdpbf16ps (AVX512-BF16): fast on AMD Zen 4/5, half rate on Intel
  amx,       // AMX tiles (Intel Sapphire Rapids and later)
};

// Attention dropout (docs/semantics.md §17): each allowed pair (b, h, q, kv) is dropped with
// probability p, as a pure function of (seed, offset, b, h, q, kv) — Philox4x32-10 keyed on the
// seed, counting over the pair's global rows (Options::frame) — so the dropped pairs are the same
// bits for any thread count, tiling, split of the keys, ring, and for both kernels; the backward
// regenerates them instead of storing them. Dropout applies to the normalised weights:
//   O = (P∘Z)·V / (1 − p')   with Z_ij ∈ {0, 1} the kept pairs and P the undropped softmax,
// where p' = round(p·65536)/65536 (the generator compares 16-bit draws; |p − p'| ≤ 2^-17, and
// scaling by 1/(1 − p') keeps E[O] exact). LSE is the undropped one (FlashAttention's definition),
// hidden pairs stay hidden, p = 0 is no dropout, p = 1 drops every pair (O = 0).
struct Dropout {
  double p = 0.0;       // 0 ≤ p ≤ 1
  uint64_t seed = 0;    // the Philox key
  uint64_t offset = 0;  // < 2^32: separates calls that share a seed (layers, steps)
  // The counter's batch index is batch_offset + b: a call on entries [n, n + B) of a larger batch
  // (attention_varlen's sequence i alone: batch_offset = i) draws as that batch does.
  uint64_t batch_offset = 0;
};

struct Options {
  std::optional<double> scale;  // default 1/√D
  bool check_finite = false;    // raise an Error naming the first NaN/Inf in Q, K or V
  Kernel kernel = Kernel::automatic;
  int threads = 0;  // 0 = OpenMP's default (all cores); at most kMaxThreads
  Products products = Products::automatic;
  // The slice of a larger problem this call computes (mask.h); default: the whole problem.
  Frame frame;
  // Whether mods.sinks join this call's softmax denominators. A problem split along its keys
  // counts the sinks in exactly one part: pass false for the others (merge_partials adds parts).
  bool count_sinks = true;
  // Attention dropout (above); attention(), attention_backward() and attention_weights() apply
  // it (weights: the dropped, rescaled weights), attention_scores() shows scores before it.
  Dropout dropout;
};

inline constexpr int kMaxThreads = 1024;

// O = softmax(S)·V with S = scale·Q·Kᵀ (+ modifiers) and the mask's hidden pairs removed.
// `lse` is optional (a null view skips it). `out` has q's dtype, or f32 for f16/bf16 inputs (a
// partial result kept unrounded until merge_partials rounds once). Throws maskattn::Error on
// invalid input, before writing anything.
void attention(const TensorView& q, const TensorView& k, const TensorView& v,
               const MutableTensorView& out, const Mask& mask = {}, const ScoreMods& mods = {},
               const Options& options = {}, const MutableTensorView& lse = {});

// Attention over disjoint key sets, merged into attention over their union (split-key decoding,
// ring attention): LSE = log Σ_c exp(LSE_c), O = Σ_c exp(LSE_c − LSE)·O_c. Each part is the output
// [B, Hq, Lq, Dv] (f32, f16 or bf16) and LSE [B, Hq, Lq] (f32) of one call over its keys; a part
// whose row saw no key (LSE −inf) changes nothing. Sinks belong to exactly one part.
struct PartialResult {
  TensorView out;
  TensorView lse;
};
void merge_partials(const std::vector<PartialResult>& parts, const MutableTensorView& out,
                    const MutableTensorView& lse = {});

// ---- backward -----------------------------------------------------------------------------------
//
// Gradients of a loss L with respect to the inputs of attention(), given dO = ∂L/∂O (docs/design.md
// §4):
//   P = exp(S − LSE)   D_i = Σ_e dO_ie·O_ie   dV = Pᵀ·dO   dP = dO·Vᵀ   dS = P∘(dP − D)
//   dQ = scale·dS'·K   dK = scale·dS'ᵀ·Q      with dS' = dS through the modifiers' chain rule
// (softcap: ×(1 − tanh²(s/cap)); ALiBi, bias, additive masks: ×1; a pair below the threshold is
// hidden and gets 0). Hidden pairs contribute nothing: a fully hidden row has dQ = 0, a key no
// query sees has dK = dV = 0, exactly, whatever the inputs hold there.
struct Gradients {
  // Gradients{dq, dk, dv} (the usual call) and any longer prefix of the fields, without
  // -Wmissing-field-initializers in code built with -Wextra; or default, then set fields by name.
  Gradients() = default;
  Gradients(MutableTensorView dq_, MutableTensorView dk_, MutableTensorView dv_,
            MutableTensorView dbias_ = {}, MutableTensorView dsinks_ = {}, bool accumulate_ = false)
      : dq(dq_), dk(dk_), dv(dv_), dbias(dbias_), dsinks(dsinks_), accumulate(accumulate_) {}

  MutableTensorView dq;  // [B, Hq, Lq, D], q's dtype
  MutableTensorView dk;  // [B, Hkv, Lk, D], summed over the query heads sharing a kv head
  MutableTensorView dv;  // [B, Hkv, Lk, Dv]
  MutableTensorView
      dbias;  // optional: ∂L/∂bias, f32, the shape of mods.bias (broadcast axes summed)
  MutableTensorView dsinks;  // optional: ∂L/∂sinks, f32 [Hq]
  // optional: ∂L/∂ each float32 table of mods.program, in the program's table order (an empty
  // vector, or one view per table; null views for tables not wanted and for non-float tables),
  // f32, the table's sizes. Summed over every pair that reads the element.
  std::vector<MutableTensorView> dtables;
  // Add this call's gradients to what the views hold (split and ring backward passes sum over
  // key slices) instead of overwriting them. The call's own gradients are computed as without
  // it, then added in f32 (the views' dtype rounds the sum).
  bool accumulate = false;
};

// `out` and `lse` are what attention() returned for these inputs, mask and modifiers (the fused
// kernel recomputes P from them; the reference kernel recomputes everything in f64 and reads
// them only for their shapes). `dout` has out's shape and dtype. dq, dk and dv have q's dtype,
// or f32 for f16/bf16 inputs. Gradients are overwritten unless grads.accumulate. Bitwise
// identical for any thread count. A score_fn has no derivative: Error. With a frame (a slice of a
// larger problem), out and lse are the merged results of the slice's rows, dq/dk/dv the slice's
// rows, and dbias the gradient of the whole bias (zero outside the slice).
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& lse, const TensorView& dout,
                        const Gradients& grads, const Mask& mask = {}, const ScoreMods& mods = {},
                        const Options& options = {});

// The materialised softmax weights P [B, Hq, Lq, Lk] (f32), for inspection and heatmaps. Hidden
// pairs get exactly 0. Costs B·Hq·Lq·Lk floats: a debugging tool, not a compute path.
void attention_weights(const TensorView& q, const TensorView& k, const MutableTensorView& weights,
                       const Mask& mask = {}, const ScoreMods& mods = {},
                       const Options& options = {});

// The scores S [B, Hq, Lq, Lk] (f32) at one stage of the pipeline.
enum class ScoreStage : uint8_t {
  scaled,  // scale·Q·Kᵀ, nothing else
  final,   // after every modifier, with hidden pairs set to −inf: what enters the softmax
};
void attention_scores(const TensorView& q, const TensorView& k, const MutableTensorView& scores,
                      ScoreStage stage, const Mask& mask = {}, const ScoreMods& mods = {},
                      const Options& options = {});

// The mask alone, evaluated for a problem size: [B, Hq, Lq, Lk], 1 = allowed. Content-dependent
// parts (threshold, score_fn) are not part of a mask and are not shown; additive −inf entries hide.
// MaskShape is in mask.h.
Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape);
// The block map kernels use (docs/design.md §4): [B, Hq, ⌈Lq/tile_q⌉, ⌈Lk/tile_k⌉] with 0 = empty
// (skipped), 1 = full (no mask work), 2 = partial (element mask). The fused kernel uses 64 × 64.
Array<uint8_t> block_map(const Mask& mask, const MaskShape& shape, int64_t tile_q = 64,
                         int64_t tile_k = 64);

// Whether the mask allows at least one pair of the slice `frame` (mask.h) of a problem whose
// call would have `shape` (its own B, Hq, Lq, Lk). Exact, and O(tiles) for structured masks: the
// block map rules out empty tiles, and only partial tiles are looked into. A ring skips the slice
// pairs it says no to, their compute and their messages.
bool any_allowed(const Mask& mask, const MaskShape& shape, const Frame& frame = {});
// How many (b, h, i, j) pairs the mask allows in the same slice: exact, and O(tiles) in the same
// way (full tiles count whole, partial tiles by their element masks), where summing
// allowed_pairs() costs B·Hq·Lq·Lk. RingStats::allowed_pairs and the benchmarks count with it.
int64_t count_allowed(const Mask& mask, const MaskShape& shape, const Frame& frame = {});

// One sequence and query head of it: [Lq, Lk]. Costs Lq·Lk, whatever B and Hq are.
Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape, int64_t batch, int64_t head);

}  // namespace maskattn
