// Micro-benchmark of the program tile evaluator (maskattn/program.h): nanoseconds per full 64 × 64
// tile, one thread. The consumer that matters most is the block-map scan, which calls mask_tile on
// every 64 × 64 tile of an L × L problem (a million tiles at L = 65536), so each benchmark walks
// the tiles of an L = 4096 problem in turn (tables read at moving offsets, as in the scan) rather
// than timing one tile over and over.
//
//   build/release/bench/program_tiles --benchmark_repetitions=5 --benchmark_report_aggregates_only
//
// reports the mean, median and spread per case; the time per iteration is the time per tile.
// Score tiles are mapped in place again and again: the programs and tables are chosen so that the
// scores stay finite and away from subnormals (g[h] = ±1, tanh's fixed points, a small bias).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/program.h"

namespace {

using maskattn::Program;
using maskattn::ProgramTable;

constexpr int64_t kLength = 4096;
constexpr int64_t kTile = 64;
constexpr int64_t kTiles = kLength / kTile;
constexpr int64_t kHeads = 8;

// Documents of 300 to 1100 tokens, as a packed training batch has.
std::vector<int64_t> document_ids() {
  std::vector<int64_t> doc(kLength);
  int64_t id = 0;
  int64_t left = 300;
  for (int64_t i = 0; i < kLength; ++i) {
    if (left-- == 0) {
      ++id;
      left = 300 + (id * 397) % 800;
    }
    doc[i] = id;
  }
  return doc;
}

// The tile after `tile`: row-major over the (query tile, key tile) grid, heads in turn.
struct Walk {
  int64_t tile = 0;
  void next(int64_t& h, int64_t& q0, int64_t& kv0) {
    tile = (tile + 1) % (kTiles * kTiles * kHeads);
    h = tile / (kTiles * kTiles);
    q0 = (tile / kTiles) % kTiles * kTile;
    kv0 = tile % kTiles * kTile;
  }
};

void run_mask(benchmark::State& state, const Program& program) {
  uint64_t bits[kTile];
  Walk walk;
  int64_t h = 0, q0 = 0, kv0 = 0;
  for (auto _ : state) {
    walk.next(h, q0, kv0);
    program.mask_tile(0, h, q0, kTile, kv0, kTile, bits);
    benchmark::DoNotOptimize(bits);
  }
}

void run_score(benchmark::State& state, const Program& program, bool query_rows) {
  std::vector<float> s(kTile * kTile);
  for (size_t k = 0; k < s.size(); ++k) s[k] = std::sin(static_cast<float>(k)) * 8.0f;
  Walk walk;
  maskattn::ProgramTile tile;
  tile.nq = tile.nk = kTile;
  tile.query_rows = query_rows;
  for (auto _ : state) {
    walk.next(tile.h, tile.q0, tile.kv0);
    program.score_tile(tile, s.data());
    benchmark::DoNotOptimize(s.data());
  }
}

// The backward of a score tile (query rows, the backward kernel's layout), with the gradient of
// its float32 tables accumulated.
void run_backward(benchmark::State& state, const Program& program, int64_t table_elements) {
  std::vector<float> s(kTile * kTile), ds(kTile * kTile);
  for (size_t k = 0; k < s.size(); ++k) s[k] = std::sin(static_cast<float>(k)) * 8.0f;
  std::vector<double> grad(table_elements, 0.0);
  double* const grads[1] = {grad.data()};
  Walk walk;
  maskattn::ProgramTile tile;
  tile.nq = tile.nk = kTile;
  tile.query_rows = true;
  for (auto _ : state) {
    walk.next(tile.h, tile.q0, tile.kv0);
    for (size_t k = 0; k < ds.size(); ++k) ds[k] = 1.0f;
    program.score_tile_backward(tile, s.data(), ds.data(), grads);
    benchmark::DoNotOptimize(ds.data());
  }
}

void register_all() {
  static const std::vector<int64_t> doc = document_ids();
  static std::vector<float> rel(kHeads * (2 * kLength - 1));
  for (size_t k = 0; k < rel.size(); ++k) rel[k] = 1e-3f * std::cos(static_cast<float>(k));
  static const std::vector<float> gate = {1, -1, 1, -1, 1, -1, 1, -1};
  const auto doc_table = ProgramTable::borrow("doc", doc.data(), {kLength});
  const auto rel_table = ProgramTable::borrow("rel", rel.data(), {kHeads, 2 * kLength - 1});
  const auto gate_table = ProgramTable::borrow("g", gate.data(), {kHeads});

  const auto add_mask = [](const char* name, Program program) {
    benchmark::RegisterBenchmark(name, run_mask, program)->Unit(benchmark::kNanosecond);
  };
  add_mask("mask/document_causal", Program::mask("(doc[q] == doc[kv]) & (q >= kv)", {doc_table}));
  // Documents of 3 tokens: every third key starts a new one, so no row's word repeats.
  static std::vector<int64_t> short_docs(kLength);
  for (int64_t i = 0; i < kLength; ++i) short_docs[i] = i / 3;
  add_mask("mask/document_causal/3_token_documents",
           Program::mask("(doc[q] == doc[kv]) & (q >= kv)",
                         {ProgramTable::borrow("doc", short_docs.data(), {kLength})}));
  add_mask("mask/causal", Program::mask("q >= kv"));
  add_mask("mask/window256", Program::mask("(q - kv >= 0) & (q - kv < 256)"));

  const auto add_score = [](const std::string& name, Program program) {
    for (const bool query_rows : {false, true}) {
      benchmark::RegisterBenchmark((name + (query_rows ? "/query_rows" : "/key_rows")).c_str(),
                                   run_score, program, query_rows)
          ->Unit(benchmark::kNanosecond);
    }
  };
  add_score("score/relative_bias", Program::score("s + rel[h, q - kv + 4095]", {rel_table}));
  add_score("score/softcap", Program::score("30.0 * tanh(s / 30.0)"));
  add_score("score/gate", Program::score("s * g[h]", {gate_table}));
  add_score("score/alibi", Program::score("s - g[h] * abs(q - kv)", {gate_table}));
  benchmark::RegisterBenchmark("backward/relative_bias/query_rows", run_backward,
                               Program::score("s + rel[h, q - kv + 4095]", {rel_table}),
                               static_cast<int64_t>(rel.size()))
      ->Unit(benchmark::kNanosecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
