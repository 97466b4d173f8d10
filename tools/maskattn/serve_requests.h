// The requests file of `maskattn gpt serve` and the results it writes, both JSON lines
// (docs/cli.md): one object per line, fields
//
//   {"prompt": "The licence", "max_new_tokens": 64, "arrival": 0, "cancel_at": 12,
//    "temperature": 0, "top_k": 0, "seed": 1, "ignore_eos": false}
//
// of which only "prompt" is required; the others default as shown (cancel_at: never). Blank lines
// and lines starting with '#' are skipped. Only flat objects of strings, numbers, booleans and null
// are read: that is the whole format, so a small reader suffices and its errors can name the line
// and column (Error E153).
#pragma once

#include <string>
#include <vector>

#include "maskattn/model/char_vocabulary.h"
#include "maskattn/model/serve.h"

namespace maskattn::cli {

struct RequestLine {
  model::ServeRequest request;
  std::string prompt;              // as written
  int64_t line = 0;                // in the file, from 1
  int64_t unknown_characters = 0;  // prompt characters the vocabulary lacks (they became <unk>)
};

// Throws Error E153 for a file that cannot be read, holds no request, or has a line that is not
// such an object (unknown field, wrong type, a number out of range, no prompt).
std::vector<RequestLine> read_requests(const std::string& path,
                                       const model::CharVocabulary& vocabulary);

// `text` as a JSON string, quotes included (control characters escaped; UTF-8 kept).
std::string json_string(const std::string& text);

}  // namespace maskattn::cli
