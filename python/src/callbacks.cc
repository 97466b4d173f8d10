#include "callbacks.h"

#include <nanobind/stl/string.h>  // nb::cast<std::string>; without it the cast throws bad_cast

#include <limits>
#include <stdexcept>
#include <variant>

#include "maskattn/error.h"

namespace maskattn::python {
namespace {

// "ValueError: bad index" rather than nanobind's message with the traceback.
std::string describe(const nb::python_error& error) {
  return nb::cast<std::string>(error.type().attr("__name__")) + ": " +
         nb::cast<std::string>(nb::str(error.value()));
}

// "1 (int)": what a callback returned, for the message when it is not what it must return.
std::string value_and_type(nb::handle value) {
  return nb::cast<std::string>(nb::repr(value)) + " (" +
         nb::cast<std::string>(nb::type_name(value.type())) + ")";
}

// A predicate's answer: Python's bool, or a one-element boolean of NumPy or PyTorch (numpy.bool_,
// a 0-d torch.bool tensor), which is what indexing a boolean array returns. Anything else is an
// error rather than a truth value, so that a predicate returning a score or a count is caught.
bool predicate_answer(nb::handle result) {
  if (result.is(nb::handle(Py_True))) return true;
  if (result.is(nb::handle(Py_False))) return false;
  if (nb::hasattr(result, "dtype") && nb::hasattr(result, "shape")) {
    const std::string dtype = nb::cast<std::string>(nb::str(nb::object(result.attr("dtype"))));
    const bool boolean = dtype == "bool" || dtype == "torch.bool";
    if (boolean && nb::len(nb::object(result.attr("shape"))) == 0) {
      const int truth = PyObject_IsTrue(result.ptr());
      if (truth < 0) throw nb::python_error();
      return truth == 1;
    }
  }
  throw std::invalid_argument("returned " + value_and_type(result) + "; it must return a bool");
}

// A score function's answer: any real number (float, int, numpy.float32, a 0-d tensor).
double score_answer(nb::handle result) {
  if (PyNumber_Check(result.ptr()) && !PyComplex_Check(result.ptr())) {
    const double value = PyFloat_AsDouble(result.ptr());
    if (!(value == -1.0 && PyErr_Occurred())) return value;
    PyErr_Clear();
  }
  throw std::invalid_argument("returned " + value_and_type(result) + "; it must return a number");
}

void record(CallbackFailure& failure, const char* what, const std::string& message) {
  std::lock_guard<std::mutex> guard(failure.lock);
  if (failure.message.empty()) failure.message = std::string(what) + " " + message;  // first only
}

template <typename Visit>
void for_each_failure(const Mask* mask, const ScoreMods* mods, Visit visit) {
  if (mask != nullptr) {
    for (const Component& component : mask->components()) {
      const auto* predicate = std::get_if<component::Predicate>(&component);
      if (predicate == nullptr) continue;
      if (const auto* python = predicate->allows.target<PythonPredicate>()) visit(*python->failure);
    }
  }
  if (mods != nullptr && mods->score_fn) {
    if (const auto* python = mods->score_fn.target<PythonScoreFunction>()) visit(*python->failure);
  }
}

}  // namespace

std::shared_ptr<nb::object> hold_callable(nb::handle callable) {
  if (!PyCallable_Check(callable.ptr())) {
    throw Error("expected a callable, got " + nb::cast<std::string>(nb::repr(callable)));
  }
  return std::shared_ptr<nb::object>(new nb::object(nb::borrow(callable)), [](nb::object* held) {
    nb::gil_scoped_acquire gil;
    delete held;
  });
}

bool PythonPredicate::operator()(int64_t b, int64_t h, int64_t i, int64_t j) const {
  nb::gil_scoped_acquire gil;
  try {
    return predicate_answer((*callable)(b, h, i, j));
  } catch (const nb::python_error& error) {
    record(*failure, "mask predicate", "raised " + describe(error));
    return false;
  } catch (const std::exception& error) {
    record(*failure, "mask predicate", error.what());
    return false;
  }
}

double PythonScoreFunction::operator()(double score, int64_t b, int64_t h, int64_t i,
                                       int64_t j) const {
  nb::gil_scoped_acquire gil;
  try {
    return score_answer((*callable)(score, b, h, i, j));
  } catch (const nb::python_error& error) {
    record(*failure, "score_fn", "raised " + describe(error));
    return -std::numeric_limits<double>::infinity();
  } catch (const std::exception& error) {
    record(*failure, "score_fn", error.what());
    return -std::numeric_limits<double>::infinity();
  }
}

void reset_callback_failures(const Mask* mask, const ScoreMods* mods) {
  for_each_failure(mask, mods, [](CallbackFailure& failure) {
    std::lock_guard<std::mutex> guard(failure.lock);
    failure.message.clear();
  });
}

void raise_callback_failures(const Mask* mask, const ScoreMods* mods) {
  std::string message;
  for_each_failure(mask, mods, [&](CallbackFailure& failure) {
    std::lock_guard<std::mutex> guard(failure.lock);
    if (message.empty()) message = failure.message;
  });
  if (!message.empty()) throw Error(message);
}

}  // namespace maskattn::python
