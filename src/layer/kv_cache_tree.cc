// Accepting a verified draft tree: KVCache::accept and accept_tree_path (maskattn/tree.h).
//
// Design. After one verification call with Mask::tree, the cache holds prefix + T draft rows in
// the tree's topological order; the verifier keeps one chain of them, root to some node, and the
// next step must see prefix + that chain as a plain sequence. The accepted rows are therefore
// moved down, in path order, to the rows right after the prefix, and the length shrinks to
// prefix + A. No row is copied elsewhere: a chain in topological order has strictly increasing
// indices, path[a] ≥ a, so moving row prefix + path[a] to prefix + a in increasing a never
// overwrites a row still to be moved (EAGLE's and vLLM's `tree accept` gather the accepted slots
// the same way: index_select of the cache along the sequence axis, then truncate).
//
// The same count for every sequence: a KVCache keeps one length for the whole batch (it appends
// the same number of positions to every sequence), so every sequence accepts the same number A of
// draft tokens. A sequence that accepted fewer keeps its extra accepted tokens or pads the path
// itself; the usual policy with batches is to accept the shortest count in every sequence.
//
// Everything is checked before the first row moves (E140, E142, E143), so an error leaves the
// cache as it was.
#include <cstring>
#include <string>
#include <vector>

#include "mask/tree.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"
#include "maskattn/kv_cache.h"
#include "maskattn/tree.h"
#include "validate.h"

namespace maskattn {

namespace {

// The accepted rows, checked: source rows (in path order) of each sequence, [B, A].
struct AcceptPlan {
  int64_t draft_first = 0;  // the first draft row: the length before the draft
  int64_t accepted = 0;     // A
  std::vector<int64_t> rows;
};

std::string at_text(int64_t b, int64_t a, bool batched) {
  std::string text = "[";
  if (batched) text += std::to_string(b) + ",";
  text += std::to_string(a);
  return text + "]";
}

// The path of sequence b must start at a root and go down one parent → child link per step.
void check_chain(const std::string& what, const Array<int64_t>& tree, const Array<int64_t>& path,
                 int64_t b, bool batched) {
  const int64_t size = tree.dim(1), count = path.dim(path.rank() - 1);
  const int64_t tree_row = tree.dim(0) == 1 ? 0 : b, path_row = batched ? b : 0;
  for (int64_t a = 0; a < count; ++a) {
    const int64_t node = path.values()[path_row * count + a];
    const std::string name = "path" + at_text(b, a, batched) + " = " + std::to_string(node);
    if (node < 0 || node >= size) {
      throw Error(what + ": " + name + " is outside the draft [0, " + std::to_string(size) + ")");
    }
    const int64_t parent = tree.at(tree_row, node);
    const int64_t expected = a == 0 ? -1 : path.values()[path_row * count + a - 1];
    if (parent == expected) continue;
    throw Error(what + ": " + name + " has parent " + std::to_string(parent) +
                (a == 0 ? ", so it is not a root" : ", not path" + at_text(b, a - 1, batched)) +
                "; an accepted path is a chain of the tree: a root (parent -1), then a child of "
                "each token in turn");
  }
}

AcceptPlan plan_accept(const std::string& what, int64_t batch, int64_t length,
                       const Array<int64_t>& parents, const Array<int64_t>& path) {
  const Array<int64_t> tree = detail::checked_parents(parents, what);
  const int64_t size = tree.dim(1);
  if (tree.dim(0) != 1 && tree.dim(0) != batch) {
    throw Error(what + ": parents have " + std::to_string(tree.dim(0)) +
                " rows (one tree per sequence) but the cache holds B=" + std::to_string(batch) +
                " sequences");
  }
  if (size > length) {
    throw Error(what + ": the draft of T=" + std::to_string(size) + " tokens is longer than the " +
                std::to_string(length) + " positions cached (the draft is the last T appended)");
  }
  const bool batched = path.rank() == 2;
  if ((path.rank() != 1 && !batched) || (batched && path.dim(0) != batch)) {
    throw Error(what + ": path has shape " + shape_string(path.shape()) +
                "; expected [A] (every sequence) or [B,A] with B=" + std::to_string(batch) +
                " (the same count A for every sequence: a cache holds one length)");
  }
  AcceptPlan plan{length - size, path.dim(path.rank() - 1), {}};
  plan.rows.reserve(batch * plan.accepted);
  for (int64_t b = 0; b < batch; ++b) {
    if (b == 0 || batched || tree.dim(0) > 1) check_chain(what, tree, path, b, batched);
    for (int64_t a = 0; a < plan.accepted; ++a) {
      plan.rows.push_back(plan.draft_first + path.values()[(batched ? b : 0) * plan.accepted + a]);
    }
  }
  return plan;
}

// Moves row plan.rows[b, a] to draft_first + a for every (b, head); rows never overlap (§ above).
void move_rows(const MutableTensorView& cache, const AcceptPlan& plan) {
  const size_t size = dtype_size(cache.dtype());
  auto* bytes = static_cast<uint8_t*>(cache.mutable_data());
  for (int64_t b = 0; b < cache.size(0); ++b) {
    for (int64_t h = 0; h < cache.size(1); ++h) {
      for (int64_t a = 0; a < plan.accepted; ++a) {
        const int64_t from = plan.rows[b * plan.accepted + a], to = plan.draft_first + a;
        if (from == to) continue;
        const int64_t source = cache.offset({b, h, from, 0}), target = cache.offset({b, h, to, 0});
        for (int64_t e = 0; e < cache.size(3); ++e) {
          const int64_t step = e * cache.stride(3);
          std::memcpy(bytes + (target + step) * size, bytes + (source + step) * size, size);
        }
      }
    }
  }
}

void check_cache_view(const std::string& what, const MutableTensorView& view, const char* name,
                      const MutableTensorView& k, int64_t length) {
  detail::require_view(view, 4, what + " " + name, "[B,H,L,D]");
  if (view.size(0) != k.size(0) || view.size(1) != k.size(1) || view.size(2) < length ||
      length < 0) {
    throw Error(what + ": k " + k.shape_string() + " and v " + view.shape_string() +
                " must be [B,H,L,D] and [B,H,L,Dv] with the same B and H, holding length = " +
                std::to_string(length) + " rows (L ≥ length ≥ 0)");
  }
}

}  // namespace

int64_t accept_tree_path(const MutableTensorView& k, const MutableTensorView& v, int64_t length,
                         const Array<int64_t>& parents, const Array<int64_t>& path) {
  const std::string what = "accept_tree_path";
  check_cache_view(what, k, "k", k, length);
  check_cache_view(what, v, "v", k, length);
  const AcceptPlan plan = plan_accept(what, k.size(0), length, parents, path);
  move_rows(k, plan);
  move_rows(v, plan);
  return plan.draft_first + plan.accepted;
}

void KVCache::accept(const Array<int64_t>& parents, const Array<int64_t>& path) {
  const AcceptPlan plan = plan_accept("KVCache::accept", batch_, length_, parents, path);
  const auto storage = [&](std::vector<uint8_t>& bytes, int64_t width) {
    return MutableTensorView(bytes.data(), dtype_, {batch_, kv_heads_, capacity_, width});
  };
  move_rows(storage(keys_, head_dim_), plan);
  move_rows(storage(values_, value_dim_), plan);
  length_ = plan.draft_first + plan.accepted;
}

}  // namespace maskattn
