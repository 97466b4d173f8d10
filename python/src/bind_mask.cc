// maskattn.Mask, maskattn.ScoreMods: the C++ builder with the same names, chainable (each method
// returns the mask itself) and combinable with `&`. Arrays are copied in (a Mask owns its data, so
// that it can be reused across calls while the caller's arrays change).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "callbacks.h"
#include "maskattn/error.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "program_tables.h"

namespace maskattn::python {
namespace {

using nb::arg;

Alignment alignment_named(const std::string& name) {
  if (name == "bottom_right" || name == "bottom-right") return Alignment::bottom_right;
  if (name == "top_left" || name == "top-left") return Alignment::top_left;
  throw Error("alignment must be \"bottom_right\" or \"top_left\", got \"" + name + "\"");
}

const char* alignment_name(Alignment alignment) {
  return alignment == Alignment::top_left ? "top_left" : "bottom_right";
}

int64_t window_side(nb::handle side) {
  return side.is_none() ? kUnbounded : int_value(side, "window side");
}

std::vector<int64_t> int_list(nb::handle values, const char* name) {
  const Array<int64_t> array = int_array(values, name);
  if (array.rank() != 1) {
    throw Error(std::string(name) + " must be one value per sequence (rank 1), got shape " +
                shape_string(array.shape()));
  }
  return array.values();
}

// One float per query head (ALiBi slopes, sinks): a rank-1 array, not something flattened.
std::vector<float> float_list(nb::handle values, const char* name) {
  const Array<float> array = float_array(values, name);
  if (array.rank() != 1) {
    throw Error(std::string(name) + " must be one value per query head (rank 1), got shape " +
                shape_string(array.shape()));
  }
  return array.values();
}

void bind_mask_class(nb::module_& m) {
  nb::class_<Mask> mask(m, "Mask",
                        "Which (query, key) pairs may attend: the intersection of its components "
                        "(docs/semantics.md). An empty Mask allows every pair.");
  mask.def(nb::init<>())
      .def(
          "causal",
          [](Mask& self, std::optional<std::string> alignment, nb::handle heads) -> Mask& {
            return alignment ? self.causal(alignment_named(*alignment), head_set(heads))
                             : self.causal(head_set(heads));
          },
          arg("alignment") = nb::none(), arg("heads") = nb::none(), nb::rv_policy::reference)
      .def(
          "window",
          [](Mask& self, nb::handle left, nb::handle right, nb::handle heads) -> Mask& {
            return self.window(window_side(left), window_side(right), head_set(heads));
          },
          arg("left").none(), arg("right").none() = 0, arg("heads") = nb::none(),
          nb::rv_policy::reference)
      .def(
          "sliding_window",
          [](Mask& self, int64_t keys, nb::handle heads) -> Mask& {
            return self.sliding_window(keys, head_set(heads));
          },
          arg("keys"), arg("heads") = nb::none(), nb::rv_policy::reference)
      .def(
          "chunk",
          [](Mask& self, int64_t size, nb::handle heads) -> Mask& {
            return self.chunk(size, head_set(heads));
          },
          arg("size"), arg("heads") = nb::none(), nb::rv_policy::reference);
  bind_mask_padding(mask);
  bind_mask_dense(mask);
  bind_mask_sparse(mask);
  bind_mask_tree(mask);
  mask.def(
          "set_alignment",
          [](Mask& self, const std::string& alignment) -> Mask& {
            return self.set_alignment(alignment_named(alignment));
          },
          arg("alignment"), nb::rv_policy::reference)
      .def_prop_ro("alignment", [](const Mask& self) { return alignment_name(self.alignment()); })
      .def("__and__", [](const Mask& a, const Mask& b) { return a & b; })
      .def("describe", &Mask::describe)
      .def("__len__", [](const Mask& self) { return self.components().size(); })
      .def("__repr__", [](const Mask& self) { return "maskattn.Mask(" + self.describe() + ")"; })
      .def("__copy__", [](const Mask& self) { return Mask(self); })
      .def(
          "__deepcopy__", [](const Mask& self, nb::handle) { return Mask(self); }, arg("memo"));
}

}  // namespace

void bind_mask_padding(nb::class_<Mask>& mask) {
  // The four padding forms, for keys and for queries.
  for (const bool keys : {true, false}) {
    const std::string side = keys ? "key" : "query";
    mask.def((side + "_lengths").c_str(),
             [keys](Mask& self, nb::handle lengths) -> Mask& {
               auto values = int_list(lengths, "lengths");
               return keys ? self.key_lengths(values) : self.query_lengths(values);
             },
             arg("lengths").none(), nb::rv_policy::reference)
        .def((side + "_starts").c_str(),
             [keys](Mask& self, nb::handle starts) -> Mask& {
               auto values = int_list(starts, "starts");
               return keys ? self.key_starts(values) : self.query_starts(values);
             },
             arg("starts").none(), nb::rv_policy::reference)
        .def((side + "_keep").c_str(),
             [keys](Mask& self, nb::handle keep) -> Mask& {
               auto values = int_array(keep, "keep");
               return keys ? self.key_keep(values) : self.query_keep(values);
             },
             arg("keep").none(), nb::rv_policy::reference)
        .def((side + "_pad_id").c_str(),
             [keys](Mask& self, nb::handle token_ids, int64_t pad_id) -> Mask& {
               auto ids = int_array(token_ids, "token_ids");
               return keys ? self.key_pad_id(ids, pad_id) : self.query_pad_id(ids, pad_id);
             },
             arg("token_ids").none(), arg("pad_id") = 0, nb::rv_policy::reference);
  }
}

void bind_mask_dense(nb::class_<Mask>& mask) {
  mask.def(
          "segments",
          [](Mask& self, nb::handle ids, nb::handle key_ids, nb::handle heads) -> Mask& {
            if (key_ids.is_none()) return self.segments(int_array(ids, "ids"), head_set(heads));
            return self.segments(int_array(ids, "ids"), int_array(key_ids, "key_ids"),
                                 head_set(heads));
          },
          arg("ids").none(), arg("key_ids") = nb::none(), arg("heads") = nb::none(),
          nb::rv_policy::reference)
      .def(
          "spans",
          [](Mask& self, nb::handle ids, nb::handle key_ids, nb::handle heads) -> Mask& {
            if (key_ids.is_none()) return self.spans(int_array(ids, "ids"), head_set(heads));
            return self.spans(int_array(ids, "ids"), int_array(key_ids, "key_ids"),
                              head_set(heads));
          },
          arg("ids").none(), arg("key_ids") = nb::none(), arg("heads") = nb::none(),
          nb::rv_policy::reference)
      .def(
          "prefix_lm",
          [](Mask& self, int64_t length, nb::handle heads) -> Mask& {
            return self.prefix_lm(length, head_set(heads));
          },
          arg("length"), arg("heads") = nb::none(), nb::rv_policy::reference)
      .def(
          "keep",
          [](Mask& self, nb::handle keep) -> Mask& { return self.keep(bool_array(keep, "keep")); },
          arg("keep").none(), nb::rv_policy::reference)
      .def(
          "blocked",
          [](Mask& self, nb::handle blocked) -> Mask& {
            return self.blocked(bool_array(blocked, "blocked"));
          },
          arg("blocked").none(), nb::rv_policy::reference)
      .def(
          "additive",
          [](Mask& self, nb::handle values) -> Mask& {
            return self.additive(float_array(values, "additive"));
          },
          arg("values").none(), nb::rv_policy::reference)
      .def(
          "predicate",
          [](Mask& self, nb::handle allows, const std::string& name) -> Mask& {
            return self.predicate(PythonPredicate{hold_callable(allows)}, name);
          },
          arg("allows"), arg("name") = "predicate", nb::rv_policy::reference)
      .def(
          "program",
          [](Mask& self, nb::handle program, nb::kwargs tables) -> Mask& {
            return self.program(program_of(program, tables, ProgramKind::mask));
          },
          arg("program"), arg("tables"), nb::rv_policy::reference,
          "A mask program: its text (q and kv are row indices, top-left as FlexAttention's "
          "q_idx/kv_idx) with its tables as keywords (NumPy arrays or CPU tensors, read in "
          "place), e.g. program('doc[q] == doc[kv]', doc=ids); or a maskattn.Program.");
}

namespace {

// ScoreMods(program=): a maskattn.Program, its text, or (text, {name: table}).
Program score_program(nb::handle program) {
  if (nb::isinstance<nb::tuple>(program) && nb::len(program) == 2) {
    nb::handle tables = program[1];
    if (!nb::isinstance<nb::dict>(tables)) {
      throw Error("program=(text, tables): tables must be a dict {name: array}, got " +
                  nb::cast<std::string>(nb::type_name(tables.type())));
    }
    return program_of(program[0], nb::borrow<nb::dict>(tables), ProgramKind::score);
  }
  if (nb::isinstance<nb::tuple>(program)) {
    throw Error(
        "program must be a maskattn.Program, its text, or (text, {name: table}); got a "
        "tuple of " +
        std::to_string(nb::len(program)));
  }
  return program_of(program, nb::dict(), ProgramKind::score);
}

}  // namespace

void bind_score_mods(nb::module_& m) {
  nb::class_<ScoreMods>(m, "ScoreMods",
                        "What happens to an allowed pair's scaled score before the softmax: "
                        "softcap → ALiBi + bias + additive masks → score_fn or program → "
                        "threshold.")
      .def(
          "__init__",
          [](ScoreMods* self, std::optional<double> softcap, nb::handle alibi_slopes,
             nb::handle bias, nb::handle score_fn, std::optional<double> threshold,
             nb::handle sinks, nb::handle program) {
            auto* mods = new (self) ScoreMods();
            mods->softcap = softcap;
            mods->threshold = threshold;
            if (!alibi_slopes.is_none()) {
              mods->alibi_slopes = float_list(alibi_slopes, "alibi_slopes");
            }
            if (!bias.is_none()) mods->bias = float_array(bias, "bias");
            if (!score_fn.is_none()) mods->score_fn = PythonScoreFunction{hold_callable(score_fn)};
            if (!sinks.is_none()) mods->sinks = float_list(sinks, "sinks");
            if (!program.is_none()) {
              if (mods->score_fn) {
                throw Error(
                    "ScoreMods: give score_fn or program, not both (a program takes "
                    "score_fn's place)");
              }
              mods->program = score_program(program);
            }
          },
          nb::kw_only(), arg("softcap") = nb::none(), arg("alibi_slopes") = nb::none(),
          arg("bias") = nb::none(), arg("score_fn") = nb::none(), arg("threshold") = nb::none(),
          arg("sinks") = nb::none(), arg("program") = nb::none())
      .def_ro("softcap", &ScoreMods::softcap)
      .def_ro("threshold", &ScoreMods::threshold)
      .def_ro("alibi_slopes", &ScoreMods::alibi_slopes)
      .def_ro("sinks", &ScoreMods::sinks)
      // A read-only view of the object's own values (kept alive by it), not a copy per access:
      // the backward reads the bias's shape on every call, and a bias can be L×L.
      .def_prop_ro("bias",
                   [](nb::handle self) -> nb::object {
                     const ScoreMods& mods = nb::cast<const ScoreMods&>(self);
                     if (!mods.bias) return nb::none();
                     const Dims& dims = mods.bias->shape();
                     const std::vector<size_t> shape(dims.begin(), dims.end());
                     return nb::cast(nb::ndarray<nb::numpy, const float>(
                         mods.bias->data(), shape.size(), shape.data(), self));
                   })
      .def_prop_ro("has_score_fn", [](const ScoreMods& self) { return bool(self.score_fn); })
      .def_ro("program", &ScoreMods::program)
      .def("empty", &ScoreMods::empty)
      .def("__repr__", [](const ScoreMods& self) {
        std::string text = "maskattn.ScoreMods(";
        auto add = [&](const std::string& part) {
          if (text.back() != '(') text += ", ";
          text += part;
        };
        if (self.softcap) add("softcap=" + std::to_string(*self.softcap));
        if (!self.alibi_slopes.empty())
          add("alibi_slopes[" + std::to_string(self.alibi_slopes.size()) + "]");
        if (self.bias) add("bias" + shape_string(self.bias->shape()));
        if (self.score_fn) add("score_fn");
        if (self.program) add("program='" + self.program->text() + "'");
        if (self.threshold) add("threshold=" + std::to_string(*self.threshold));
        if (!self.sinks.empty()) add("sinks[" + std::to_string(self.sinks.size()) + "]");
        return text + ")";
      });
}

void bind_masks(nb::module_& m) {
  m.attr("UNBOUNDED") = kUnbounded;
  bind_mask_class(m);
  bind_score_mods(m);
}

}  // namespace maskattn::python
