// Sparse attention from Python: Mask.global_tokens (Longformer), Mask.block_sparse (a block
// layout) and the builders of the common layouts (maskattn/sparse_layouts.h), which come back as
// uint8 NumPy arrays that Mask.block_sparse takes as they are. The builders' argument types are
// checked by the Python wrappers (maskattn/_layouts.py), so that a float or a bool is refused with
// maskattn.Error rather than nanobind's TypeError; their values are checked by the C++ builders.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "maskattn/mask.h"
#include "maskattn/sparse_layouts.h"

namespace maskattn::python {

using nb::arg;

void bind_mask_sparse(nb::class_<Mask>& mask) {
  mask.def(
          "global_tokens",
          [](Mask& self, nb::handle ids, nb::handle key_ids, nb::handle heads) -> Mask& {
            if (key_ids.is_none()) {
              return self.global_tokens(int_array(ids, "ids"), head_set(heads));
            }
            return self.global_tokens(int_array(ids, "ids"), int_array(key_ids, "key_ids"),
                                      head_set(heads));
          },
          arg("ids").none(), arg("key_ids") = nb::none(), arg("heads") = nb::none(),
          nb::rv_policy::reference,
          "Global tokens (Longformer's global_attention_mask): ids [B, L] or [L] (the same in "
          "every "
          "sequence), nonzero = global; any int or bool dtype. With key_ids, ids are the queries' "
          "[B, Lq] and key_ids the keys' [B, Lk]. A pair hidden by causal/window components is "
          "allowed again when its query or its key is global; padding, chunks, segments, layouts "
          "and dense masks still apply.")
      .def(
          "block_sparse",
          [](Mask& self, nb::handle layout, nb::handle block_q, nb::handle block_k) -> Mask& {
            const int64_t rows = int_value(block_q, "block_sparse: block_q");
            const int64_t cols =
                block_k.is_none() ? rows : int_value(block_k, "block_sparse: block_k");
            return self.block_sparse(bool_array(layout, "layout"), rows, cols);
          },
          arg("layout").none(), arg("block_q").none(), arg("block_k") = nb::none(),
          nb::rv_policy::reference,
          "Block-sparse layout [nQ, nK], [H, nQ, nK] or [B, H, nQ, nK] of 0/1 (bool or any int "
          "dtype): query i may attend key j iff layout[b, h, i // block_q, j // block_k] is 1 (row "
          "and column indices). nQ = ceil(Lq / block_q), nK = ceil(Lk / block_k), or 1 "
          "(broadcast). block_k=None: square blocks of block_q.");
}

void bind_layouts(nb::module_& m) {
  m.def(
      "bigbird_layout",
      [](int64_t blocks, int64_t sliding_blocks, int64_t global_blocks, int64_t random_blocks,
         uint64_t seed, int64_t heads) {
        const BigBirdLayout config{sliding_blocks, global_blocks, random_blocks, seed};
        return to_numpy(bigbird_layout(blocks, config, heads));
      },
      arg("blocks"), arg("sliding_blocks"), arg("global_blocks"), arg("random_blocks"), arg("seed"),
      arg("heads"));
  m.def(
      "strided_layout",
      [](int64_t blocks, int64_t local_blocks, int64_t stride, bool causal, int64_t heads) {
        return to_numpy(strided_layout(blocks, local_blocks, stride, causal, heads));
      },
      arg("blocks"), arg("local_blocks"), arg("stride"), arg("causal"), arg("heads"));
  m.def(
      "fixed_layout",
      [](int64_t blocks, int64_t chunk_blocks, int64_t summary_blocks, bool causal, int64_t heads) {
        return to_numpy(fixed_layout(blocks, chunk_blocks, summary_blocks, causal, heads));
      },
      arg("blocks"), arg("chunk_blocks"), arg("summary_blocks"), arg("causal"), arg("heads"));
}

}  // namespace maskattn::python
