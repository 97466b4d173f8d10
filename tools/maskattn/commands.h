// The maskattn subcommands. Each registers itself with the parser (add_*_command, in its own
// *_command.cc); run_* returns the process exit code and throws maskattn::Error for invalid input
// (main() prints it as one line on stderr).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace maskattn::cli {

// A subcommand registered with the parser, and how to run it with what was parsed.
struct Command {
  CLI::App* subcommand;
  std::function<int()> run;
};

// In the order `maskattn --help` lists them.
Command add_attend_command(CLI::App& app);
Command add_grad_command(CLI::App& app);
Command add_gradcheck_command(CLI::App& app);
Command add_example_command(CLI::App& app);
Command add_mask_command(CLI::App& app);
Command add_layout_command(CLI::App& app);
Command add_audit_command(CLI::App& app);
Command add_mha_command(CLI::App& app);
Command add_gpt_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_info_command(CLI::App& app);

struct AttendArgs {
  std::string q, k, v, out;
  std::vector<std::string> masks;
  std::vector<std::string> mods;  // --mod SPECs
  std::optional<double> scale;
  std::string lse, weights;  // empty = not written
  std::string dtype;         // "" = the files' dtype
  int threads = 0;
  std::string kernel = "auto";
  std::string products = "auto";  // bf16 product unit (attention.h: Products)
  int repeat = 0;        // > 0: one warm-up, then `repeat` timed runs, timing printed on stderr
  bool report = false;   // print the numeric health report
  std::string heatmap;   // FILE.png|svg: the weights, one panel per (b, h); empty = none
  std::string tokens;    // labels for the heatmap's rows and columns
  double dropout = 0.0;  // attention dropout probability (Options::dropout), with `seed`
  uint64_t seed = 0;
  std::string ring;        // "zigzag" | "contiguous": run as one rank of a ring (mpirun); "" = not
  std::string ring_stats;  // "basic" | "pairs": print each rank's RingStats; "" = not
};
int run_attend(const AttendArgs& args);
// attend --ring / grad --ring (ring_command.cc; without MPI, ring_unavailable.cc: Error E120).
int run_attend_ring(const AttendArgs& args);

// maskattn grad: the backward from .npy files (docs/cli.md).
struct GradArgs {
  std::string q, k, v, dout, dq, dk, dv;
  std::vector<std::string> masks;
  std::vector<std::string> mods;  // --mod SPECs
  std::optional<double> scale;
  std::string dtype;  // "" = the files' dtype
  int threads = 0;
  std::string kernel = "auto";
  std::string products = "auto";  // bf16 product unit (attention.h: Products)
  double dropout = 0.0;           // as AttendArgs::dropout
  uint64_t seed = 0;
  std::string ring;        // as AttendArgs::ring
  std::string ring_stats;  // as AttendArgs::ring_stats
};
int run_grad(const GradArgs& args);
int run_grad_ring(const GradArgs& args);

// maskattn gradcheck: finite differences on random inputs; exit 1 above the tolerance.
struct GradcheckArgs {
  std::vector<std::string> masks;
  std::vector<std::string> mods;  // --mod SPECs
  int64_t batch = 1, heads = 2, kv_heads = 0, q_len = 8, k_len = 8, dim = 4, value_dim = 4;
  std::optional<double> scale;
  std::string dtype = "f32";
  std::string kernel = "auto";
  int threads = 0;
  uint64_t seed = 1;     // the random inputs' and dropout's
  double dropout = 0.0;  // attention dropout probability
  double step = 1e-3;
  std::optional<double> tolerance;
};
int run_gradcheck(const GradcheckArgs& args);

// maskattn audit: the leakage audit; exit 1 on any leak, blind spot or kernel leak.
struct AuditArgs {
  std::vector<std::string> masks, expect;
  std::vector<std::string> mods;  // --mod SPECs of the mask under test
  int64_t q_len = 0, k_len = 0, batch = 1, heads = 1, kv_heads = 0, dim = 8;
  std::string dtype = "f32";
  std::string kernel = "auto";
  uint64_t seed = 1;
};
int run_audit(const AuditArgs& args);

// maskattn mha: a multi-head attention layer from a weights directory (docs/cli.md).
struct MhaArgs {
  std::string query, key, value, weights, out;  // key/value empty = self-attention
  int64_t heads = 0, kv_heads = 0;
  std::vector<std::string> masks;
  std::vector<std::string> mods;  // --mod SPECs
  bool incremental = false;       // one query at a time through a KV cache (causal)
  std::optional<double> scale;
  std::string dtype;  // "" = the files' dtype
  int threads = 0;
  std::string kernel = "auto";
  std::string products = "auto";  // bf16 product unit (attention.h: Products)
};
int run_mha(const MhaArgs& args);

int run_example();

struct MaskArgs {
  std::vector<std::string> specs;
  int64_t q_len = 0, k_len = 0;
  int64_t batch = 0, head = 0;
  std::string png, svg;  // heatmaps of every head of --batch
  std::string tokens;    // labels for their rows and columns
};
int run_mask(const MaskArgs& args);

// maskattn layout bigbird|strided|fixed: a block-sparse layout .npy (docs/cli.md).
struct LayoutArgs {
  std::string kind;  // bigbird, strided or fixed: the subcommand given
  int64_t blocks = 0;
  int64_t heads = 0;                            // 0: one [N,N] layout; H: [H,N,N]
  int64_t sliding = 3, global = 2, random = 3;  // bigbird
  uint64_t seed = 0;
  int64_t local = 0, stride = 0;   // strided
  int64_t chunk = 0, summary = 0;  // fixed
  bool bidirectional = false;      // strided, fixed: no causal restriction on blocks
  std::string out;
};
int run_layout(const LayoutArgs& args);

// maskattn gpt train|generate|ablate|serve|eval: a small character-level GPT on maskattn
// (docs/gpt.md).
struct GptArgs {
  std::string action;              // train, generate, ablate, serve or eval: the subcommand given
  std::vector<std::string> texts;  // training text files; none: Debian's licence texts
  std::string out;                 // train: the checkpoint directory; ablate: its outputs
  std::string mask = "causal";     // train: causal or none
  int64_t layers = 4, d_model = 128, heads = 4, context = 64, batch = 16, steps = 600;
  double lr = 2e-3;
  uint64_t seed = 1;
  int threads = 0;
  bool padded = false;     // train on padded <bos> line <eos> batches
  bool resume = false;     // train: continue the checkpoint in --out
  int64_t eval_every = 0;  // 0: steps / 10
  std::string model;       // generate: the checkpoint directory
  std::string prompt;      // generate
  int64_t tokens = 200;    // generate: new tokens
  double temperature = 0.8;
  int64_t top_k = 0;
  // serve, eval: the paged KV cache
  std::string requests;  // serve: the requests file (JSON lines)
  std::string results;   // serve: where the results go ("" = stdout)
  std::string kv_format = "f32";
  int64_t block_size = 16;
  int64_t pool_blocks = 0;  // per layer; 0 = --pool-mib or the default
  double pool_mib = 0;      // all layers together
  int64_t max_batch = 32, token_budget = 256, prefill_chunk = 64;
  int64_t windows = 16;  // eval: validation windows
};
int run_gpt_train(const GptArgs& args);
int run_gpt_serve(const GptArgs& args);
int run_gpt_eval(const GptArgs& args);
int run_gpt_generate(const GptArgs& args);
int run_gpt_ablate(const GptArgs& args);

// Writes its heatmaps into `heatmap_directory` (created if needed; empty = none).
int run_demo(const std::string& heatmap_directory);

}  // namespace maskattn::cli
