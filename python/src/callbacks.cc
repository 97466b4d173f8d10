#include "callbacks.h"

#include <limits>
#include <variant>

#include "maskattn/error.h"

namespace maskattn::python {
namespace {

// "ValueError: bad index" rather than nanobind's message with the traceback.
std::string describe(const nb::python_error& error) {
  return nb::cast<std::string>(error.type().attr("__name__")) + ": " +
         nb::cast<std::string>(nb::str(error.value()));
}

void record(CallbackFailure& failure, const char* what, const std::string& message) {
  std::lock_guard<std::mutex> guard(failure.lock);
  if (failure.message.empty())
    failure.message = std::string(what) + " raised " + message;  // first only
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
    return nb::cast<bool>((*callable)(b, h, i, j));
  } catch (const nb::python_error& error) {
    record(*failure, "mask predicate", describe(error));
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
    return nb::cast<double>((*callable)(score, b, h, i, j));
  } catch (const nb::python_error& error) {
    record(*failure, "score_fn", describe(error));
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
