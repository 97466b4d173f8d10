#include "sparse_cases.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "maskattn/error.h"

namespace maskattn::bench {

namespace {

struct Pattern {
  bool dense = false;    // given as the keep matrix of the same pairs
  bool bigbird = false;  // else Longformer
  std::vector<int64_t> numbers;
  bool spread = false;  // Longformer: global tokens spread evenly
};

Pattern parse(const std::string& name) {
  Pattern pattern;
  std::string rest = name;
  if (rest.rfind("dense-", 0) == 0) {
    pattern.dense = true;
    rest = rest.substr(6);
  }
  const size_t colon = rest.find(':');
  const std::string kind = rest.substr(0, colon);
  if (kind != "longformer" && kind != "bigbird") {
    throw Error("unknown sparse benchmark mask '" + name + "'");
  }
  pattern.bigbird = kind == "bigbird";
  for (size_t at = colon; at != std::string::npos;) {
    const size_t next = rest.find(':', at + 1);
    const std::string field = rest.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    if (field == "spread") {
      pattern.spread = true;
    } else {
      pattern.numbers.push_back(std::stoll(field));
    }
    at = next;
  }
  if (pattern.numbers.size() != (pattern.bigbird ? 4u : 2u)) {
    throw Error("sparse benchmark mask '" + name +
                "': expected longformer:W:G[:spread] or bigbird:BLOCK:S:G:R");
  }
  return pattern;
}

std::vector<int64_t> global_ids(const Pattern& p, int64_t length) {
  std::vector<int64_t> ids(length, 0);
  const int64_t count = p.numbers[1];
  for (int64_t n = 0; n < count && n < length; ++n) ids[p.spread ? n * (length / count) : n] = 1;
  return ids;
}

Array<uint8_t> bigbird_grid(const Pattern& p, int64_t length) {
  const int64_t block = p.numbers[0];
  if (length % block != 0) throw Error("bigbird benchmark needs L divisible by the block");
  return bigbird_layout(length / block, {p.numbers[1], p.numbers[2], p.numbers[3], 0});
}

// The rule of each pattern, straight from its definition.
template <typename Visit>
void for_each_allowed_row(const Case& c, const Pattern& p, Visit&& visit) {
  const int64_t length = c.q_len;
  std::vector<uint8_t> row(length);
  if (p.bigbird) {
    const Array<uint8_t> layout = bigbird_grid(p, length);
    const int64_t block = p.numbers[0];
    for (int64_t i = 0; i < length; ++i) {
      for (int64_t j = 0; j < length; ++j) row[j] = layout.at(i / block, j / block);
      visit(i, row);
    }
    return;
  }
  const int64_t half = p.numbers[0] / 2;
  const std::vector<int64_t> ids = global_ids(p, length);
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t j = 0; j < length; ++j) {
      row[j] = std::abs(i - j) <= half || ids[i] != 0 || ids[j] != 0;
    }
    visit(i, row);
  }
}

}  // namespace

bool is_sparse_mask(const std::string& name) {
  return name.rfind("longformer:", 0) == 0 || name.rfind("bigbird:", 0) == 0 ||
         name.rfind("dense-", 0) == 0;
}

Mask make_sparse_mask(const Case& c) {
  if (c.q_len != c.k_len) throw Error("sparse benchmark masks need Lq == Lk");
  const Pattern p = parse(c.mask);
  if (p.dense) {
    std::vector<uint8_t> keep(c.q_len * c.k_len);
    for_each_allowed_row(c, p, [&](int64_t i, const std::vector<uint8_t>& row) {
      std::copy(row.begin(), row.end(), keep.begin() + i * c.k_len);
    });
    return Mask().keep(Array<uint8_t>({c.q_len, c.k_len}, std::move(keep)));
  }
  if (p.bigbird) {
    return Mask().block_sparse(bigbird_grid(p, c.q_len), p.numbers[0], p.numbers[0]);
  }
  const int64_t half = p.numbers[0] / 2;
  return Mask().window(half, half).global_tokens(Array<int64_t>({c.q_len}, global_ids(p, c.q_len)));
}

}  // namespace maskattn::bench
