// Training text for the GPT model and the batches drawn from it.
//
// The corpus is read at run time from text files (by default the licence texts every Debian system
// ships in /usr/share/common-licenses/, never copied into the repository), joined with a newline,
// and split by position: the first 90 % trains, the last 10 % validates, so that no validation
// character is ever trained on.
//
// Two batch modes:
//   fixed context  B windows of T + 1 tokens at random offsets of the split: tokens are the first
//   T,
//                  targets the last T (the next token at every position);
//   padded lines   B random non-empty lines of the split, each <bos> line <eos> cut to T + 1
//   tokens,
//                  right-padded with <pad> to the longest; targets at <pad> are ignored (−1), so
//                  the padding masks carry the batch.
// The draws come from a splitmix64 generator whose state is part of a checkpoint, so that training
// resumed from one draws exactly the batches it would have drawn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/model/char_vocabulary.h"

namespace maskattn::model {

struct TextCorpus {
  std::string text;
  std::vector<std::string> files;
};

// The files' text joined by "\n". No files: every regular file of /usr/share/common-licenses/
// (sorted by name). Throws Error for a missing or unreadable file and for empty text.
TextCorpus read_corpus(const std::vector<std::string>& files);

// The default corpus directory, and what read_corpus({}) reads.
inline constexpr const char* kDefaultCorpusDirectory = "/usr/share/common-licenses";

struct TokenSplits {
  std::vector<int32_t> train, validation;
};
TokenSplits split_tokens(const std::vector<int32_t>& tokens, double train_fraction = 0.9);

class BatchSampler {
 public:
  // `newline`: the token id of "\n" (padded lines only; −1 when the text has none: one line).
  BatchSampler(const std::vector<int32_t>* tokens, int64_t context, bool padded_lines,
               int32_t newline, uint64_t seed);

  // tokens and targets [batch, length]: length = context for fixed windows, the longest line
  // (≤ context) for padded lines. Throws Error when the split is too short for one window.
  int64_t draw(int64_t batch, std::vector<int32_t>& tokens, std::vector<int32_t>& targets);

  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; }

 private:
  uint64_t below(uint64_t bound);
  int64_t draw_lines(int64_t batch, std::vector<int32_t>& tokens, std::vector<int32_t>& targets);

  const std::vector<int32_t>* tokens_;
  int64_t context_;
  bool padded_lines_;
  uint64_t state_;
  std::vector<std::pair<int64_t, int64_t>> lines_;  // [first, end) of each non-empty line
};

}  // namespace maskattn::model
