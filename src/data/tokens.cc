// Training data preparation (include/maskattn/tokens.h): the vocabulary and tokenizer, collate()
// into padded batches, and the MLM and MAE masking of inputs. Not a mask component: it makes the
// data that masks and attention are applied to.
#include "maskattn/tokens.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "core/splitmix64.h"
#include "maskattn/error.h"

namespace maskattn {

namespace {

const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> tokens = {"<pad>", "<unk>", "<bos>", "<eos>",
                                                  "<sep>", "<cls>", "<mask>"};
  return tokens;
}

}  // namespace

Vocabulary::Vocabulary() {
  for (const std::string& token : special_tokens()) add(token);
}

Vocabulary::Vocabulary(const std::vector<std::string>& words) : Vocabulary() {
  for (const std::string& word : words) add(word);
}

int64_t Vocabulary::add(const std::string& word) {
  if (word.empty() ||
      std::any_of(word.begin(), word.end(), [](unsigned char c) { return std::isspace(c) != 0; })) {
    throw Error("vocabulary: token '" + word + "' is empty or contains whitespace");
  }
  const auto [entry, inserted] = ids_.emplace(word, static_cast<int64_t>(tokens_.size()));
  if (inserted) tokens_.push_back(word);
  return entry->second;
}

int64_t Vocabulary::id(const std::string& token) const {
  const auto entry = ids_.find(token);
  return entry == ids_.end() ? kUnkId : entry->second;
}

const std::string& Vocabulary::token(int64_t id) const {
  if (id < 0 || id >= size()) {
    throw Error("vocabulary: id " + std::to_string(id) + " is outside [0, " +
                std::to_string(size()) + ")");
  }
  return tokens_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocabulary::encode(const std::string& text, bool bos, bool eos) const {
  std::vector<int64_t> ids;
  if (bos) ids.push_back(kBosId);
  std::istringstream words(text);
  for (std::string word; words >> word;) ids.push_back(id(word));
  if (eos) ids.push_back(kEosId);
  return ids;
}

std::vector<std::string> Vocabulary::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) tokens.push_back(token(id));
  return tokens;
}

TokenBatch collate(const std::vector<std::vector<int64_t>>& sequences, PadSide side,
                   int64_t min_length) {
  if (sequences.empty()) throw Error("collate: no sequences");
  if (min_length < 0) {
    throw Error("collate: min_length = " + std::to_string(min_length) + " must be ≥ 0");
  }
  int64_t length = min_length;
  for (const auto& sequence : sequences) {
    length = std::max(length, static_cast<int64_t>(sequence.size()));
  }
  const int64_t batch = static_cast<int64_t>(sequences.size());
  std::vector<int64_t> ids(static_cast<size_t>(batch * length), kPadId);
  std::vector<int64_t> segments(ids.size(), -1);
  TokenBatch out;
  out.side = side;
  for (int64_t b = 0; b < batch; ++b) {
    const auto& sequence = sequences[static_cast<size_t>(b)];
    const int64_t real = static_cast<int64_t>(sequence.size());
    const int64_t start = side == PadSide::left ? length - real : 0;
    out.lengths.push_back(real);
    out.starts.push_back(start);
    int64_t segment = 0;
    for (int64_t t = 0; t < real; ++t) {
      const int64_t id = sequence[static_cast<size_t>(t)];
      if (id < 0) {
        throw Error("collate: sequence " + std::to_string(b) + " has a negative token id " +
                    std::to_string(id) + " at " + std::to_string(t));
      }
      ids[static_cast<size_t>(b * length + start + t)] = id;
      segments[static_cast<size_t>(b * length + start + t)] = segment;
      if (id == kSepId) ++segment;  // the <sep> closes its segment
    }
  }
  out.ids = Array<int64_t>({batch, length}, std::move(ids));
  out.segments = Array<int64_t>({batch, length}, std::move(segments));
  return out;
}

Mask TokenBatch::key_padding() const {
  if (side == PadSide::left) {
    // Starts hide the <pad> columns and fix the positions (causal alignment).
    return Mask().key_starts(starts);
  }
  return Mask().key_lengths(lengths);
}

Mask TokenBatch::query_padding() const {
  return side == PadSide::left ? Mask().query_starts(starts) : Mask().query_lengths(lengths);
}

Mask TokenBatch::decoder_self_attention() const {
  return Mask().causal() & key_padding() & query_padding();
}

Mask TokenBatch::encoder_self_attention() const {
  return key_padding() & query_padding();
}

Mask TokenBatch::segment_attention() const {
  return Mask().segments(segments) & key_padding() & query_padding();
}

Mask cross_attention(const TokenBatch& decoder, const TokenBatch& encoder) {
  if (decoder.ids.dim(0) != encoder.ids.dim(0)) {
    throw Error("cross_attention: the decoder batch has B=" + std::to_string(decoder.ids.dim(0)) +
                " sequences but the encoder batch has B=" + std::to_string(encoder.ids.dim(0)));
  }
  return encoder.key_padding() & decoder.query_padding();
}

Mask image_text(const std::vector<int64_t>& image_first, const std::vector<int64_t>& image_count,
                int64_t length) {
  if (image_first.size() != image_count.size() || image_first.empty() || length < 0) {
    throw Error("image_text: " + std::to_string(image_first.size()) + " image starts and " +
                std::to_string(image_count.size()) + " image counts for length " +
                std::to_string(length) + "; give one of each per sequence");
  }
  const int64_t batch = static_cast<int64_t>(image_first.size());
  std::vector<int64_t> span(static_cast<size_t>(batch * length), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = image_first[b], count = image_count[b];
    if (first < 0 || count < 0 || first + count > length) {
      throw Error("image_text: sequence " + std::to_string(b) + " has image tokens [" +
                  std::to_string(first) + ", " + std::to_string(first + count) + ") outside [0, " +
                  std::to_string(length) + ")");
    }
    for (int64_t t = first; t < first + count; ++t) span[static_cast<size_t>(b * length + t)] = 1;
  }
  return Mask().causal().spans(Array<int64_t>({batch, length}, std::move(span)));
}

Mask PatchMasking::mask() const {
  const int64_t patches = static_cast<int64_t>(keep.size());
  std::vector<int64_t> flags(keep.begin(), keep.end());
  const Array<int64_t> keep_array({1, patches}, flags);
  return Mask().key_keep(keep_array).query_keep(keep_array);
}

PatchMasking mae_patch_masking(int64_t patches, double mask_ratio, uint64_t seed) {
  if (patches < 1 || !(mask_ratio >= 0.0 && mask_ratio < 1.0)) {
    throw Error("mae_patch_masking: " + std::to_string(patches) + " patches with mask ratio " +
                std::to_string(mask_ratio) + "; need patches ≥ 1 and a ratio in [0, 1)");
  }
  const int64_t kept = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(static_cast<double>(patches) * (1.0 - mask_ratio))));
  std::vector<int64_t> order(static_cast<size_t>(patches));
  for (int64_t n = 0; n < patches; ++n) order[n] = n;
  detail::SplitMix64 random(seed);
  random.shuffle(order.begin(), order.end());
  PatchMasking out;
  out.keep.assign(static_cast<size_t>(patches), 0);
  out.kept.assign(order.begin(), order.begin() + kept);
  std::sort(out.kept.begin(), out.kept.end());
  for (int64_t n : out.kept) out.keep[n] = 1;
  return out;
}

MlmExample mlm_masking(const Array<int64_t>& ids, int64_t vocabulary_size, uint64_t seed,
                       double rate) {
  if (ids.rank() != 2) {
    throw Error("mlm_masking: ids have shape " + shape_string(ids.shape()) + "; expected [B,L]");
  }
  if (vocabulary_size <= kMaskId + 1 || !(rate >= 0.0 && rate <= 1.0)) {
    throw Error("mlm_masking: vocabulary size " + std::to_string(vocabulary_size) + " and rate " +
                std::to_string(rate) +
                "; need words beyond the special tokens and a rate in [0, 1]");
  }
  detail::SplitMix64 random(seed);
  std::vector<int64_t> inputs = ids.values(), labels(inputs.size(), -100);
  for (size_t n = 0; n < inputs.size(); ++n) {
    const int64_t id = inputs[n];
    if (id <= kMaskId) continue;  // special tokens and <pad> are never selected
    if (random.unit() >= rate) continue;
    labels[n] = id;
    const double roll = random.unit();
    if (roll < 0.8) {
      inputs[n] = kMaskId;
    } else if (roll < 0.9) {
      inputs[n] = random.between(kMaskId + 1, vocabulary_size - 1);
    }
  }
  return {Array<int64_t>(ids.shape(), std::move(inputs)),
          Array<int64_t>(ids.shape(), std::move(labels))};
}

}  // namespace maskattn
