// The requests file of `maskattn gpt serve` (serve_requests.h): a reader for one flat JSON object
// per line — a recursive-descent parser cut down to what the format allows (no nesting), so that
// every error names its line and column — and the string escaping the results need.
#include "serve_requests.h"

#include <fmt/core.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <variant>

#include "maskattn/error.h"

namespace maskattn::cli {

namespace {

using Value = std::variant<std::monostate, std::string, double, bool>;  // null, text, number, bool

// One line's object, read left to right.
class LineParser {
 public:
  LineParser(const std::string& text, const std::string& where) : text_(text), where_(where) {}

  std::map<std::string, Value> object() {
    std::map<std::string, Value> fields;
    expect('{');
    if (peek() == '}') return finish(fields);
    while (true) {
      const size_t column = at_;
      std::string key = string();
      expect(':');
      if (!fields.emplace(key, value()).second)
        fail("field \"" + key + "\" is given twice", column);
      if (peek() == '}') return finish(fields);
      expect(',');
    }
  }

  [[noreturn]] void fail(const std::string& what, size_t column) const {
    throw Error(where_ + ", column " + std::to_string(column + 1) + ": " + what);
  }

 private:
  std::map<std::string, Value> finish(std::map<std::string, Value>& fields) {
    ++at_;  // the '}'
    if (peek() != '\0') fail("text after the object's closing '}'", at_);
    return fields;
  }
  char peek() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
    return at_ < text_.size() ? text_[at_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'", at_);
    ++at_;
  }
  Value value() {
    const char c = peek();
    if (c == '"') return string();
    for (const auto& [word, result] : {std::pair<const char*, Value>{"true", true},
                                       {"false", false},
                                       {"null", std::monostate{}}}) {
      if (text_.compare(at_, std::strlen(word), word) == 0) {
        at_ += std::strlen(word);
        return result;
      }
    }
    if (c == '{' || c == '[') fail("nested objects and arrays are not part of the format", at_);
    const char* start = text_.c_str() + at_;
    char* end = nullptr;
    const double number = std::strtod(start, &end);
    if (end == start) fail("expected a string, a number, true, false or null", at_);
    at_ += static_cast<size_t>(end - start);
    return number;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      const char c = text_[at_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) break;
      const char e = text_[at_++];
      const std::string simple = "\"\\/bfnrt", meaning = "\"\\/\b\f\n\r\t";
      if (simple.find(e) != std::string::npos) {
        out += meaning[simple.find(e)];
      } else if (e == 'u') {
        append_utf8(code_point(), out);
      } else {
        fail(std::string("unknown escape \\") + e, at_ - 2);
      }
    }
    if (at_ >= text_.size()) fail("a string is not closed", at_);
    ++at_;
    return out;
  }
  uint32_t hex4() {
    if (at_ + 4 > text_.size()) fail("\\u needs four hex digits", at_);
    uint32_t value = 0;
    for (int n = 0; n < 4; ++n) {
      const char h = text_[at_++];
      const int digit =
          std::isxdigit(static_cast<unsigned char>(h))
              ? (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10)
              : -1;
      if (digit < 0) fail("\\u needs four hex digits", at_ - 1);
      value = value * 16 + static_cast<uint32_t>(digit);
    }
    return value;
  }
  uint32_t code_point() {
    const uint32_t high = hex4();
    if (high < 0xD800 || high > 0xDBFF) return high;
    if (text_.compare(at_, 2, "\\u") != 0) fail("a \\u surrogate pair is not complete", at_);
    at_ += 2;
    const uint32_t low = hex4();
    return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
  }
  static void append_utf8(uint32_t c, std::string& out) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }

  const std::string& text_;
  std::string where_;
  size_t at_ = 0;
};

// An integer field in [low, high].
int64_t integer(const Value& value, const std::string& name, int64_t low, int64_t high,
                const std::string& where) {
  const double* number = std::get_if<double>(&value);
  if (number == nullptr || *number != std::floor(*number) || *number < static_cast<double>(low) ||
      *number > static_cast<double>(high)) {
    throw Error(where + ": \"" + name + "\" must be an integer in [" + std::to_string(low) + ", " +
                std::to_string(high) + "]");
  }
  return static_cast<int64_t>(*number);
}

RequestLine request_of(const std::map<std::string, Value>& fields, const std::string& where,
                       const model::CharVocabulary& vocabulary) {
  RequestLine line;
  const auto prompt = fields.find("prompt");
  if (prompt == fields.end() || !std::holds_alternative<std::string>(prompt->second) ||
      std::get<std::string>(prompt->second).empty()) {
    throw Error(where + ": \"prompt\" must be a non-empty string");
  }
  line.prompt = std::get<std::string>(prompt->second);
  line.request.prompt = vocabulary.encode(line.prompt);
  for (const int32_t id : line.request.prompt) line.unknown_characters += id == 1;
  model::ServeRequest& r = line.request;
  for (const auto& [name, value] : fields) {
    if (name == "prompt") continue;
    if (name == "max_new_tokens") {
      r.max_new_tokens = integer(value, name, 1, 1000000000, where);
    } else if (name == "arrival") {
      r.arrival = integer(value, name, 0, INT64_C(1) << 40, where);
    } else if (name == "cancel_at") {
      r.cancel_at = std::holds_alternative<std::monostate>(value)
                        ? -1
                        : integer(value, name, 0, INT64_C(1) << 40, where);
    } else if (name == "top_k") {
      r.top_k = integer(value, name, 0, 1000000, where);
    } else if (name == "seed") {
      r.seed = static_cast<uint64_t>(integer(value, name, 0, INT64_C(1) << 53, where));
    } else if (name == "temperature") {
      const double* t = std::get_if<double>(&value);
      if (t == nullptr || !(*t >= 0 && *t <= 100)) {
        throw Error(where + ": \"temperature\" must be a number in [0, 100] (0: greedy)");
      }
      r.temperature = *t;
    } else if (name == "ignore_eos") {
      if (!std::holds_alternative<bool>(value)) {
        throw Error(where + ": \"ignore_eos\" must be true or false");
      }
      r.stop_at_eos = !std::get<bool>(value);
    } else {
      throw Error(where + ": unknown field \"" + name +
                  "\" (fields: prompt, max_new_tokens, arrival, cancel_at, temperature, top_k, "
                  "seed, ignore_eos)");
    }
  }
  return line;
}

}  // namespace

std::vector<RequestLine> read_requests(const std::string& path,
                                       const model::CharVocabulary& vocabulary) {
  std::ifstream file(path);
  if (!file) throw Error("gpt serve: cannot read the requests file " + path);
  std::vector<RequestLine> requests;
  std::string text;
  for (int64_t number = 1; std::getline(file, text); ++number) {
    const size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') continue;
    const std::string where = path + " line " + std::to_string(number);
    LineParser parser(text, where);
    RequestLine line = request_of(parser.object(), where, vocabulary);
    line.line = number;
    requests.push_back(std::move(line));
  }
  if (requests.empty()) {
    throw Error("gpt serve: " + path + " holds no request (one JSON object per line)");
  }
  return requests;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace maskattn::cli
