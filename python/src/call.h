// What every binding that computes does: default mask and modifiers, Options from keyword
// arguments, optional outputs, and running the call with the GIL released.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "callbacks.h"
#include "maskattn/attention.h"

namespace maskattn::python {

const Mask& mask_or_none(const Mask* mask);            // None → a mask that allows every pair
const ScoreMods& mods_or_none(const ScoreMods* mods);  // None → no modifiers

Options options_of(std::optional<double> scale, int threads, const std::string& kernel,
                   const std::string& products, bool check_finite);

// frame=: None → the whole problem; else [q_offset, k_offset, q_total, k_total] (the Python layer
// checked there are four integers).
Frame frame_of(const std::optional<std::vector<int64_t>>& frame);

MutableTensorView optional_output(const std::optional<OutputArray>& array, const char* name,
                                  const std::string& element);

// Runs `compute` without the GIL, with the callbacks' failures reset before and raised after.
template <typename Compute>
void compute_released(const Mask* mask, const ScoreMods* mods, Compute compute) {
  reset_callback_failures(mask, mods);
  {
    nb::gil_scoped_release released;
    compute();
  }
  raise_callback_failures(mask, mods);
}

}  // namespace maskattn::python
