// Python callables inside the C++ pipeline: a mask predicate (b, h, i, j) → bool and a score
// function (s, b, h, i, j) → s'.
//
// The library calls them from its OpenMP threads while the calling thread has released the GIL,
// so each call takes the GIL (they run one at a time: a per-pair Python callback is a debugging
// convenience, never a fast path — create_block_mask evaluates a mask_mod vectorised instead).
// An exception must not cross an OpenMP region (that would terminate the process), so a failing
// call records its message in the callback's shared slot and hides the pair; the binding raises
// it as maskattn.Error once the C++ call has returned (raise_callback_failures).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "maskattn/mask.h"
#include "maskattn/score_mods.h"

namespace maskattn::python {

namespace nb = nanobind;

struct CallbackFailure {
  std::mutex lock;
  std::string message;  // the first failure since the last reset; "" = none
};

// The Python object is released under the GIL whichever thread drops the last copy.
std::shared_ptr<nb::object> hold_callable(nb::handle callable);

struct PythonPredicate {
  std::shared_ptr<nb::object> callable;
  std::shared_ptr<CallbackFailure> failure = std::make_shared<CallbackFailure>();
  bool operator()(int64_t b, int64_t h, int64_t i, int64_t j) const;
};

struct PythonScoreFunction {
  std::shared_ptr<nb::object> callable;
  std::shared_ptr<CallbackFailure> failure = std::make_shared<CallbackFailure>();
  double operator()(double score, int64_t b, int64_t h, int64_t i, int64_t j) const;
};

// Before a call: forget earlier failures. After it: raise the first one as maskattn.Error.
void reset_callback_failures(const Mask* mask, const ScoreMods* mods);
void raise_callback_failures(const Mask* mask, const ScoreMods* mods);

}  // namespace maskattn::python
