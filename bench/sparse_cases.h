// Sparse benchmark masks for long documents (docs/benchmarks.md, "Sparse attention"): Longformer
// (a symmetric window plus global tokens) and BigBird (a block-sparse layout), structured or given
// as the dense keep matrix of the same pairs.
//   longformer:W:G[:spread]    window(W/2, W/2) and G global tokens: the first G tokens (a <cls>
//                              and a question), or spread evenly (":spread", section heads)
//   bigbird:BLOCK:S:G:R        block_sparse(bigbird_layout(L/BLOCK, {S, G, R, seed 0}), BLOCK,
//   BLOCK) dense-<either>             the same pairs as one [Lq, Lk] keep matrix (an L×L buffer)
#pragma once

#include <string>

#include "cases.h"

namespace maskattn::bench {

bool is_sparse_mask(const std::string& name);
Mask make_sparse_mask(const Case& c);

}  // namespace maskattn::bench
