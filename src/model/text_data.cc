#include "maskattn/model/text_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/splitmix64.h"
#include "maskattn/error.h"
#include "maskattn/model/gpt.h"
#include "maskattn/tokens.h"

namespace maskattn::model {

TextCorpus read_corpus(const std::vector<std::string>& files) {
  TextCorpus corpus;
  corpus.files = files;
  if (corpus.files.empty()) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(kDefaultCorpusDirectory, error)) {
      if (entry.is_regular_file()) corpus.files.push_back(entry.path().string());
    }
    std::sort(corpus.files.begin(), corpus.files.end());
    if (corpus.files.empty()) {
      throw Error(std::string("gpt: no text files in ") + kDefaultCorpusDirectory +
                  " (the default corpus); give one with --text FILE");
    }
  }
  for (const std::string& file : corpus.files) {
    std::ifstream in(file, std::ios::binary);
    if (!in || std::filesystem::is_directory(file)) {
      throw Error("gpt: cannot read the text file " + file);
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (!corpus.text.empty()) corpus.text += '\n';
    corpus.text += text.str();
  }
  if (corpus.text.empty()) {
    throw Error("gpt: the training text is empty (" + std::to_string(corpus.files.size()) +
                " file(s), no characters)");
  }
  return corpus;
}

TokenSplits split_tokens(const std::vector<int32_t>& tokens, double train_fraction) {
  const auto cut = static_cast<int64_t>(static_cast<double>(tokens.size()) * train_fraction);
  return {{tokens.begin(), tokens.begin() + cut}, {tokens.begin() + cut, tokens.end()}};
}

BatchSampler::BatchSampler(const std::vector<int32_t>* tokens, int64_t context, bool padded_lines,
                           int32_t newline, uint64_t seed)
    : tokens_(tokens), context_(context), padded_lines_(padded_lines), state_(seed) {
  if (!padded_lines_) return;
  const std::vector<int32_t>& data = *tokens_;
  int64_t first = 0;
  for (int64_t n = 0; n <= static_cast<int64_t>(data.size()); ++n) {
    if (n == static_cast<int64_t>(data.size()) || data[n] == newline) {
      if (n > first) lines_.emplace_back(first, n);
      first = n + 1;
    }
  }
}

uint64_t BatchSampler::below(uint64_t bound) {
  detail::SplitMix64 draws(state_);
  const uint64_t draw = draws.next() % bound;  // the bias of % is below 2^-40 for these bounds
  state_ = draws.state();
  return draw;
}

int64_t BatchSampler::draw(int64_t batch, std::vector<int32_t>& tokens,
                           std::vector<int32_t>& targets) {
  if (padded_lines_) return draw_lines(batch, tokens, targets);
  const std::vector<int32_t>& data = *tokens_;
  const int64_t size = static_cast<int64_t>(data.size());
  if (size < context_ + 1) {
    throw Error("gpt: the text split has " + std::to_string(size) +
                " characters, fewer than one window of context + 1 = " +
                std::to_string(context_ + 1) + "; give more text or a smaller --context");
  }
  tokens.assign(batch * context_, 0);
  targets.assign(batch * context_, kIgnoreTarget);
  for (int64_t b = 0; b < batch; ++b) {
    const auto first = static_cast<int64_t>(below(size - context_));
    std::copy(data.begin() + first, data.begin() + first + context_, tokens.begin() + b * context_);
    std::copy(data.begin() + first + 1, data.begin() + first + context_ + 1,
              targets.begin() + b * context_);
  }
  return context_;
}

// Each line as <bos> line <eos>, cut to context + 1 tokens; the batch is as long as its longest.
int64_t BatchSampler::draw_lines(int64_t batch, std::vector<int32_t>& tokens,
                                 std::vector<int32_t>& targets) {
  if (lines_.empty()) throw Error("gpt: the text split has no non-empty line to draw");
  std::vector<std::vector<int32_t>> sequences(batch);
  int64_t length = 0;
  for (auto& sequence : sequences) {
    const auto [first, end] = lines_[below(lines_.size())];
    sequence.push_back(static_cast<int32_t>(kBosId));
    sequence.insert(sequence.end(), tokens_->begin() + first, tokens_->begin() + end);
    sequence.push_back(static_cast<int32_t>(kEosId));
    if (static_cast<int64_t>(sequence.size()) > context_ + 1) sequence.resize(context_ + 1);
    length = std::max<int64_t>(length, static_cast<int64_t>(sequence.size()) - 1);
  }
  tokens.assign(batch * length, static_cast<int32_t>(kPadId));
  targets.assign(batch * length, kIgnoreTarget);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& sequence = sequences[b];
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(sequence.size()); ++t) {
      tokens[b * length + t] = sequence[t];
      targets[b * length + t] = sequence[t + 1];
    }
  }
  return length;
}

}  // namespace maskattn::model
