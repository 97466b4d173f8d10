// Varlen (packed) attention against the padded batch call and a plain loop over the sequences.
//   varlen_run --sequences 64 --min 32 --max 512 --heads 8 --dim 64 --dtype f32 --threads 2
//              --mask causal --repeat 10 [--backward]
//
// A packed batch of --sequences causal self-attention sequences with lengths drawn uniformly in
// [--min, --max] (seeded, the same every run) is computed three ways, interleaved per repetition:
//
//   varlen   attention_varlen on the packed [total, H, D] tensors (its plan: long sequences alone
//            on every thread, the others side by side, one thread each);
//   padded   attention() on the batch padded to the longest sequence, [B, max, H, D], with the
//            mask's query and key lengths (what a caller without varlen runs);
//   loop     attention() on each sequence in turn, every call on every thread (what varlen would
//            be without its plan).
//
// --backward times the backward passes the same way (from each forward's own out and lse).
// Prints one line of key=value pairs per way: median_ms, min_ms, and the time relative to varlen;
// and the allowed pairs, so that GFLOP/s can be derived (4·(D+Dv)/2 flops per allowed pair, or
// 2·(D + Dv) forward).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "maskattn/maskattn.h"

namespace {

using maskattn::DType;
using maskattn::MutableTensorView;
using maskattn::TensorView;

struct Setup {
  int64_t heads = 8, dim = 64;
  DType dtype = DType::f32;
  maskattn::Varlen varlen;
  std::vector<int64_t> lengths;
  int64_t total = 0, longest = 0;
};

// Buffers of `count` elements of the setup's dtype, filled with small random values.
std::vector<uint16_t> random_buffer(int64_t count, DType dtype, uint32_t seed) {
  std::vector<uint16_t> words(count * (dtype == DType::f32 ? 2 : 1));
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int64_t n = 0; n < count; ++n) {
    const float x = value(generator);
    if (dtype == DType::f32) {
      std::memcpy(words.data() + 2 * n, &x, 4);
    } else {
      uint32_t bits = 0;
      std::memcpy(&bits, &x, 4);
      words[n] = static_cast<uint16_t>(bits >> 16);  // a bf16 (f16 inputs: any bits are fine)
      if (dtype == DType::f16) words[n] &= 0x3BFF;   // finite, below 1
    }
  }
  return words;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Way {
  std::string name;
  std::function<void()> run;
  std::vector<double> ms;
};

void time_ways(std::vector<Way>& ways, int repeat) {
  for (Way& way : ways) way.run();  // warm-up: buffers, scratch, page faults
  for (int r = 0; r < repeat; ++r) {
    for (Way& way : ways) {
      const auto start = std::chrono::steady_clock::now();
      way.run();
      way.ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
}

// Packed and padded copies of the same q, k, v, dout (padded rows hold the packed rows, zeros
// after), every output, and the views the three ways pass.
struct Run {
  const Setup& s;
  int64_t H, D, T, B, L;
  size_t half_words;  // uint16 words per element
  std::vector<uint16_t> q, k, v, dout, pq, pk, pv, pdout, out, pout, dq, dk, dv, pdq, pdk, pdv;
  std::vector<float> lse, plse;
  maskattn::Options options;
  maskattn::Mask causal = maskattn::Mask().causal();
  maskattn::Mask padded_mask;

  Run(const Setup& setup, int threads)
      : s(setup),
        H(s.heads),
        D(s.dim),
        T(s.total),
        B(static_cast<int64_t>(s.lengths.size())),
        L(s.longest),
        half_words(maskattn::dtype_size(s.dtype) / 2) {
    q = random_buffer(T * H * D, s.dtype, 1);
    k = random_buffer(T * H * D, s.dtype, 2);
    v = random_buffer(T * H * D, s.dtype, 3);
    dout = random_buffer(T * H * D, s.dtype, 4);
    pq = padded_copy(q), pk = padded_copy(k), pv = padded_copy(v), pdout = padded_copy(dout);
    out = dq = dk = dv = std::vector<uint16_t>(q.size());
    pout = pdq = pdk = pdv = std::vector<uint16_t>(pq.size());
    lse.resize(H * T);
    plse.resize(B * H * L);
    options.threads = threads;
    padded_mask = maskattn::Mask().causal().query_lengths(s.lengths).key_lengths(s.lengths);
  }

  std::vector<uint16_t> padded_copy(const std::vector<uint16_t>& packed_values) const {
    std::vector<uint16_t> padded(B * L * H * D * half_words);
    for (int64_t i = 0; i < B; ++i) {
      std::copy_n(packed_values.begin() + s.varlen.cu_seqlens_q[i] * H * D * half_words,
                  s.lengths[i] * H * D * half_words, padded.begin() + i * L * H * D * half_words);
    }
    return padded;
  }
  TensorView packed(const std::vector<uint16_t>& t) const {
    return TensorView(t.data(), s.dtype, {T, H, D});
  }
  MutableTensorView packed(std::vector<uint16_t>& t) const {
    return MutableTensorView(t.data(), s.dtype, {T, H, D});
  }
  TensorView padded(const std::vector<uint16_t>& t) const {
    return TensorView(t.data(), s.dtype, {B, H, L, D}, {L * H * D, D, H * D, 1});
  }
  MutableTensorView padded(std::vector<uint16_t>& t) const {
    return MutableTensorView(t.data(), s.dtype, {B, H, L, D}, {L * H * D, D, H * D, 1});
  }
  MutableTensorView sequence(const std::vector<uint16_t>& t, int64_t i) const {
    auto* base = const_cast<uint16_t*>(t.data()) + s.varlen.cu_seqlens_q[i] * H * D * half_words;
    return MutableTensorView(base, s.dtype, {1, H, s.lengths[i], D}, {0, D, H * D, 1});
  }
  MutableTensorView lse_of(int64_t i) {
    return MutableTensorView(lse.data() + s.varlen.cu_seqlens_q[i], {1, H, s.lengths[i]},
                             {0, T, 1});
  }
  MutableTensorView lse_view() { return MutableTensorView(lse.data(), {H, T}); }
  MutableTensorView plse_view() { return MutableTensorView(plse.data(), {B, H, L}); }

  std::vector<Way> forward_ways() {
    return {
        {"varlen",
         [this] {
           maskattn::attention_varlen(packed(q), packed(k), packed(v), packed(out), s.varlen,
                                      causal, {}, options, lse_view());
         },
         {}},
        {"padded",
         [this] {
           maskattn::attention(padded(pq), padded(pk), padded(pv), padded(pout), padded_mask, {},
                               options, plse_view());
         },
         {}},
        {"loop",
         [this] {
           for (int64_t i = 0; i < B; ++i) {
             maskattn::attention(sequence(q, i), sequence(k, i), sequence(v, i), sequence(out, i),
                                 causal, {}, options, lse_of(i));
           }
         },
         {}},
    };
  }

  std::vector<Way> backward_ways() {
    for (Way& way : forward_ways()) way.run();  // the forwards' out and lse, once
    using maskattn::Gradients;
    return {
        {"varlen",
         [this] {
           maskattn::attention_varlen_backward(
               packed(q), packed(k), packed(v), packed(out), lse_view(), packed(dout), s.varlen,
               Gradients(packed(dq), packed(dk), packed(dv)), causal, {}, options);
         },
         {}},
        {"padded",
         [this] {
           maskattn::attention_backward(
               padded(pq), padded(pk), padded(pv), padded(pout), plse_view(), padded(pdout),
               Gradients(padded(pdq), padded(pdk), padded(pdv)), padded_mask, {}, options);
         },
         {}},
        {"loop",
         [this] {
           for (int64_t i = 0; i < B; ++i) {
             maskattn::attention_backward(
                 sequence(q, i), sequence(k, i), sequence(v, i), sequence(out, i), lse_of(i),
                 sequence(dout, i), Gradients(sequence(dq, i), sequence(dk, i), sequence(dv, i)),
                 causal, {}, options);
           }
         },
         {}},
    };
  }
};

Setup make_setup(int64_t sequences, int64_t shortest, int64_t longest) {
  Setup s;
  std::mt19937 generator(7);
  std::uniform_int_distribution<int64_t> length(shortest, longest);
  s.varlen.cu_seqlens_q = {0};
  for (int64_t i = 0; i < sequences; ++i) {
    s.lengths.push_back(length(generator));
    s.varlen.cu_seqlens_q.push_back(s.varlen.cu_seqlens_q.back() + s.lengths.back());
    s.longest = std::max(s.longest, s.lengths.back());
  }
  s.varlen.cu_seqlens_k = s.varlen.cu_seqlens_q;
  s.varlen.max_seqlen_q = s.varlen.max_seqlen_k = s.longest;
  s.total = s.varlen.cu_seqlens_q.back();
  return s;
}

void report(const Setup& s, const std::vector<Way>& ways, bool backward, int threads,
            const std::string& dtype_text) {
  int64_t pairs = 0;
  for (int64_t length_i : s.lengths) pairs += s.heads * length_i * (length_i + 1) / 2;
  std::printf(
      "sequences=%zu lengths=[%lld,%lld] total=%lld heads=%lld dim=%lld dtype=%s "
      "threads=%d pass=%s allowed_pairs=%lld\n",
      s.lengths.size(),
      static_cast<long long>(*std::min_element(s.lengths.begin(), s.lengths.end())),
      static_cast<long long>(s.longest), static_cast<long long>(s.total),
      static_cast<long long>(s.heads), static_cast<long long>(s.dim), dtype_text.c_str(), threads,
      backward ? "backward" : "forward", static_cast<long long>(pairs));
  const double reference = median(ways[0].ms);
  for (const Way& way : ways) {
    const double m = median(way.ms);
    const double flops = (backward ? 5.0 : 2.0) * 2.0 * static_cast<double>(s.dim) * pairs;
    std::printf("way=%s median_ms=%.3f min_ms=%.3f vs_varlen=%.2f gflops=%.1f\n", way.name.c_str(),
                m, *std::min_element(way.ms.begin(), way.ms.end()), m / reference, flops / m / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("varlen attention against the padded batch and a loop over the sequences");
  int64_t sequences = 64, shortest = 32, longest = 512, heads = 8, dim = 64;
  int threads = 2, repeat = 10;
  std::string dtype_text = "f32";
  bool backward = false;
  app.add_option("--sequences", sequences);
  app.add_option("--min", shortest);
  app.add_option("--max", longest);
  app.add_option("--heads", heads);
  app.add_option("--dim", dim);
  app.add_option("--dtype", dtype_text);
  app.add_option("--threads", threads);
  app.add_option("--repeat", repeat);
  app.add_flag("--backward", backward);
  CLI11_PARSE(app, argc, argv);
  Setup s = make_setup(sequences, shortest, longest);
  s.heads = heads;
  s.dim = dim;
  s.dtype = maskattn::parse_dtype(dtype_text, "--dtype");
  Run run(s, threads);
  std::vector<Way> ways = backward ? run.backward_ways() : run.forward_ways();
  time_ways(ways, repeat);
  report(s, ways, backward, threads, dtype_text);
  return 0;
}
