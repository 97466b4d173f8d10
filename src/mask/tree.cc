// Draft trees of speculative decoding: Mask::tree and the helpers of maskattn/tree.h.
//
// Design. Tree speculative decoding (SpecInfer, Medusa, EAGLE, vLLM's tree attention) verifies
// many drafted continuations in one forward pass: the draft tokens are appended to the KV cache
// as a tree in topological order, and each draft query may see the cached prefix and its own
// ancestors, never a sibling branch. Those libraries build the draft block of the mask as a dense
// T × T matrix (Medusa's `medusa_attn_mask`, EAGLE's `tree_mask`) and paste it into the causal
// mask's last rows. maskattn keeps the tree itself, T parent indices, and answers "does draft
// token s descend from t?" in O(1): a pre-order walk of the forest numbers every token, and a
// subtree is then one interval of numbers (enter[t] ≤ enter[s] < leave[t]). Storage is O(B·T),
// nothing is ever T × T, and the block map and the tile masks read the same two arrays.
//
// The numbering needs no stack: subtree sizes come from one backward pass (parents precede their
// children, so each child's size is final before it is added to its parent), and a forward pass
// then hands each token the next free number inside its parent's interval (children in index
// order; roots one after another).
#include "mask/tree.h"

#include <utility>

#include "maskattn/error.h"
#include "maskattn/tree.h"

namespace maskattn {

namespace detail {

namespace {

std::string index_text(int64_t row, int64_t t, bool batched) {
  return batched ? "[" + std::to_string(row) + "," + std::to_string(t) + "]"
                 : "[" + std::to_string(t) + "]";
}

}  // namespace

Array<int64_t> checked_parents(Array<int64_t> parents, const std::string& what) {
  if (parents.rank() != 1 && parents.rank() != 2) {
    throw Error(what + ": parents has shape " + shape_string(parents.shape()) +
                "; expected [T] (every sequence) or [B,T] (one tree per sequence)");
  }
  if (parents.numel() == 0) {
    throw Error(what + ": parents has shape " + shape_string(parents.shape()) +
                "; a draft tree holds at least one token (with no draft, use causal())");
  }
  const bool batched = parents.rank() == 2;
  if (!batched) parents = Array<int64_t>({1, parents.dim(0)}, parents.values());
  for (int64_t row = 0; row < parents.dim(0); ++row) {
    for (int64_t t = 0; t < parents.dim(1); ++t) {
      const int64_t parent = parents.at(row, t);
      if (parent < -1 || parent >= t) {
        throw Error(what + ": parents" + index_text(row, t, batched) + " = " +
                    std::to_string(parent) +
                    " must be -1 (a root, a child of the cached prefix) or an earlier token's "
                    "index, in [0, " +
                    std::to_string(t) + "): parents come before their children");
      }
    }
  }
  return parents;
}

void number_tree(const Array<int64_t>& parents, std::vector<int64_t>& enter,
                 std::vector<int64_t>& leave) {
  const int64_t rows = parents.dim(0), size = parents.dim(1);
  enter.assign(rows * size, 0);
  leave.assign(rows * size, 1);  // subtree sizes first, then the ends of the intervals
  std::vector<int64_t> next(size);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t* first = enter.data() + row * size;
    int64_t* end = leave.data() + row * size;
    for (int64_t t = size - 1; t >= 0; --t) {
      if (parents.at(row, t) >= 0) end[parents.at(row, t)] += end[t];
    }
    int64_t next_root = 0;
    for (int64_t t = 0; t < size; ++t) {
      const int64_t parent = parents.at(row, t);
      int64_t& slot = parent < 0 ? next_root : next[parent];
      first[t] = slot;
      slot += end[t];
      next[t] = first[t] + 1;  // t's first child comes right after t
      end[t] += first[t];
    }
  }
}

}  // namespace detail

Mask& Mask::tree(Array<int64_t> parents, HeadSet heads) {
  const std::string label = "tree" + shape_string(parents.shape());
  component::Tree tree;
  tree.parents = detail::checked_parents(std::move(parents), "tree");
  detail::number_tree(tree.parents, tree.enter, tree.leave);
  tree.heads = std::move(heads);
  return add(std::move(tree), label);
}

Mask& Mask::tree(std::vector<int64_t> parents, HeadSet heads) {
  const int64_t count = static_cast<int64_t>(parents.size());
  return tree(Array<int64_t>({count}, std::move(parents)), std::move(heads));
}

Array<int64_t> tree_position_ids(const Array<int64_t>& parents, int64_t prefix_length) {
  const Array<int64_t> rows = detail::checked_parents(parents, "tree_position_ids");
  if (prefix_length < 0) {
    throw Error("tree_position_ids: prefix_length = " + std::to_string(prefix_length) +
                " is negative; it is the number of positions cached before the draft");
  }
  std::vector<int64_t> positions(rows.values().size());
  const int64_t size = rows.dim(1);
  for (int64_t row = 0; row < rows.dim(0); ++row) {
    for (int64_t t = 0; t < size; ++t) {
      const int64_t parent = rows.at(row, t);
      positions[row * size + t] = parent < 0 ? prefix_length : positions[row * size + parent] + 1;
    }
  }
  return Array<int64_t>(parents.shape(), std::move(positions));
}

std::vector<int64_t> tree_path(const Array<int64_t>& parents, int64_t node, int64_t batch) {
  const Array<int64_t> rows = detail::checked_parents(parents, "tree_path");
  if (batch < 0 || (rows.dim(0) > 1 && batch >= rows.dim(0))) {
    throw Error("tree_path: batch " + std::to_string(batch) + " is outside the parents " +
                shape_string(parents.shape()) + " (one tree per sequence)");
  }
  if (node < 0 || node >= rows.dim(1)) {
    throw Error("tree_path: node " + std::to_string(node) + " is outside the draft [0, " +
                std::to_string(rows.dim(1)) + ")");
  }
  const int64_t row = rows.dim(0) == 1 ? 0 : batch;
  std::vector<int64_t> path;
  for (int64_t t = node; t >= 0; t = rows.at(row, t)) path.push_back(t);
  return {path.rbegin(), path.rend()};
}

}  // namespace maskattn
