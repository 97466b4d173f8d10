// Resource limits and concurrency: requests beyond the memory cap fail with an Error before
// allocating, and several threads calling the API at once get the same bits as serial calls.
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "test_util.h"

namespace maskattn {
namespace {

// Sets the cap for one test and restores the default afterwards.
class MemoryLimit {
 public:
  explicit MemoryLimit(int64_t bytes) { set_memory_limit(bytes); }
  ~MemoryLimit() { set_memory_limit(0); }
};

TEST(Memory, DefaultIsTheMachineAndHugeRequestsFailCleanly) {
  EXPECT_GT(memory_limit(), int64_t{1} << 26);
  // 2^44 pairs = 16 TiB of flags: an Error, not std::bad_alloc or the OOM killer.
  EXPECT_MASKATTN_ERROR(allowed_pairs(Mask().causal(), {1, 1, int64_t{1} << 22, int64_t{1} << 22}),
                        "allowed_pairs [1,1,4194304,4194304] needs 16.0 TiB of memory, more than "
                        "the memory limit of");
}

TEST(Memory, TheCapGuardsEveryKernel) {
  // f16 inputs: the fused forward converts K and V to f32 (2 MiB here), the fused backward Q, O
  // and dO; the reference needs little.
  const test::RandomProblem p(1, 8, 8, 256, 256, 64, 64, 3);
  const test::DTypeBuffer q(p.q, DType::f16), k(p.k, DType::f16), v(p.v, DType::f16);
  test::DTypeBuffer out(std::vector<float>(p.q.size()), DType::f16);
  std::vector<float> lse(8 * 256);
  const Dims shape = {1, 8, 256, 64};
  const MemoryLimit limit(1 << 20);
  EXPECT_EQ(memory_limit(), 1 << 20);
  EXPECT_MASKATTN_ERROR(
      attention(q.view(shape), k.view(shape), v.view(shape), out.mutable_view(shape)),
      "attention (fused kernel) for q [1,8,256,64], k [1,8,256,64] needs",
      "more than the memory limit of 1.0 MiB");
  Options reference;
  reference.kernel = Kernel::reference;
  attention(q.view(shape), k.view(shape), v.view(shape), out.mutable_view(shape), {}, {}, reference,
            MutableTensorView(lse.data(), {1, 8, 256}));
  test::DTypeBuffer dq(p.q, DType::f16), dk(p.k, DType::f16), dv(p.v, DType::f16);
  EXPECT_MASKATTN_ERROR(
      attention_backward(
          q.view(shape), k.view(shape), v.view(shape), out.view(shape),
          TensorView(lse.data(), {1, 8, 256}), out.view(shape),
          {dq.mutable_view(shape), dk.mutable_view(shape), dv.mutable_view(shape), {}, {}}),
      "attention_backward (fused kernel) for q [1,8,256,64], k [1,8,256,64] needs");
  set_memory_limit(1 << 10);
  EXPECT_MASKATTN_ERROR(attention(q.view(shape), k.view(shape), v.view(shape),
                                  out.mutable_view(shape), {}, {}, reference),
                        "the reference kernel for q [1,8,256,64], k [1,8,256,64] needs");
}

TEST(Memory, CliReportsTheCapAndBadLimits) {
  test::TempDir dir;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(512 * 4, 1), {512, 4}));
  const std::string q = dir.path("q.npy");
  const std::string attend = "attend --q " + q + " --k " + q + " --v " + q + " --out " +
                             dir.path("o.npy") + " --weights " + dir.path("p.npy");
  setenv("MASKATTN_MEMORY_LIMIT", "512K", 1);  // the kernel fits, the weights do not
  const test::CliResult capped = test::run_cli(attend);
  setenv("MASKATTN_MEMORY_LIMIT", "lots", 1);
  const test::CliResult bad = test::run_cli(attend);
  unsetenv("MASKATTN_MEMORY_LIMIT");
  EXPECT_EQ(capped.exit_code, 1);
  EXPECT_NE(capped.err.find("maskattn: error: a f32 tensor [1,1,512,512] needs 1.0 MiB of memory, "
                            "more than the memory limit of 512.0 KiB"),
            std::string::npos)
      << capped.err;
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("MASKATTN_MEMORY_LIMIT='lots' is not a size"), std::string::npos)
      << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path("o.npy")));
  EXPECT_EQ(test::run_cli(attend).exit_code, 0);
}

TEST(Memory, FormatBytes) {
  EXPECT_EQ(format_bytes(100), "100 bytes");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1 << 30)), "3.0 GiB");
}

// ---- concurrency ------------------------------------------------------------------------------

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
  bool operator==(const Outputs&) const = default;
};

// Forward and backward of one problem; `mask` may be shared with other threads (its scan cache
// is filled by whichever call needs it first).
Outputs run_all(const test::RandomProblem& p, const Mask& mask, Kernel kernel, int threads) {
  Options options;
  options.kernel = kernel;
  options.threads = threads;
  Outputs o;
  o.out.resize(p.B * p.Hq * p.Lq * p.Dv);
  o.lse.resize(p.B * p.Hq * p.Lq);
  o.dq.resize(p.q.size());
  o.dk.resize(p.k.size());
  o.dv.resize(p.v.size());
  const Dims out_shape = {p.B, p.Hq, p.Lq, p.Dv}, lse_shape = {p.B, p.Hq, p.Lq};
  attention(p.qv(), p.kv(), p.vv(), MutableTensorView(o.out.data(), out_shape), mask, {}, options,
            MutableTensorView(o.lse.data(), lse_shape));
  const std::vector<float> dout = test::random_values(o.out.size(), p.q.size());
  attention_backward(p.qv(), p.kv(), p.vv(), TensorView(o.out.data(), out_shape),
                     TensorView(o.lse.data(), lse_shape), TensorView(dout.data(), out_shape),
                     {MutableTensorView(o.dq.data(), p.qv().sizes()),
                      MutableTensorView(o.dk.data(), p.kv().sizes()),
                      MutableTensorView(o.dv.data(), p.vv().sizes()),
                      {},
                      {}},
                     mask, {}, options);
  return o;
}

TEST(Concurrency, ThreadsCallingAtOnceGetTheSerialBits) {
  // Four problems of different shapes, one mask object shared by all (a dense mask: its block
  // classification is cached inside the Mask on first use, from whichever thread comes first).
  std::vector<test::RandomProblem> problems = {{1, 4, 2, 130, 130, 32, 16, 1},
                                               {2, 2, 1, 130, 130, 64, 64, 2},
                                               {1, 8, 8, 130, 130, 16, 8, 3},
                                               {1, 2, 2, 130, 130, 8, 8, 4}};
  std::vector<uint8_t> keep(130 * 130);
  for (size_t n = 0; n < keep.size(); ++n) keep[n] = (n * 2654435761u >> 9) % 4 != 0;
  const Mask shared = Mask().causal().keep(Array<uint8_t>({130, 130}, keep));
  struct Job {
    size_t problem;
    Kernel kernel;
    int threads;
  };
  std::vector<Job> jobs;
  for (size_t n = 0; n < problems.size(); ++n) {
    jobs.push_back({n, Kernel::fused, 1 + static_cast<int>(n % 2)});
    jobs.push_back({n, Kernel::reference, 1});
  }
  std::vector<Outputs> serial;
  for (const Job& job : jobs) {
    serial.push_back(run_all(problems[job.problem], Mask(shared), job.kernel, job.threads));
  }
  for (int round = 0; round < 3; ++round) {
    const Mask fresh = Mask().causal().keep(Array<uint8_t>({130, 130}, keep));  // empty cache
    std::vector<Outputs> parallel(jobs.size());
    std::vector<std::thread> workers;
    for (size_t n = 0; n < jobs.size(); ++n) {
      workers.emplace_back([&, n] {
        parallel[n] = run_all(problems[jobs[n].problem], fresh, jobs[n].kernel, jobs[n].threads);
      });
    }
    for (std::thread& worker : workers) worker.join();
    for (size_t n = 0; n < jobs.size(); ++n) {
      EXPECT_TRUE(parallel[n] == serial[n]) << "job " << n << " round " << round;
    }
  }
}

}  // namespace
}  // namespace maskattn
