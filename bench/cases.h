// Benchmark cases shared by attention_bench (Google Benchmark) and attention_run (bench/compare):
// the shapes and masks of the benchmark targets (docs/benchmarks.md), with exact counts of allowed
// pairs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/maskattn.h"

namespace maskattn::bench {

struct Case {
  int64_t batch = 1, heads = 8, kv_heads = 8, q_len = 2048, k_len = 2048, dim = 64;
  std::string mask = "none";  // none | causal | window:W | padded (lengths spread over [L/4, L])
                              // | documents:N | documents-program:N (packed documents of N
                              // tokens + causal, as Mask::segments or as a mask program)
  std::string mods = "none";  // none | relative-program (s + rel[h, q − kv + Lk − 1], with the
                              // gradient of rel in the backward)
  DType dtype = DType::f32;
};

ScoreMods make_mods(const Case& c);

// The per-sequence lengths of the "padded" mask: evenly spread over [L/4, L].
std::vector<int64_t> padded_lengths(const Case& c);

Mask make_mask(const Case& c);

// Pairs the mask allows (B·H·Σ rows), and the dense equivalent B·H·Lq·Lk.
double allowed_pairs(const Case& c);
double dense_pairs(const Case& c);
// 2·(D + Dv) flops per pair (docs/design.md §6).
double flops_per_pair(const Case& c);

// Inputs and outputs of one case in its dtype, filled with reproducible values in [-1, 1).
class Tensors {
 public:
  explicit Tensors(const Case& c);
  void run(const Options& options);
  // The backward from dO: the first call runs the forward once for O and the LSE and allocates
  // dO and the gradients.
  void run_backward(const Options& options);
  double bytes() const;  // inputs + outputs (of the pass last run)

 private:
  Case case_;
  Mask mask_;
  ScoreMods mods_;
  std::vector<float> dtable_;  // the gradient of the score program's float table, if any
  std::vector<uint16_t> q_, k_, v_, out_;  // 16-bit types; f32 uses twice the elements
  std::vector<uint16_t> dout_, dq_, dk_, dv_;
  std::vector<float> lse_;
};

}  // namespace maskattn::bench
