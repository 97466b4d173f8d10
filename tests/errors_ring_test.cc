// The bad-input catalogue's rows for ring attention (docs/errors.md E113–E119), compiled into the
// errors_test binary. The rows only MPI can show (E116–E118) run ring_mpi_test's tests of them
// under mpirun with two ranks; without MPI they are skipped.
#include <gtest/gtest.h>

#include <cstdlib>

#include "maskattn/ring.h"
#include "test_util.h"

namespace maskattn {
namespace {

using dist::Layout;
using dist::RingOptions;

struct Small {
  test::RandomProblem p{1, 2, 2, 10, 10, 16, 16, 5};
  std::vector<float> out = std::vector<float>(2 * 10 * 16), lse = std::vector<float>(2 * 10);
  MutableTensorView out_view() { return MutableTensorView(out.data(), {1, 2, 10, 16}); }
  MutableTensorView lse_view() { return MutableTensorView(lse.data(), {1, 2, 10}); }
};

TEST(Errors, E113_RingSplits) {
  EXPECT_MASKATTN_ERROR(dist::local_ranges(3, Layout::contiguous, 0, 4),
                        "local_ranges: a sequence of 3 rows cannot be split over 4 ranks");
  EXPECT_MASKATTN_ERROR(dist::local_ranges(5, Layout::zigzag, 1, 4),
                        "zigzag split of 5 rows into 8 chunks leaves rank 2 with no rows");
  EXPECT_MASKATTN_ERROR(dist::local_ranges(5, Layout::zigzag, 7, 4), "rank 7 is outside [0, 4)");
  Small s;
  EXPECT_MASKATTN_ERROR(dist::ring_emulation(0, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view()),
                        "world = 0");
  EXPECT_MASKATTN_ERROR(dist::ring_emulation(11, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view()),
                        "10 rows cannot be split over 11 ranks");
}

TEST(Errors, E114_RingOptions) {
  Small s;
  RingOptions options;
  options.base.frame = Frame{0, 0, 20, 20};
  EXPECT_MASKATTN_ERROR(
      dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(), {}, {}, options),
      "ring_emulation: options.base.frame must be the default");
  options = {};
  options.base.count_sinks = false;
  EXPECT_MASKATTN_ERROR(
      dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(), {}, {}, options),
      "count_sinks must be true");
  options = {};
  options.layout = static_cast<Layout>(7);
  EXPECT_MASKATTN_ERROR(
      dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(), {}, {}, options),
      "unknown layout 7");
}

TEST(Errors, E115_RingShards) {
  Small s;
  const MutableTensorView short_out(s.out.data(), {1, 2, 9, 16});
  EXPECT_MASKATTN_ERROR(dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), short_out),
                        "ring_emulation: out [1,2,9,16] holds 9 rows but this rank's query rows "
                        "are 10 rows");
  std::vector<uint16_t> half(s.out.size());
  const MutableTensorView bf16_out(half.data(), DType::bf16, {1, 2, 10, 16});
  EXPECT_MASKATTN_ERROR(dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), bf16_out),
                        "out has dtype bf16 but must be f32 (q's)");
  const MutableTensorView wide_lse(s.lse.data(), {1, 2, 5});
  EXPECT_MASKATTN_ERROR(
      dist::ring_emulation(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(), {}, {}, {}, wide_lse),
      "lse [1,2,5] must be [B,Hq,10]");
}

TEST(Errors, E119_RingBackwardInputs) {
  Small s;
  std::vector<float> dq(s.p.q.size()), dk(s.p.k.size()), dv(s.p.v.size());
  const Gradients grads{MutableTensorView(dq.data(), {1, 2, 10, 16}),
                        MutableTensorView(dk.data(), {1, 2, 10, 16}),
                        MutableTensorView(dv.data(), {1, 2, 10, 16}),
                        {},
                        {},
                        false};
  EXPECT_MASKATTN_ERROR(dist::ring_emulation_backward(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(),
                                                      {}, s.out_view(), grads),
                        "ring_emulation_backward: lse is required");
  Gradients short_dk = grads;
  short_dk.dk = MutableTensorView(dk.data(), {1, 2, 9, 16});
  EXPECT_MASKATTN_ERROR(dist::ring_emulation_backward(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(),
                                                      s.lse_view(), s.out_view(), short_dk),
                        "grads.dk is [1,2,9,16] f32; it must be [1,2,10,16] f32");
  Gradients with_dsinks = grads;
  std::vector<float> dsinks(2);
  with_dsinks.dsinks = MutableTensorView(dsinks.data(), {2});
  EXPECT_MASKATTN_ERROR(dist::ring_emulation_backward(2, s.p.qv(), s.p.kv(), s.p.vv(), s.out_view(),
                                                      s.lse_view(), s.out_view(), with_dsinks),
                        "grads.dsinks [2] must be f32 [Hq] and needs mods.sinks");
}

// E116–E118 need ranks: ring_mpi_test holds their tests; run them with two ranks.
void run_mpi_errors(const std::string& filter) {
#ifdef MASKATTN_RING_MPI_TEST
  const std::string command =
      "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ASAN_OPTIONS=detect_leaks=0 "
      "'" MASKATTN_MPIEXEC
      "' --allow-run-as-root --oversubscribe --bind-to none --mca btl "
      "self,vader -np 2 '" MASKATTN_RING_MPI_TEST "' --gtest_filter='" +
      filter + "' > /dev/null 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
#else
  (void)filter;
  GTEST_SKIP() << "built without MPI (MASKATTN_WITH_MPI=OFF)";
#endif
}

TEST(Errors, E116_RanksDisagree) {
  run_mpi_errors("RingMpi.E116_*");
}
TEST(Errors, E117_AnErrorOnOneRankFailsAll) {
  run_mpi_errors("RingMpi.E115_*:RingMpi.E117_*:RingMpi.E119_*");
}
TEST(Errors, E118_NoCommunicator) {
  run_mpi_errors("RingMpi.E118_*");
}

}  // namespace
}  // namespace maskattn
