// The pieces of the maskattn._core extension module, one file each (module.cc puts them together).
#pragma once

#include <nanobind/nanobind.h>

#include "maskattn/mask.h"

namespace maskattn::python {

namespace nb = nanobind;

void bind_programs(nb::module_& m);              // Program (bind_program.cc)
void bind_masks(nb::module_& m);                 // Mask, ScoreMods (bind_mask.cc)
void bind_mask_padding(nb::class_<Mask>& mask);  // key_/query_ lengths, starts, keep, pad_id
void bind_mask_dense(nb::class_<Mask>& mask);    // segments, spans, prefix, dense, predicate
void bind_mask_sparse(nb::class_<Mask>& mask);   // global_tokens, block_sparse (bind_sparse.cc)
void bind_layouts(nb::module_& m);               // bigbird/strided/fixed layout builders
void bind_mask_tree(nb::class_<Mask>& mask);     // Mask.tree (bind_tree.cc)
void bind_tree(nb::module_& m);                  // tree_position_ids, tree_path, accept_tree_path
void bind_attention(nb::module_& m);             // attention, backward, merge (bind_attention.cc)
void bind_inspection(nb::module_& m);            // allowed_pairs, block_map, weights, scores
void bind_tools(nb::module_& m);                 // audit, health, heatmaps, tokens (bind_tools.cc)
void bind_gpt(nb::module_& m);                   // the GPT model's loss and gradients (bind_gpt.cc)
void bind_dist(nb::module_& m);   // local_ranges, ring attention over MPI (bind_dist.cc)
void bind_paged(nb::module_& m);  // PagedKVCache, attention_paged (bind_paged.cc)
// attention over caller-owned pages (bind_paged_tensors.cc)
void bind_paged_tensors(nb::module_& m);

}  // namespace maskattn::python
