// The bad-input catalogue's rows for draft trees and accepting a verified path (docs/errors.md
// E140–E143), compiled into errors_test so that its catalogue check sees them.
#include <algorithm>
#include <vector>

#include "maskattn/kv_cache.h"
#include "maskattn/tree.h"
#include "test_util.h"

namespace maskattn {
namespace {

// A cache of B = 2, Hkv = 1, D = Dv = 2 holding `length` rows numbered 0, 1, …
KVCache filled_cache(int64_t length) {
  KVCache cache(2, 1, 8, 2);
  std::vector<float> k(2 * length * 2);
  for (size_t n = 0; n < k.size(); ++n) k[n] = static_cast<float>(n);
  cache.append(TensorView(k.data(), {2, 1, length, 2}), TensorView(k.data(), {2, 1, length, 2}));
  return cache;
}

// The cache's keys as floats: an error must leave them (and the length) as they were.
std::vector<float> keys_of(const KVCache& cache) {
  const TensorView keys = cache.keys();
  std::vector<float> values;
  for (int64_t b = 0; b < keys.size(0); ++b) {
    for (int64_t r = 0; r < keys.size(2); ++r) {
      for (int64_t e = 0; e < keys.size(3); ++e) {
        values.push_back(static_cast<const float*>(keys.data())[keys.offset({b, 0, r, e})]);
      }
    }
  }
  return values;
}

TEST(Errors, E140_MalformedParents) {
  EXPECT_MASKATTN_ERROR(Mask().tree({-1, 1, 0}),
                        "tree: parents[1] = 1 must be -1 (a root, a child of the cached prefix) "
                        "or an earlier token's index, in [0, 1)");
  EXPECT_MASKATTN_ERROR(Mask().tree({-1, -2}), "tree: parents[1] = -2 must be -1");
  EXPECT_MASKATTN_ERROR(Mask().tree(Array<int64_t>({2, 2}, {-1, 0, 0, -1})),
                        "tree: parents[1,0] = 0 must be -1");
  EXPECT_MASKATTN_ERROR(Mask().tree(Array<int64_t>({1, 1, 2}, {-1, 0})),
                        "tree: parents has shape [1,1,2]; expected [T] (every sequence) or [B,T]");
  EXPECT_MASKATTN_ERROR(Mask().tree(std::vector<int64_t>{}),
                        "tree: parents has shape [0]; a draft tree holds at least one token");
  EXPECT_MASKATTN_ERROR(tree_position_ids(Array<int64_t>({2}, {0, -1}), 3),
                        "tree_position_ids: parents[0] = 0 must be -1");
  EXPECT_MASKATTN_ERROR(tree_position_ids(Array<int64_t>({1}, {-1}), -1),
                        "tree_position_ids: prefix_length = -1 is negative");
  EXPECT_MASKATTN_ERROR(tree_path(Array<int64_t>({2}, {-1, 5}), 1),
                        "tree_path: parents[1] = 5 must be -1");
  KVCache cache = filled_cache(5);
  const std::vector<float> before = keys_of(cache);
  EXPECT_MASKATTN_ERROR(cache.accept(Array<int64_t>({3}, {-1, 2, 0}), Array<int64_t>({1}, {0})),
                        "KVCache::accept: parents[1] = 2 must be -1");
  EXPECT_EQ(cache.length(), 5);
  EXPECT_EQ(keys_of(cache), before);
  // The CLI's tree: SPEC: inline parents and files take the same checks; float files are refused.
  test::TempDir dir;
  const std::string floats = dir.path("p.npy");
  write_npy(floats, NpyArray::from_floats({-1, 0}, {2}));
  for (const auto& [spec, message] :
       {std::pair<std::string, std::string>{"tree:-1,0,2",
                                            "tree:-1,0,2: tree: parents[2] = 2 must be -1"},
        {"tree:-1,,0", "tree:-1,,0: tree needs its parents as comma-separated integers"},
        {"tree:" + floats, "p.npy has dtype float32; tree parents are integers (-1 for a root)"}}) {
    const test::CliResult result = test::run_cli("mask '" + spec + "' --lq 4 --lk 4");
    EXPECT_EQ(result.exit_code, 1) << spec << "\n" << result.err;
    EXPECT_NE(result.err.find(message), std::string::npos) << result.err << "\nmissing " << message;
  }
}

TEST(Errors, E141_TreeDoesNotFitTheProblem) {
  const test::RandomProblem p(2, 2, 1, 3, 4, 8, 8, 1);
  std::vector<float> out(2 * 2 * 3 * 8, -7.0f);
  const MutableTensorView o(out.data(), {2, 2, 3, 8});
  EXPECT_MASKATTN_ERROR(
      attention(p.qv(), p.kv(), p.vv(), o, Mask().tree({-1, 0, 1, 2, 3})),
      "tree[5]: the draft of T=5 tokens is longer than the keys, Lk=4 (the draft is the last T "
      "keys, after the cached prefix)");
  EXPECT_MASKATTN_ERROR(
      attention(p.qv(), p.kv(), p.vv(), o,
                Mask().tree(Array<int64_t>({3, 2}, {-1, 0, -1, 0, -1, 0}))),
      "tree[3,2]: parents have 3 rows (one tree per sequence) but the batch has B=2; give [T] "
      "(every sequence) or [B,T]");
  EXPECT_EQ(out[0], -7.0f);
  // A head set beyond Hq is E40's check, named by the tree's label.
  EXPECT_MASKATTN_ERROR(allowed_pairs(Mask().tree({-1}, HeadSet{5}), {1, 2, 3, 4}),
                        "tree[1] applies to head 5 but the query has Hq=2 heads");
  // Under a frame the draft is the whole problem's last T keys: checked against k_total.
  Options options;
  options.frame = Frame{0, 0, 3, 6};
  attention(p.qv(), p.kv(), p.vv(), o, Mask().tree({-1, 0, 1, 2, 3}), {}, options);
  options.frame = Frame{0, 0, 3, 4};
  EXPECT_MASKATTN_ERROR(
      attention(p.qv(), p.kv(), p.vv(), o, Mask().tree({-1, 0, 1, 2, 3, 4}), {}, options),
      "the draft of T=6 tokens is longer than the keys, Lk=4");
  const test::CliResult cli = test::run_cli("mask tree:-1,0,0 --lq 2 --lk 2");
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("tree:-1,0,0: the draft of T=3 tokens is longer than the keys, Lk=2"),
            std::string::npos)
      << cli.err;
}

TEST(Errors, E142_AcceptShapesDisagree) {
  KVCache cache = filled_cache(5);
  const std::vector<float> before = keys_of(cache);
  const Array<int64_t> chain({3}, {-1, 0, 1});
  EXPECT_MASKATTN_ERROR(
      cache.accept(Array<int64_t>({3, 1}, {-1, -1, -1}), Array<int64_t>({1}, {0})),
      "KVCache::accept: parents have 3 rows (one tree per sequence) but the "
      "cache holds B=2 sequences");
  EXPECT_MASKATTN_ERROR(
      cache.accept(Array<int64_t>({6}, {-1, 0, 1, 2, 3, 4}), Array<int64_t>({1}, {0})),
      "KVCache::accept: the draft of T=6 tokens is longer than the 5 positions cached");
  EXPECT_MASKATTN_ERROR(cache.accept(chain, Array<int64_t>({3, 1}, {0, 0, 0})),
                        "KVCache::accept: path has shape [3,1]; expected [A] (every sequence) or "
                        "[B,A] with B=2 (the same count A for every sequence: a cache holds one "
                        "length)");
  EXPECT_MASKATTN_ERROR(cache.accept(chain, Array<int64_t>({1, 1, 1}, {0})),
                        "KVCache::accept: path has shape [1,1,1]");
  EXPECT_EQ(cache.length(), 5);
  EXPECT_EQ(keys_of(cache), before);
  // Caller-held views: k and v must agree and hold `length` rows.
  std::vector<float> k(2 * 1 * 6 * 2), v(2 * 1 * 5 * 2);
  EXPECT_MASKATTN_ERROR(
      accept_tree_path(MutableTensorView(k.data(), {2, 1, 6, 2}),
                       MutableTensorView(v.data(), {2, 1, 5, 2}), 6, chain,
                       Array<int64_t>({1}, {0})),
      "accept_tree_path: k [2,1,6,2] and v [2,1,5,2] must be [B,H,L,D] and [B,H,L,Dv] with the "
      "same B and H, holding length = 6 rows");
  EXPECT_MASKATTN_ERROR(accept_tree_path(MutableTensorView(k.data(), {2, 1, 6, 2}),
                                         MutableTensorView(v.data(), {2, 1, 5, 2}), -1, chain,
                                         Array<int64_t>({1}, {0})),
                        "holding length = -1 rows (L ≥ length ≥ 0)");
}

TEST(Errors, E143_PathIsNotAChainOfTheTree) {
  KVCache cache = filled_cache(6);
  const std::vector<float> before = keys_of(cache);
  const Array<int64_t> parents({4}, {-1, 0, 0, 1});
  EXPECT_MASKATTN_ERROR(cache.accept(parents, Array<int64_t>({2}, {0, 4})),
                        "KVCache::accept: path[1] = 4 is outside the draft [0, 4)");
  EXPECT_MASKATTN_ERROR(cache.accept(parents, Array<int64_t>({2}, {1, 3})),
                        "KVCache::accept: path[0] = 1 has parent 0, so it is not a root; an "
                        "accepted path is a chain of the tree: a root (parent -1), then a child "
                        "of each token in turn");
  EXPECT_MASKATTN_ERROR(cache.accept(parents, Array<int64_t>({3}, {0, 2, 3})),
                        "KVCache::accept: path[2] = 3 has parent 1, not path[1]");
  // Per sequence: the second sequence's path is checked too.
  EXPECT_MASKATTN_ERROR(cache.accept(parents, Array<int64_t>({2, 2}, {0, 1, 0, 0})),
                        "KVCache::accept: path[1,1] = 0 has parent -1, not path[1,0]");
  EXPECT_EQ(cache.length(), 6);
  EXPECT_EQ(keys_of(cache), before);
  EXPECT_MASKATTN_ERROR(tree_path(parents, 4), "tree_path: node 4 is outside the draft [0, 4)");
  EXPECT_MASKATTN_ERROR(tree_path(Array<int64_t>({2, 4}, {-1, 0, 0, 1, -1, 0, 0, 1}), 1, 2),
                        "tree_path: batch 2 is outside the parents [2,4] (one tree per sequence)");
}

}  // namespace
}  // namespace maskattn
