// Tokens and batches: a vocabulary with fixed special-token ids, a word-level tokenizer, and
// collate(), which pads token sequences into a batch and gives the mask components that go with it
// (docs/semantics.md §12).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/mask.h"

namespace maskattn {

// The special tokens and their ids, fixed: every Vocabulary starts with them, in this order.
inline constexpr int64_t kPadId = 0;   // <pad>  fills sequences up to the batch length
inline constexpr int64_t kUnkId = 1;   // <unk>  any word the vocabulary does not know
inline constexpr int64_t kBosId = 2;   // <bos>  beginning of a sequence
inline constexpr int64_t kEosId = 3;   // <eos>  end of a sequence
inline constexpr int64_t kSepId = 4;   // <sep>  separates segments (sentence pairs, packed text)
inline constexpr int64_t kClsId = 5;   // <cls>  a sequence-level summary token
inline constexpr int64_t kMaskId = 6;  // <mask> a token hidden from a masked language model (MLM)

class Vocabulary {
 public:
  Vocabulary();  // the seven special tokens only
  // The special tokens, then `words` in order (duplicates and special tokens keep their first id).
  explicit Vocabulary(const std::vector<std::string>& words);

  int64_t add(const std::string& word);        // the word's id, new or existing
  int64_t id(const std::string& token) const;  // kUnkId for an unknown token
  const std::string& token(int64_t id) const;  // throws Error for an id outside the vocabulary
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  // Splits `text` on whitespace; special tokens written out ("<sep>") map to their ids, unknown
  // words to <unk>. With `bos`/`eos`, wraps the sequence in <bos> … <eos>.
  std::vector<int64_t> encode(const std::string& text, bool bos = true, bool eos = true) const;
  std::vector<std::string> decode(const std::vector<int64_t>& ids) const;

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
};

enum class PadSide : uint8_t {
  right,  // real tokens first, <pad> after (training, encoders)
  left,   // <pad> first, real tokens last (batched generation: every row ends at the same column)
};

// A padded batch of token sequences.
struct TokenBatch {
  Array<int64_t> ids;            // [B, L], <pad> where there is no token
  std::vector<int64_t> lengths;  // real tokens per sequence
  std::vector<int64_t> starts;   // column of each sequence's first real token (0 when right-padded)
  Array<int64_t> segments;  // [B, L]: 0 up to the first <sep> (included), then 1, …; −1 on <pad>
  PadSide side = PadSide::right;

  // Hide <pad> keys; with left padding, positions count from each sequence's first real token, so
  // a causal mask stays aligned exactly as for the unpadded sequence.
  Mask key_padding() const;
  // The same for queries: <pad> rows see nothing (output 0).
  Mask query_padding() const;
  // Decoder self-attention: causal & key padding & query padding.
  Mask decoder_self_attention() const;
  // Encoder self-attention: key padding & query padding (bidirectional).
  Mask encoder_self_attention() const;
  // Attention only within a segment (block-diagonal between <sep>s), plus the padding.
  Mask segment_attention() const;
};

// Encoder–decoder cross-attention: the decoder's queries (its <pad> rows see nothing) against the
// encoder's keys (its <pad> keys hidden). No causal part: every decoder token may read the whole
// source. The two batches must have the same B.
Mask cross_attention(const TokenBatch& decoder, const TokenBatch& encoder);

// Image–text sequences of one layout: positions [first, first + count) of sequence b hold its
// image tokens (`image_first[b]`, `image_count[b]`), the rest is text. Image tokens form one
// bidirectional span (each sees every image token, earlier or later); everything else is causal,
// so text sees the whole image once it is past it and never a later text token.
Mask image_text(const std::vector<int64_t>& image_first, const std::vector<int64_t>& image_count,
                int64_t length);

// MAE patch masking: a seeded random subset of `patches` positions is kept (round(patches ·
// (1 − mask_ratio)) of them), the rest masked. `keep` is [patches] 0/1; mask() hides the masked
// patches as keys and as queries (the encoder sees only the kept ones).
struct PatchMasking {
  std::vector<uint8_t> keep;
  std::vector<int64_t> kept;  // sorted indices of the kept patches
  Mask mask() const;
};
PatchMasking mae_patch_masking(int64_t patches, double mask_ratio, uint64_t seed);

// BERT-style MLM input masking: each real, non-special token is selected with probability `rate`
// (0.15); a selected token becomes <mask> 80 % of the time, a random word 10 %, itself 10 %.
// `labels` holds the original id at selected positions and −100 elsewhere (the usual ignore index).
struct MlmExample {
  Array<int64_t> inputs;  // [B, L]
  Array<int64_t> labels;  // [B, L]
};
MlmExample mlm_masking(const Array<int64_t>& ids, int64_t vocabulary_size, uint64_t seed,
                       double rate = 0.15);

// Pads `sequences` to the longest one (or `min_length`, if longer). Throws Error for an empty
// list or a negative min_length.
TokenBatch collate(const std::vector<std::vector<int64_t>>& sequences, PadSide side,
                   int64_t min_length = 0);

}  // namespace maskattn
