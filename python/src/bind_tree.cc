// Draft trees of speculative decoding from Python: Mask.tree and the helpers of maskattn/tree.h
// (tree_position_ids, tree_path, accept_tree_path). The Python wrappers (maskattn/_tree.py)
// check the argument types the C++ API cannot see and return arrays in the caller's framework;
// the values are checked by the C++ library with the catalogue's messages (E140–E143).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "maskattn/mask.h"
#include "maskattn/tree.h"

namespace maskattn::python {

using nb::arg;

void bind_mask_tree(nb::class_<Mask>& mask) {
  mask.def(
      "tree",
      [](Mask& self, nb::handle parents, nb::handle heads) -> Mask& {
        return self.tree(index_array(parents, "tree: parents"), head_set(heads));
      },
      arg("parents").none(), arg("heads") = nb::none(), nb::rv_policy::reference,
      "A draft tree of speculative decoding: parents [T] (every sequence) or [B, T] (one tree per "
      "sequence), integers, parents[t] in [-1, t), -1 for a root (a child of the cached prefix). "
      "The last T keys and the last T queries are the draft (row indices, bottom-right): a draft "
      "query sees every key before the draft and, in the draft, its ancestors and itself; a "
      "query before the draft is causal. In attention_paged and attention_varlen each "
      "sequence's draft is its own last T positions.");
}

void bind_tree(nb::module_& m) {
  // For the package's own paths that place a batch's sequences (maskattn.torch's contiguous
  // KV cache): whether a draft tree must sit at each sequence's own end.
  m.def(
      "mask_has_tree",
      [](const Mask& mask) {
        for (const Component& c : mask.components()) {
          if (std::holds_alternative<component::Tree>(c)) return true;
        }
        return false;
      },
      arg("mask"));
  m.def(
      "tree_position_ids",
      [](nb::handle parents, int64_t prefix_length) {
        return to_numpy(
            tree_position_ids(index_array(parents, "tree_position_ids: parents"), prefix_length));
      },
      arg("parents").none(), arg("prefix_length"));
  m.def(
      "tree_path",
      [](nb::handle parents, int64_t node, int64_t batch) {
        return tree_path(index_array(parents, "tree_path: parents"), node, batch);
      },
      arg("parents").none(), arg("node"), arg("batch"));
  m.def(
      "accept_tree_path",
      [](const OutputArray& k, const std::string& k_element, const OutputArray& v,
         const std::string& v_element, int64_t length, nb::handle parents, nb::handle path) {
        const MutableTensorView kv = output_view(k, "k", k_element);
        const MutableTensorView vv = output_view(v, "v", v_element);
        return accept_tree_path(kv, vv, length, index_array(parents, "accept_tree_path: parents"),
                                index_array(path, "accept_tree_path: path"));
      },
      arg("k"), arg("k_element"), arg("v"), arg("v_element"), arg("length"), arg("parents").none(),
      arg("path").none());
}

}  // namespace maskattn::python
