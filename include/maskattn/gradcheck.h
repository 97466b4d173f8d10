// gradcheck(): checks attention_backward() against central finite differences of the f64
// reference forward, for the inputs, mask and modifiers given.
//
// The loss is L = Σ dout∘O. For every element x of q, k, v (and the bias and sinks when present)
// the check evaluates L at x ± step in f64 and divides by the exact distance between the two
// perturbed inputs as stored, so rounding of the step itself costs nothing. The analytic gradient
// is what attention_backward() returns with the given Options (its kernel and dtype).
// Finite differences cost two forwards per element: a tool for small problems.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "maskattn/attention.h"

namespace maskattn {

struct GradcheckOptions {
  double step = 1e-3;
  // Largest relative error that passes; default by dtype: f32 1e-4, f16 1e-2, bf16 5e-2.
  std::optional<double> tolerance;
};

struct GradcheckEntry {
  std::string tensor;        // "dq", "dk", "dv", "dbias", "dsinks"
  int64_t count = 0;         // elements compared
  double max_abs_error = 0;  // max |analytic − finite difference|
  // max |analytic − fd| / max |fd| over the tensor (the absolute error when every fd is 0).
  double max_relative_error = 0;
  double max_magnitude = 0;  // max |fd|
};

struct GradcheckReport {
  std::vector<GradcheckEntry> entries;
  double tolerance = 0;
  bool passed = false;  // every entry's max_relative_error ≤ tolerance, none NaN
};

// q, k, v, dout as attention_backward() takes them (any dtype, contiguous or not).
GradcheckReport gradcheck(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, const Mask& mask = {}, const ScoreMods& mods = {},
                          const Options& options = {}, const GradcheckOptions& check = {});

}  // namespace maskattn
