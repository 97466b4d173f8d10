// Cross-entropy of next-token logits over the real tokens only (PyTorch's F.cross_entropy with
// ignore_index, reduction "mean"):
//
//   loss = (1/N) Σ_{rows with target ≠ ignore} (logsumexp(z_row) − z_row[target]),
//   dz_row = (softmax(z_row) − onehot(target)) / N  for those rows, 0 for ignored ones,
//
// N the number of real rows. A batch with no real row has loss 0 and zero gradients (PyTorch
// gives NaN there; a padded batch of nothing has nothing to learn). Rows are independent; the
// loss is summed in row order in f64, so it is the same bits for any thread count.
#pragma once

#include <cstdint>

namespace maskattn::model {

struct CrossEntropy {
  double loss = 0;        // the mean over real rows
  int64_t real_rows = 0;  // N
};

// logits [rows, vocab]; targets [rows], each in [0, vocab) or `ignore`. dlogits [rows, vocab]
// (may be null: loss only; may equal logits: overwritten in place).
CrossEntropy cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int32_t ignore, float* dlogits, int threads);

}  // namespace maskattn::model
