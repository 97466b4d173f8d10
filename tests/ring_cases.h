// The problems the ring is tested on (emulator and MPI): every mask kind of issue 16, with
// modifiers, GQA, Lq ≠ Lk and lengths no rank count divides, in f32 and bf16; and the inputs of
// one problem, built identically by every rank from a seed.
#pragma once

#include <string>
#include <vector>

#include "maskattn/maskattn.h"
#include "maskattn/ring.h"

namespace maskattn::test {

struct RingCase {
  std::string name;
  int64_t batch = 1, q_heads = 2, kv_heads = 2, q_len = 0, k_len = 0, head_dim = 16, value_dim = 16;
  Mask mask;
  ScoreMods mods;
  DType dtype = DType::f32;
  Dropout dropout;  // Options::dropout of every call (the single call's and the ring's)
};

// Every case; `quick` keeps a subset with each mask kind once (for the MPI runs, where 4 ranks
// share 2 cores).
std::vector<RingCase> ring_cases(bool quick);

// Global inputs of a case in its dtype (raw words), f32 outputs sized for it.
struct RingProblem {
  RingCase c;
  std::vector<uint16_t> q16, k16, v16, dout16;  // bf16 bits when c.dtype == bf16
  std::vector<float> q32, k32, v32, dout32;     // f32 when c.dtype == f32
  explicit RingProblem(const RingCase& ring_case, uint64_t seed);
  TensorView q() const;
  TensorView k() const;
  TensorView v() const;
  TensorView dout() const;
  Dims q_dims() const { return {c.batch, c.q_heads, c.q_len, c.head_dim}; }
  Dims k_dims() const { return {c.batch, c.kv_heads, c.k_len, c.head_dim}; }
  Dims v_dims() const { return {c.batch, c.kv_heads, c.k_len, c.value_dim}; }
  Dims out_dims() const { return {c.batch, c.q_heads, c.q_len, c.value_dim}; }
};

// An output buffer of a dtype: raw words, viewable as that dtype.
struct OutBuffer {
  DType dtype;
  Dims dims;
  std::vector<uint32_t> words;
  OutBuffer(DType type, Dims sizes);
  MutableTensorView view() { return MutableTensorView(words.data(), dtype, dims); }
  std::vector<float> floats() const;
  bool same_bits(const OutBuffer& other) const;
};

// A case's results: out, dq, dk, dv in its dtype; lse, dsinks, dbias in f32.
struct RingResults {
  OutBuffer out, lse, dq, dk, dv, dsinks, dbias;
  explicit RingResults(const RingProblem& p);
  // dq, dk and dv into `dq`, `dk`, `dv` (default: this result's own), dsinks and dbias when the
  // case has sinks or a bias. A bias gradient is added into zeros (accumulate): the ring sums it
  // over ranks, and the single call must round it the same way.
  Gradients grads(const RingCase& c, OutBuffer& into_dq, OutBuffer& into_dk, OutBuffer& into_dv);
  Gradients grads(const RingCase& c) { return grads(c, dq, dk, dv); }
};

}  // namespace maskattn::test
