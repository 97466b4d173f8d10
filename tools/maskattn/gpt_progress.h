// What the gpt commands share: the training progress line, and one training run (gpt train, and
// each of gpt ablate's two models).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "maskattn/model/serve.h"
#include "maskattn/model/text_data.h"
#include "maskattn/model/trainer.h"

namespace maskattn::cli {

// "step 120/600  loss 2.134  9,871 tok/s  ETA 0:48" on stderr: one line rewritten in place on a
// terminal, a line every tenth of the run otherwise (logs stay short).
class Progress {
 public:
  Progress(int64_t steps, int64_t first_step);
  void update(int64_t step, double loss, int64_t tokens_per_step);
  void finish();

 private:
  int64_t steps_, first_step_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
  int64_t last_printed_ = -1;
};

// gpt serve's line: "step 812  waiting 3  running 32  done 45/100  1,234 tok/s  blocks 200/512"
// (requests waiting, running, done; tokens generated per second so far; KV-cache blocks in use
// per layer of the pool's), rewritten in place on a terminal, a line each tenth of the requests
// otherwise.
class ServeProgress {
 public:
  ServeProgress(int64_t requests, int64_t pool_blocks);
  void update(const model::ServeStep& step);
  void finish();

 private:
  int64_t requests_, pool_blocks_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
  int64_t generated_ = 0, last_tenth_ = 0, last_done_ = -1;
};

struct TrainedRun {
  std::vector<double> train_losses;                           // per step, as trained
  std::vector<std::pair<int64_t, double>> validation_losses;  // (step, loss) under causal
  double final_train_loss = 0, validation_loss = 0;
  int64_t vocabulary_size = 0;
};

model::TrainOptions train_options(const GptArgs& args);
// Trains (or, with `resume`, continues) a model on `corpus`, writing the checkpoint and loss.csv
// into `out`.
TrainedRun train_model(const GptArgs& args, const model::TextCorpus& corpus, const std::string& out,
                       bool resume);

}  // namespace maskattn::cli
