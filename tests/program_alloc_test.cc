// Evaluating a program tile allocates nothing once the thread's workspace has grown
// (maskattn/program.h: mask_tile and score_tile run in kernels, a million tiles per block-map
// scan). This binary replaces the global operator new to count allocations, which is why it is a
// test binary of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "maskattn/program.h"

namespace {
std::atomic<int64_t> allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace maskattn {
namespace {

TEST(ProgramAllocations, TilesAllocateNothingAfterTheFirst) {
  std::vector<int64_t> doc(256, 0);
  for (size_t k = 100; k < doc.size(); ++k) doc[k] = 1;
  std::vector<float> rel(4 * 255, 0.25f);
  const Program mask = Program::mask("(doc[q] == doc[kv]) & (q >= kv) & (q - kv < 100)",
                                     {ProgramTable::borrow("doc", doc.data(), {256})});
  const Program score = Program::score("where(s > 0, s, 0.5 * s) + rel[h, q - kv + 127]",
                                       {ProgramTable::borrow("rel", rel.data(), {4, 255})});
  uint64_t bits[64];
  std::vector<float> s(64 * 64, 1.0f), ds(64 * 64, 1.0f);
  std::vector<double> grad(rel.size(), 0.0);
  double* const grads[1] = {grad.data()};
  const ProgramTile key_rows{0, 1, 64, 64, 0, 64, false, 0};
  const ProgramTile query_rows{0, 1, 128, 64, 64, 64, true, 0};
  // The first calls grow this thread's workspace.
  mask.mask_tile(0, 0, 0, 64, 0, 64, bits);
  score.score_tile(key_rows, s.data());
  score.score_tile_backward(query_rows, s.data(), ds.data(), grads);
  const int64_t before = allocations.load();
  for (int64_t tile = 0; tile < 16; ++tile) {
    mask.mask_tile(0, 0, tile % 4 * 64, 64, tile / 4 * 64, 64, bits);
    score.score_tile(key_rows, s.data());
    score.score_tile(query_rows, s.data());
    score.score_tile_backward(query_rows, s.data(), ds.data(), grads);
  }
  EXPECT_EQ(allocations.load() - before, 0);
}

}  // namespace
}  // namespace maskattn
