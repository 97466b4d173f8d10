// dist::ring_attention / ring_attention_backward under mpirun (tests/CMakeLists.txt starts this
// binary with -np 1, 2, 3 and 4). Every rank builds the same global problem from a seed, runs the
// emulator for the whole world, and checks its own rows of the MPI results bitwise against it;
// with one rank, also bitwise against attention()/attention_backward(). Bad input on one rank
// must fail every rank with the same Error (docs/errors.md E113–E119).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>

#include "maskattn/dist/ring_mpi.h"
#include "ring_cases.h"
#include "test_util.h"

namespace maskattn::test {
namespace {

using dist::Layout;
using dist::RingOptions;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The rows `ranges` of a global [B, H, L, X] (or [B, H, L]) buffer, stacked: a rank's shard.
OutBuffer stacked_rows(const TensorView& global, const std::vector<dist::RowRange>& ranges) {
  Dims dims = global.sizes();
  int64_t rows = 0;
  for (const auto& r : ranges) rows += r.size();
  dims[2] = rows;
  OutBuffer out(global.dtype(), dims);
  const size_t element = dtype_size(global.dtype());
  const int64_t inner = global.rank() == 4 ? global.size(3) : 1;
  auto* dst = reinterpret_cast<char*>(out.words.data());
  for (int64_t b = 0; b < global.size(0); ++b) {
    for (int64_t h = 0; h < global.size(1); ++h) {
      for (const auto& r : ranges) {
        const int64_t first =
            b * global.stride(0) + h * global.stride(1) + r.first * global.stride(2);
        const size_t bytes = static_cast<size_t>(r.size() * inner) * element;
        std::memcpy(dst, static_cast<const char*>(global.data()) + first * element, bytes);
        dst += bytes;
      }
    }
  }
  return out;
}

TensorView view_of(const OutBuffer& b) {
  return TensorView(b.words.data(), b.dtype, b.dims);
}

struct Shards {
  OutBuffer q, k, v, dout;
  Shards(const RingProblem& p, Layout layout)
      : q(stacked_rows(p.q(), ranges(p.c.q_len, layout))),
        k(stacked_rows(p.k(), ranges(p.c.k_len, layout))),
        v(stacked_rows(p.v(), ranges(p.c.k_len, layout))),
        dout(stacked_rows(p.dout(), ranges(p.c.q_len, layout))) {}
  static std::vector<dist::RowRange> ranges(int64_t n, Layout layout) {
    return dist::local_ranges(n, layout, world_rank(), world_size());
  }
};

using Whole = test::RingResults;

void check_case(const RingCase& c, Layout layout) {
  const int world = world_size();
  const RingProblem p(c, 21);
  const std::string what = c.name + (layout == Layout::zigzag ? " zigzag" : " contiguous") +
                           " on rank " + std::to_string(world_rank()) + " of " +
                           std::to_string(world);
  RingOptions options;
  options.layout = layout;
  options.base.threads = 1;
  options.base.dropout = c.dropout;
  options.count_allowed_pairs = true;

  // The oracle: the emulator (and with one rank, the plain calls).
  Whole want(p);
  std::vector<dist::RingStats> want_stats, want_backward_stats;
  if (world == 1) {
    attention(p.q(), p.k(), p.v(), want.out.view(), c.mask, c.mods, options.base, want.lse.view());
  } else {
    dist::ring_emulation(world, p.q(), p.k(), p.v(), want.out.view(), c.mask, c.mods, options,
                         want.lse.view(), &want_stats);
  }
  Gradients want_grads = want.grads(c);
  if (world == 1) {
    attention_backward(p.q(), p.k(), p.v(), want.out.view(), want.lse.view(), p.dout(), want_grads,
                       c.mask, c.mods, options.base);
  } else {
    dist::ring_emulation_backward(world, p.q(), p.k(), p.v(), want.out.view(), want.lse.view(),
                                  p.dout(), want_grads, c.mask, c.mods, options,
                                  &want_backward_stats);
  }

  // The ring, on this rank's shards.
  const Shards shards(p, layout);
  const auto q_rows = Shards::ranges(c.q_len, layout), k_rows = Shards::ranges(c.k_len, layout);
  OutBuffer out(c.dtype, shards.q.dims);
  out.dims[3] = c.value_dim;
  out.words.resize(out.words.size() / c.head_dim * c.value_dim);
  OutBuffer lse(DType::f32, {c.batch, c.q_heads, shards.q.dims[2]});
  dist::RingStats stats;
  dist::ring_attention(MPI_COMM_WORLD, c.q_len, c.k_len, view_of(shards.q), view_of(shards.k),
                       view_of(shards.v), out.view(), c.mask, c.mods, options, lse.view(), &stats);
  EXPECT_TRUE(out.same_bits(stacked_rows(view_of(want.out), q_rows))) << what << " out";
  EXPECT_TRUE(lse.same_bits(stacked_rows(view_of(want.lse), q_rows))) << what << " lse";
  if (world > 1) {
    EXPECT_EQ(stats.bytes_sent, want_stats[world_rank()].bytes_sent) << what;
    EXPECT_EQ(stats.pairs_computed, want_stats[world_rank()].pairs_computed) << what;
    EXPECT_EQ(stats.allowed_pairs, want_stats[world_rank()].allowed_pairs) << what;
  }

  Whole got(p);
  OutBuffer dq(c.dtype, shards.q.dims), dk(c.dtype, shards.k.dims), dv(c.dtype, shards.v.dims);
  dist::ring_attention_backward(MPI_COMM_WORLD, c.q_len, c.k_len, view_of(shards.q),
                                view_of(shards.k), view_of(shards.v), view_of(out), view_of(lse),
                                view_of(shards.dout), got.grads(c, dq, dk, dv), c.mask, c.mods,
                                options, &stats);
  if (world > 1) {
    EXPECT_EQ(stats.bytes_sent, want_backward_stats[world_rank()].bytes_sent) << what;
    EXPECT_EQ(stats.pairs_computed, want_backward_stats[world_rank()].pairs_computed) << what;
  }
  EXPECT_TRUE(dq.same_bits(stacked_rows(view_of(want.dq), q_rows))) << what << " dq";
  EXPECT_TRUE(dk.same_bits(stacked_rows(view_of(want.dk), k_rows))) << what << " dk";
  EXPECT_TRUE(dv.same_bits(stacked_rows(view_of(want.dv), k_rows))) << what << " dv";
  if (!c.mods.sinks.empty()) {
    EXPECT_TRUE(got.dsinks.same_bits(want.dsinks)) << what << " dsinks";
  }
  if (c.mods.bias) {
    EXPECT_TRUE(got.dbias.same_bits(want.dbias)) << what << " dbias";
  }
}

TEST(RingMpi, EveryCaseIsBitwiseTheEmulator) {
  for (const RingCase& c : ring_cases(true)) {
    for (const Layout layout : {Layout::zigzag, Layout::contiguous}) {
      try {
        check_case(c, layout);
      } catch (const std::exception& e) {  // name the case, and go on with the others
        ADD_FAILURE() << c.name << ": " << e.what();
      }
    }
  }
}

// ---- errors: every rank throws the same Error ------------------------------------------------

// Runs `call` on every rank, expects an Error on every rank, and checks that all ranks got the
// same message containing `parts`.
void expect_same_error_everywhere(const std::function<void()>& call,
                                  const std::vector<std::string>& parts) {
  std::string message;
  try {
    call();
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const Error& e) {
    message = e.what();
  }
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message: " << message << "\nmissing " << part;
  // Same message on every rank: compare with rank 0's.
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string first(static_cast<size_t>(length), ' ');
  if (world_rank() == 0) first = message;
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message, first) << "rank " << world_rank();
}

struct ErrorSetup {
  RingCase c;
  RingProblem p;
  Shards shards;
  OutBuffer out, lse;
  ErrorSetup()
      : c(ring_cases(true)[1]),
        p(c, 31),
        shards(p, Layout::zigzag),
        out(c.dtype, {c.batch, c.q_heads, shards.q.dims[2], c.value_dim}),
        lse(DType::f32, {c.batch, c.q_heads, shards.q.dims[2]}) {}
};

TEST(RingMpi, E113_TooFewRowsFailsEveryRank) {
  ErrorSetup s;
  const int world = world_size();
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> q(static_cast<size_t>(s.c.q_heads * s.c.head_dim)), out(q.size());
  const TensorView q1(q.data(), {1, s.c.q_heads, 1, s.c.head_dim});
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention(MPI_COMM_WORLD, 1, s.c.k_len, q1, view_of(s.shards.k),
                             view_of(s.shards.v), MutableTensorView(out.data(), q1.sizes()),
                             s.c.mask);
      },
      {"ring_attention: rank 0 of", "1 rows cannot be split over"});
}

TEST(RingMpi, E115_AShardOfTheWrongSizeOnOneRankFailsEveryRank) {
  ErrorSetup s;
  const int world = world_size(), bad = world - 1;
  // The last rank passes one query row too few.
  TensorView q = view_of(s.shards.q);
  MutableTensorView out = s.out.view();
  if (world_rank() == bad) {
    Dims dims = q.sizes();
    dims[2] -= 1;
    q = TensorView(q.data(), q.dtype(), dims);
    Dims out_dims = out.sizes();
    out_dims[2] -= 1;
    out = MutableTensorView(out.mutable_data(), out.dtype(), out_dims);
  }
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention(MPI_COMM_WORLD, s.c.q_len, s.c.k_len, q, view_of(s.shards.k),
                             view_of(s.shards.v), out, s.c.mask, s.c.mods);
      },
      {"rank " + std::to_string(bad) + " of " + std::to_string(world), "q [",
       "but this rank's query rows are"});
}

TEST(RingMpi, E116_RanksThatDisagreeOnTheProblemFailEveryRank) {
  ErrorSetup s;
  const int world = world_size();
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  RingOptions options;
  options.layout = world_rank() == 1 ? Layout::contiguous : Layout::zigzag;
  // Rank 1's shards are cut for zigzag but it says contiguous: a rows error or a parameter error,
  // whichever the lowest failing rank meets first; here rank 1 also differs from rank 0.
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention(MPI_COMM_WORLD, s.c.q_len, s.c.k_len, view_of(s.shards.q),
                             view_of(s.shards.k), view_of(s.shards.v), s.out.view(), s.c.mask,
                             s.c.mods, options);
      },
      {"rank 1 of"});
  options.layout = Layout::zigzag;
  ScoreMods mods = s.c.mods;
  if (world_rank() == 1) mods.sinks.assign(static_cast<size_t>(s.c.q_heads), 0.5f);
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention(MPI_COMM_WORLD, s.c.q_len, s.c.k_len, view_of(s.shards.q),
                             view_of(s.shards.k), view_of(s.shards.v), s.out.view(), s.c.mask, mods,
                             options);
      },
      {"rank 1 of", "sinks = ", "differs from rank 0's 0", "same global problem"});
}

TEST(RingMpi, E117_ANaNFoundMidRingFailsEveryRank) {
  ErrorSetup s;
  const int world = world_size(), bad = world - 1;
  RingProblem p(s.c, 41);
  Shards shards(p, Layout::zigzag);
  if (world_rank() == bad) {  // a NaN in the last key row of the last rank: found mid-ring
    float nan = NAN;
    const size_t last = shards.k.words.size() - 1;
    std::memcpy(&shards.k.words[last], &nan, 4);
  }
  RingOptions options;
  options.base.check_finite = true;
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention(MPI_COMM_WORLD, s.c.q_len, s.c.k_len, view_of(shards.q),
                             view_of(shards.k), view_of(shards.v), s.out.view(), {}, {}, options);
      },
      {"ring_attention: rank "});
}

TEST(RingMpi, E118_NoCommunicator) {
  ErrorSetup s;
  EXPECT_MASKATTN_ERROR(
      dist::ring_attention(MPI_COMM_NULL, s.c.q_len, s.c.k_len, view_of(s.shards.q),
                           view_of(s.shards.k), view_of(s.shards.v), s.out.view()),
      "ring_attention: comm is MPI_COMM_NULL");
}

TEST(RingMpi, E119_ABackwardWithoutLseOnOneRankFailsEveryRank) {
  ErrorSetup s;
  const int world = world_size(), bad = world - 1;
  OutBuffer dq(s.c.dtype, s.shards.q.dims), dk(s.c.dtype, s.shards.k.dims),
      dv(s.c.dtype, s.shards.v.dims);
  const TensorView lse = world_rank() == bad ? TensorView() : view_of(s.lse);
  expect_same_error_everywhere(
      [&] {
        dist::ring_attention_backward(
            MPI_COMM_WORLD, s.c.q_len, s.c.k_len, view_of(s.shards.q), view_of(s.shards.k),
            view_of(s.shards.v), view_of(s.out), lse, view_of(s.out),
            {dq.view(), dk.view(), dv.view(), {}, {}, false}, s.c.mask, s.c.mods);
      },
      {"rank " + std::to_string(bad), "lse is required"});
}

}  // namespace
}  // namespace maskattn::test

// MPI around GoogleTest: every rank runs every test; the exit code is non-zero when any rank
// failed, so mpirun (and ctest) fail. --thread-single initialises MPI without thread support, to
// test the ring's fallback (compute, then wait).
int main(int argc, char** argv) {
  int required = MPI_THREAD_FUNNELED, provided = 0;
  for (int n = 1; n < argc; ++n) {
    if (std::string(argv[n]) == "--thread-single") required = MPI_THREAD_SINGLE;
  }
  MPI_Init_thread(&argc, &argv, required, &provided);
  testing::InitGoogleTest(&argc, argv);
  const int local = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
