// The GPT model's character-level vocabulary: tokens.h's seven special tokens at their fixed ids
// (<pad> 0, <unk> 1, <bos> 2, <eos> 3, <sep> 4, <cls> 5, <mask> 6), then every distinct character
// (UTF-8 code point; a byte that is not valid UTF-8 counts as a character of its own) of the
// training text, in byte order. A character the vocabulary does not know encodes as <unk>.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace maskattn::model {

// "é" → {"é"}: the text cut into characters as above.
std::vector<std::string> split_characters(const std::string& text);

class CharVocabulary {
 public:
  // The characters of `text`; throws Error when it is empty.
  static CharVocabulary from_text(const std::string& text);
  // From the characters a checkpoint saved (in id order after the special tokens).
  explicit CharVocabulary(std::vector<std::string> characters);

  int64_t size() const { return kSpecialTokens + static_cast<int64_t>(characters_.size()); }
  const std::vector<std::string>& characters() const { return characters_; }

  std::vector<int32_t> encode(const std::string& text) const;
  // Characters as themselves, special tokens as their names ("<eos>").
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token(int32_t id) const;

  static constexpr int64_t kSpecialTokens = 7;

 private:
  std::vector<std::string> characters_;
  std::unordered_map<std::string, int32_t> ids_;
};

}  // namespace maskattn::model
