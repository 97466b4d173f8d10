#include "maskattn/model/char_vocabulary.h"

#include <algorithm>
#include <set>

#include "maskattn/error.h"
#include "maskattn/tokens.h"

namespace maskattn::model {

namespace {

// Bytes in the UTF-8 sequence that starts with `lead`, or 1 for a byte that cannot start one.
size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

}  // namespace

std::vector<std::string> split_characters(const std::string& text) {
  std::vector<std::string> characters;
  for (size_t at = 0; at < text.size();) {
    size_t length = sequence_length(static_cast<unsigned char>(text[at]));
    bool valid = at + length <= text.size();
    for (size_t n = 1; valid && n < length; ++n) {
      valid = (static_cast<unsigned char>(text[at + n]) & 0xC0) == 0x80;
    }
    if (!valid) length = 1;
    characters.push_back(text.substr(at, length));
    at += length;
  }
  return characters;
}

CharVocabulary CharVocabulary::from_text(const std::string& text) {
  if (text.empty()) throw Error("gpt: the training text is empty; give a file with some text");
  const std::vector<std::string> all = split_characters(text);
  const std::set<std::string> distinct(all.begin(), all.end());
  return CharVocabulary(std::vector<std::string>(distinct.begin(), distinct.end()));
}

CharVocabulary::CharVocabulary(std::vector<std::string> characters)
    : characters_(std::move(characters)) {
  for (size_t n = 0; n < characters_.size(); ++n) {
    ids_.emplace(characters_[n], static_cast<int32_t>(kSpecialTokens + n));
  }
}

std::vector<int32_t> CharVocabulary::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& character : split_characters(text)) {
    const auto found = ids_.find(character);
    ids.push_back(found == ids_.end() ? static_cast<int32_t>(kUnkId) : found->second);
  }
  return ids;
}

std::string CharVocabulary::token(int32_t id) const {
  if (id < 0 || id >= size()) {
    throw Error("gpt: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(size()) + ")");
  }
  if (id < kSpecialTokens) return Vocabulary().token(id);
  return characters_[id - kSpecialTokens];
}

std::string CharVocabulary::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (const int32_t id : ids) text += token(id);
  return text;
}

}  // namespace maskattn::model
