// maskattn attend --ring / grad --ring: the same commands over P processes started by mpirun,
// each computing its rows with dist::ring_attention(_backward) (docs/distributed.md).
//
// Every rank parses the same flags and reads the same .npy headers, so it knows the whole
// problem; it then reads only the rows dist::local_ranges() gives it, joins the ring, and writes
// only its rows of the outputs (ring_rows.h, ring_outputs.h). The result is the files the
// single-process command writes, within its tolerance (the ring adds the softmax's parts in
// another order). Every local step runs through on_every_rank, so a failure on one rank is the
// same error on all of them instead of a hang.
//
// MPI is started here, not in main(): only --ring needs it, and a process mpirun started may call
// MPI_Init_thread late. FUNNELED is what the ring needs: only this thread calls MPI while a
// worker computes (dist/ring_mpi.h).
#include <mpi.h>

#include <array>
#include <cstdio>
#include <optional>

#include "commands.h"
#include "maskattn/dist/ring_mpi.h"
#include "maskattn/error.h"
#include "npy_tensors.h"
#include "output_files.h"
#include "ring_agreement.h"
#include "ring_outputs.h"
#include "ring_rows.h"

namespace maskattn::cli {

namespace {

class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    owned_ = true;
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    if (owned_) MPI_Finalize();
  }

 private:
  bool owned_ = false;
};

dist::Layout layout_named(const std::string& name) {
  return name == "contiguous" ? dist::Layout::contiguous : dist::Layout::zigzag;
}

// What both commands know after reading the headers: inputs, dtype, mask, options, and the rows
// of queries and keys this rank holds.
struct RingProblem {
  std::vector<InputTensor> inputs;  // q, k, v (and dout)
  DType dtype = DType::f32;
  MaskSpecs specs;
  dist::RingOptions options;
  std::vector<dist::RowRange> q_rows, k_rows;
  int64_t q_len = 0, k_len = 0;

  const InputTensor& q() const { return inputs[0]; }
  const InputTensor& k() const { return inputs[1]; }
  const InputTensor& v() const { return inputs[2]; }
  std::string files() const {
    std::vector<const InputTensor*> pointers;
    for (const InputTensor& input : inputs) pointers.push_back(&input);
    return input_files(pointers);
  }
};

template <typename Args>
RingProblem read_problem(MPI_Comm comm, const Args& args,
                         const std::vector<std::pair<std::string, std::string>>& input_flags) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  RingProblem p;
  on_every_rank(comm, [&] {
    std::vector<const InputTensor*> pointers;
    for (const auto& [flag, path] : input_flags) p.inputs.push_back(load_input(flag, path));
    for (const InputTensor& input : p.inputs) pointers.push_back(&input);
    require_same_layout(pointers, input_flags.size() == 4 ? "q, k, v and dout" : "q, k and v");
    p.dtype = choose_dtype(args.dtype, pointers);
    p.specs = parse_mask_specs(args.masks, args.mods, p.q().file_rank == 3);
    p.options.base = call_options(args.scale, args.threads, args.kernel, args.products,
                                  Dropout{args.dropout, args.seed, 0});
    p.options.layout = layout_named(args.ring);
    p.options.count_allowed_pairs = args.ring_stats == "pairs";
    p.q_len = p.q().shape[2];
    p.k_len = p.k().shape[2];
    p.q_rows = dist::local_ranges(p.q_len, p.options.layout, rank, world);
    p.k_rows = dist::local_ranges(p.k_len, p.options.layout, rank, world);
  });
  return p;
}

// [B,H,L,W] with L replaced by this rank's row count.
Dims local_shape(const Dims& shape, const std::vector<dist::RowRange>& rows) {
  Dims local = shape;
  local[2] = dist::row_count(rows);
  return local;
}

// One ring call, timed from a barrier (so every rank starts together) to its return.
template <typename Call>
double timed_ring(MPI_Comm comm, const Call& call) {
  MPI_Barrier(comm);
  const double start = MPI_Wtime();
  call();
  return MPI_Wtime() - start;
}

// --ring-stats: rank 0 prints every rank's RingStats, one fixed-format line each (scripts read
// them; docs/distributed.md). Collective.
void print_ring_stats(MPI_Comm comm, const char* pass, const dist::RingStats& stats,
                      double ring_seconds, int64_t rows) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const std::array<double, 8> mine = {static_cast<double>(rows),
                                      static_cast<double>(stats.pairs_computed),
                                      static_cast<double>(stats.pairs_skipped),
                                      static_cast<double>(stats.allowed_pairs),
                                      static_cast<double>(stats.bytes_sent),
                                      stats.compute_seconds,
                                      stats.wait_seconds,
                                      ring_seconds};
  std::vector<double> all(mine.size() * static_cast<size_t>(world));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
             static_cast<int>(mine.size()), MPI_DOUBLE, 0, comm);
  if (rank != 0) return;
  for (int r = 0; r < world; ++r) {
    const double* x = &all[mine.size() * static_cast<size_t>(r)];
    std::fprintf(stderr,
                 "ring_stats pass=%s rank=%d world=%d rows=%.0f calls=%.0f skipped=%.0f "
                 "allowed_pairs=%.0f bytes_sent=%.0f compute_s=%.4f wait_s=%.4f ring_s=%.4f\n",
                 pass, r, world, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
  }
}

}  // namespace

int run_attend_ring(const AttendArgs& args) {
  std::vector<std::pair<std::string, std::string>> outputs = {{"--out", args.out}};
  if (!args.lse.empty()) outputs.emplace_back("--lse", args.lse);
  require_distinct_outputs(outputs);
  const MpiSession session;
  const MPI_Comm comm = MPI_COMM_WORLD;
  const RingProblem p =
      read_problem(comm, args, {{"--q", args.q}, {"--k", args.k}, {"--v", args.v}});
  const InputTensor& q = p.q();
  const Dims out_shape = {q.shape[0], q.shape[1], q.shape[2], p.v().shape[3]};
  const Dims lse_shape = {q.shape[0], q.shape[1], q.shape[2]};
  const Dims lse_rows = {q.shape[0], q.shape[1], q.shape[2], 1};  // [B,H,L] as rows of width 1

  std::optional<TensorBuffer> q_local, k_local, v_local, out, lse;
  on_every_rank(comm, [&] {
    q_local.emplace(read_rows(q, p.q_rows, p.dtype));
    k_local.emplace(read_rows(p.k(), p.k_rows, p.dtype));
    v_local.emplace(read_rows(p.v(), p.k_rows, p.dtype));
    out.emplace(p.dtype, local_shape(out_shape, p.q_rows));
    if (!args.lse.empty()) {
      lse.emplace(DType::f32, Dims{q.shape[0], q.shape[1], dist::row_count(p.q_rows)});
    }
  });
  RingOutputs files(comm);
  const size_t out_file =
      files.add("--out", args.out, result_type(q, p.dtype), file_layout(q, out_shape), out_shape);
  const size_t lse_file =
      args.lse.empty() ? 0 : files.add("--lse", args.lse, NpyType::f4, lse_shape, lse_rows);
  dist::RingStats stats;
  double seconds = 0;
  on_every_rank(comm, [&] {
    try {
      seconds = timed_ring(comm, [&] {
        dist::ring_attention(comm, p.q_len, p.k_len, q_local->view(), k_local->view(),
                             v_local->view(), out->mutable_view(), p.specs.mask, p.specs.mods,
                             p.options, lse ? lse->mutable_view() : MutableTensorView(), &stats);
      });
    } catch (const Error& error) {
      throw Error(error.what() + p.files());
    }
  });
  if (!args.ring_stats.empty()) {
    print_ring_stats(comm, "forward", stats, seconds, dist::row_count(p.q_rows));
  }
  on_every_rank(comm, [&] {
    files.write(out_file, *out, p.q_rows);
    if (lse) files.write(lse_file, *lse, p.q_rows);
  });
  files.commit();
  return 0;
}

int run_grad_ring(const GradArgs& args) {
  require_distinct_outputs({{"--dq", args.dq}, {"--dk", args.dk}, {"--dv", args.dv}});
  const MpiSession session;
  const MPI_Comm comm = MPI_COMM_WORLD;
  const RingProblem p = read_problem(
      comm, args, {{"--q", args.q}, {"--k", args.k}, {"--v", args.v}, {"--dout", args.dout}});
  const InputTensor &q = p.q(), &k = p.k(), &v = p.v();

  std::optional<TensorBuffer> q_local, k_local, v_local, dout_local, out, lse, dq, dk, dv;
  on_every_rank(comm, [&] {
    q_local.emplace(read_rows(q, p.q_rows, p.dtype));
    k_local.emplace(read_rows(k, p.k_rows, p.dtype));
    v_local.emplace(read_rows(v, p.k_rows, p.dtype));
    dout_local.emplace(read_rows(p.inputs[3], p.q_rows, p.dtype));
    const int64_t rows = dist::row_count(p.q_rows);
    out.emplace(p.dtype, Dims{q.shape[0], q.shape[1], rows, v.shape[3]});
    lse.emplace(DType::f32, Dims{q.shape[0], q.shape[1], rows});
    dq.emplace(p.dtype, local_shape(q.shape, p.q_rows));
    dk.emplace(p.dtype, local_shape(k.shape, p.k_rows));
    dv.emplace(p.dtype, local_shape(v.shape, p.k_rows));
  });
  RingOutputs files(comm);
  const auto gradient = [&](const char* flag, const std::string& path, const InputTensor& like) {
    return files.add(flag, path, result_type(like, p.dtype), like.file_shape, like.shape);
  };
  const size_t dq_file = gradient("--dq", args.dq, q);
  const size_t dk_file = gradient("--dk", args.dk, k);
  const size_t dv_file = gradient("--dv", args.dv, v);
  std::array<dist::RingStats, 2> stats;  // forward, backward
  std::array<double, 2> seconds = {0, 0};
  on_every_rank(comm, [&] {
    try {
      // The backward needs the forward's O and LSE of these rows: computed here, as grad does.
      seconds[0] = timed_ring(comm, [&] {
        dist::ring_attention(comm, p.q_len, p.k_len, q_local->view(), k_local->view(),
                             v_local->view(), out->mutable_view(), p.specs.mask, p.specs.mods,
                             p.options, lse->mutable_view(), &stats[0]);
      });
      seconds[1] = timed_ring(comm, [&] {
        dist::ring_attention_backward(
            comm, p.q_len, p.k_len, q_local->view(), k_local->view(), v_local->view(), out->view(),
            lse->view(), dout_local->view(),
            {dq->mutable_view(), dk->mutable_view(), dv->mutable_view(), {}, {}}, p.specs.mask,
            p.specs.mods, p.options, &stats[1]);
      });
    } catch (const Error& error) {
      throw Error(error.what() + p.files());
    }
  });
  if (!args.ring_stats.empty()) {
    print_ring_stats(comm, "forward", stats[0], seconds[0], dist::row_count(p.q_rows));
    print_ring_stats(comm, "backward", stats[1], seconds[1], dist::row_count(p.q_rows));
  }
  on_every_rank(comm, [&] {
    files.write(dq_file, *dq, p.q_rows);
    files.write(dk_file, *dk, p.k_rows);
    files.write(dv_file, *dv, p.k_rows);
  });
  files.commit();
  return 0;
}

}  // namespace maskattn::cli
