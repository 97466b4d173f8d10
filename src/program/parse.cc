// The lexer and the recursive-descent parser of the program language (grammar below, loosest
// first, Python's precedence; maskattn/program.h describes the language):
//
//   program    := comparison END
//   comparison := or [ ("==" | "!=" | "<" | "<=" | ">" | ">=") or ]     (no chaining)
//   or         := and { "|" and }
//   and        := sum { "&" sum }
//   sum        := product { ("+" | "-") product }
//   product    := unary { ("*" | "/" | "//" | "%") unary }
//   unary      := ("-" | "~") unary | primary
//   primary    := INT | FLOAT | NAME | NAME "(" args ")" | NAME "[" args "]" | "(" comparison ")"
//
// The parser emits nodes through the Builder as it reduces (so the IR comes out in evaluation
// order) and reports syntax errors with the 1-based column of the offending token.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "program/build.h"

namespace maskattn::program {
namespace {

enum class Kind : uint8_t { end, integer, floating, name, symbol };

struct Token {
  Kind kind = Kind::end;
  std::string text;
  int column = 0;
};

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// A number: digits, an optional fraction, an optional exponent; a fraction or an exponent makes
// it a float.
Token lex_number(const std::string& text, size_t& at) {
  Token token{Kind::integer, "", static_cast<int>(at) + 1};
  const size_t start = at;
  while (at < text.size() && is_digit(text[at])) ++at;
  if (at < text.size() && text[at] == '.') {
    token.kind = Kind::floating;
    ++at;
    while (at < text.size() && is_digit(text[at])) ++at;
  }
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    token.kind = Kind::floating;
    ++at;
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
    while (at < text.size() && is_digit(text[at])) ++at;
  }
  token.text = text.substr(start, at - start);
  return token;
}

std::vector<Token> lex(const ProgramIr& ir) {
  static const char* const kTwoCharacter[] = {"//", "==", "!=", "<=", ">="};
  const std::string& text = ir.source;
  std::vector<Token> tokens;
  size_t at = 0;
  while (at < text.size()) {
    const char c = text[at];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++at;
    } else if (is_digit(c) || (c == '.' && at + 1 < text.size() && is_digit(text[at + 1]))) {
      tokens.push_back(lex_number(text, at));
    } else if (is_name_start(c)) {
      const size_t start = at;
      while (at < text.size() && (is_name_start(text[at]) || is_digit(text[at]))) ++at;
      tokens.push_back({Kind::name, text.substr(start, at - start), static_cast<int>(start) + 1});
    } else {
      std::string symbol(1, c);
      for (const char* pair : kTwoCharacter) {
        if (text.compare(at, 2, pair) == 0) symbol = pair;
      }
      if (std::string("+-*/%<>&|~()[],").find(c) == std::string::npos && symbol.size() == 1) {
        fail(ir, static_cast<int>(at) + 1, "unexpected character '" + symbol + "'");
      }
      tokens.push_back({Kind::symbol, symbol, static_cast<int>(at) + 1});
      at += symbol.size();
    }
  }
  tokens.push_back({Kind::end, "", static_cast<int>(text.size()) + 1});
  return tokens;
}

class Parser {
 public:
  Parser(ProgramIr& ir, std::vector<Token> tokens)
      : ir_(ir), build_(ir), tokens_(std::move(tokens)) {}

  void program() {
    const int32_t root = comparison();
    if (peek().kind != Kind::end) syntax("expected the end of the program");
    build_.finish(root);
  }

 private:
  const Token& peek() const { return tokens_[at_]; }
  bool accept(const char* symbol) {
    if (peek().kind != Kind::symbol || peek().text != symbol) return false;
    ++at_;
    return true;
  }
  void expect(const char* symbol) {
    if (!accept(symbol)) syntax(std::string("expected '") + symbol + "'");
  }
  [[noreturn]] void syntax(const std::string& what) const {
    const Token& token = peek();
    const std::string found = token.kind == Kind::end ? "the end" : "'" + token.text + "'";
    fail(ir_, token.column, "syntax error: " + what + ", found " + found);
  }

  int32_t comparison() {
    static const std::pair<const char*, Op> kComparisons[] = {{"==", Op::eq}, {"!=", Op::ne},
                                                              {"<=", Op::le}, {">=", Op::ge},
                                                              {"<", Op::lt},  {">", Op::gt}};
    const int32_t left = disjunction();
    for (const auto& [symbol, op] : kComparisons) {
      const int column = peek().column;
      if (!accept(symbol)) continue;
      const int32_t result = build_.binary(op, left, disjunction(), column);
      for (const auto& [again, unused] : kComparisons) {
        if (peek().kind == Kind::symbol && peek().text == again) {
          syntax("comparisons do not chain; write (a < b) & (b < c)");
        }
      }
      return result;
    }
    return left;
  }

  int32_t disjunction() {
    int32_t left = conjunction();
    for (int column = peek().column; accept("|"); column = peek().column) {
      left = build_.binary(Op::logical_or, left, conjunction(), column);
    }
    return left;
  }

  int32_t conjunction() {
    int32_t left = sum();
    for (int column = peek().column; accept("&"); column = peek().column) {
      left = build_.binary(Op::logical_and, left, sum(), column);
    }
    return left;
  }

  int32_t sum() {
    int32_t left = product();
    for (;;) {
      const int column = peek().column;
      if (accept("+")) {
        left = build_.binary(Op::add, left, product(), column);
      } else if (accept("-")) {
        left = build_.binary(Op::sub, left, product(), column);
      } else {
        return left;
      }
    }
  }

  int32_t product() {
    static const std::pair<const char*, Op> kProducts[] = {
        {"*", Op::mul}, {"//", Op::floordiv}, {"/", Op::div}, {"%", Op::mod}};
    int32_t left = unary();
    for (;;) {
      const int column = peek().column;
      bool matched = false;
      for (const auto& [symbol, op] : kProducts) {
        if (!matched && accept(symbol)) {
          left = build_.binary(op, left, unary(), column);
          matched = true;
        }
      }
      if (!matched) return left;
    }
  }

  int32_t unary() {
    const int column = peek().column;
    if (accept("-")) return build_.unary(Op::neg, unary(), column);
    if (accept("~")) return build_.unary(Op::logical_not, unary(), column);
    return primary();
  }

  std::vector<int32_t> arguments(const char* close) {
    std::vector<int32_t> args;
    if (accept(close)) return args;
    do {
      args.push_back(comparison());
    } while (accept(","));
    expect(close);
    return args;
  }

  int32_t literal(const Token& token) {
    errno = 0;
    if (token.kind == Kind::integer) {
      const long long value = std::strtoll(token.text.c_str(), nullptr, 10);
      if (errno == ERANGE)
        fail(ir_, token.column, "integer literal " + token.text + " does not fit int64");
      return build_.int_literal(value, token.column);
    }
    return build_.float_literal(std::strtof(token.text.c_str(), nullptr), token.column);
  }

  int32_t primary() {
    const Token token = peek();
    if (token.kind == Kind::integer || token.kind == Kind::floating) {
      ++at_;
      return literal(token);
    }
    if (token.kind == Kind::name) {
      ++at_;
      if (accept("(")) return build_.call(token.text, arguments(")"), token.column);
      if (accept("[")) return build_.index(token.text, arguments("]"), token.column);
      return build_.identifier(token.text, token.column);
    }
    if (accept("(")) {
      const int32_t inner = comparison();
      expect(")");
      return inner;
    }
    syntax("expected a number, a name or '('");
  }

  ProgramIr& ir_;
  Builder build_;
  std::vector<Token> tokens_;
  size_t at_ = 0;
};

}  // namespace

void parse_program(ProgramIr& ir) {
  Parser(ir, lex(ir)).program();
}

}  // namespace maskattn::program
