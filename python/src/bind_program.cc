// Expression programs from Python (maskattn/program.h): maskattn.Program (compile, inspect,
// evaluate one pair or one tile), Mask.program and ScoreMods(program=).
//
// A program's tables are borrowed, not copied: a NumPy array or a CPU torch tensor is read in
// place with its strides, and the ProgramTable's owner holds a reference to the Python object
// (released under the GIL), so the memory lives as long as any Program, Mask or ScoreMods using
// it. A tensor that requires grad is read through .detach() (the same memory). Anything else
// NumPy can read (a list) is converted once, to int64, float32 or bool by its kind.
#include "program_tables.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "maskattn/error.h"
#include "maskattn/program.h"

namespace maskattn::python {
namespace {

using nb::arg;

std::string repr_of(nb::handle value) {
  return nb::cast<std::string>(nb::repr(value));
}

// The object whose memory the table reads: a tensor detached, a non-array converted by NumPy.
nb::object table_object(nb::handle value, const std::string& what) {
  if (nb::hasattr(value, "detach") && nb::hasattr(value, "device")) {
    const std::string device = nb::cast<std::string>(nb::str(nb::object(value.attr("device"))));
    if (device != "cpu") {
      throw Error(what + " is a tensor on " + device +
                  "; program tables are read in CPU memory: " + "move it with .cpu()");
    }
    return value.attr("detach")();
  }
  if (nb::hasattr(value, "__dlpack__") || nb::hasattr(value, "__array_interface__")) {
    return nb::borrow(value);
  }
  nb::module_ numpy = nb::module_::import_("numpy");
  nb::object array;
  try {
    array = numpy.attr("asarray")(value);
  } catch (const nb::python_error& error) {
    throw Error(what +
                " cannot be read as an array: " + nb::cast<std::string>(nb::str(error.value())));
  }
  const char kind = nb::cast<std::string>(array.attr("dtype").attr("kind"))[0];
  const char* dtype = kind == 'b' ? "bool" : kind == 'f' ? "float32" : "int64";
  if (kind != 'b' && kind != 'f' && kind != 'i' && kind != 'u') {
    throw Error(what + " = " + repr_of(value) + " is not an array of numbers or bools");
  }
  return numpy.attr("ascontiguousarray")(array, nb::arg("dtype") = numpy.attr(dtype));
}

ProgramTableType table_type(const nb::dlpack::dtype dtype, const std::string& what,
                            const std::string& shape) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Int && dtype.bits == 64) return ProgramTableType::int64;
    if (code == nb::dlpack::dtype_code::Int && dtype.bits == 32) return ProgramTableType::int32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) {
      return ProgramTableType::float32;
    }
    if (code == nb::dlpack::dtype_code::Bool && dtype.bits == 8) return ProgramTableType::boolean;
  }
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string name =
      dtype.code < 7 ? kinds[dtype.code] : "code " + std::to_string(dtype.code);
  throw Error(what + " (shape " + shape + ") has dtype " + name +
              (code == nb::dlpack::dtype_code::Bool ? "" : std::to_string(dtype.bits)) +
              "; program tables hold int64, int32, float32 or bool: convert it (.float() or "
              ".long() for a tensor, .astype(numpy.float32) for an array)");
}

}  // namespace

ProgramTable program_table(const std::string& name, nb::handle value) {
  const std::string what = "program table '" + name + "'";
  nb::object held = table_object(value, what);
  nb::ndarray<nb::ro> array;
  try {
    array = nb::cast<nb::ndarray<nb::ro>>(held);
  } catch (const std::exception&) {
    throw Error(what + " (" + nb::cast<std::string>(nb::type_name(held.type())) +
                ") cannot be read through DLPack or the buffer protocol");
  }
  if (array.device_type() != nb::device::cpu::value) {
    throw Error(what + " is not in CPU memory (DLPack device type " +
                std::to_string(array.device_type()) + "); move it with .cpu()");
  }
  ProgramTable table;
  table.name = name;
  table.data = array.data();
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    table.sizes.push_back(static_cast<int64_t>(array.shape(axis)));
    table.strides.push_back(static_cast<int64_t>(array.stride(axis)));
  }
  table.type = table_type(array.dtype(), what, shape_string(table.sizes));
  // The Python object keeps the memory alive; it is released under the GIL by whichever thread
  // drops the last Program holding it.
  table.owner = std::shared_ptr<const void>(new nb::object(std::move(held)), [](const void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const nb::object*>(p);
  });
  return table;
}

std::vector<ProgramTable> program_tables(const nb::dict& tables) {
  std::vector<ProgramTable> result;
  for (auto [key, value] : tables) {
    if (!nb::isinstance<nb::str>(key)) {
      throw Error("program table names must be strings, got " + repr_of(key));
    }
    result.push_back(program_table(nb::cast<std::string>(key), value));
  }
  return result;
}

Program program_of(nb::handle program, const nb::dict& tables, ProgramKind kind) {
  if (nb::isinstance<Program>(program)) {
    if (tables.size() > 0) {
      throw Error(
          "a compiled maskattn.Program already holds its tables; give tables only with "
          "the program's text");
    }
    return nb::cast<Program>(program);
  }
  if (!nb::isinstance<nb::str>(program)) {
    throw Error("program must be the program's text (a str) or a maskattn.Program, got " +
                nb::cast<std::string>(nb::type_name(program.type())));
  }
  const std::string text = nb::cast<std::string>(program);
  return kind == ProgramKind::mask ? Program::mask(text, program_tables(tables))
                                   : Program::score(text, program_tables(tables));
}

namespace {

std::string describe(const Program& program) {
  std::string text = std::string("maskattn.Program.") +
                     (program.kind() == ProgramKind::mask ? "mask" : "score") + "('" +
                     program.text() + "'";
  for (const ProgramTable& table : program.tables()) {
    text += ", " + table.name + "=<" + shape_string(table.sizes) + ">";
  }
  return text + ")";
}

nb::list table_names(const Program& program) {
  nb::list names;
  for (const ProgramTable& table : program.tables()) names.append(table.name);
  return names;
}

// [(name, dtype, shape)]: what a caller allocating the tables' gradients needs.
nb::list table_list(const Program& program) {
  static const char* const kTypes[] = {"int64", "int32", "float32", "bool"};
  nb::list list;
  for (const ProgramTable& table : program.tables()) {
    nb::list shape;
    for (const int64_t size : table.sizes) shape.append(size);
    list.append(nb::make_tuple(table.name, kTypes[static_cast<int>(table.type)], nb::tuple(shape)));
  }
  return list;
}

void bind_program_evaluation(nb::class_<Program>& cls) {
  cls.def(
         "check",
         [](const Program& self, int64_t batch, int64_t heads, int64_t q_len, int64_t k_len) {
           self.check(ProgramDomain{batch, heads, q_len, k_len});
         },
         arg("batch"), arg("heads"), arg("q_len"), arg("k_len"),
         "Raises maskattn.Error (E128) unless no evaluation over the problem can index outside "
         "a table or divide by zero.")
      .def("allows", &Program::allows, arg("b"), arg("h"), arg("q"), arg("kv"),
           "A mask program's value for one pair (the scalar reference evaluator).")
      .def(
          "score_of",
          [](const Program& self, float s, int64_t b, int64_t h, int64_t q, int64_t kv) {
            return self.score(s, b, h, q, kv);
          },
          arg("s"), arg("b"), arg("h"), arg("q"), arg("kv"),
          "A score program's value for the score s of one pair (f32).")
      .def(
          "mask_tile",
          [](const Program& self, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0,
             int64_t nk) {
            const int64_t count = nk > 0 ? nk : 0;
            std::vector<uint64_t> bits(static_cast<size_t>(count));
            self.mask_tile(b, h, q0, nq, kv0, nk, bits.data());
            return to_numpy(Array<uint64_t>(Dims{count}, std::move(bits)));
          },
          arg("b"), arg("h"), arg("q0"), arg("nq"), arg("kv0"), arg("nk"),
          "The tile queries [q0, q0+nq) × keys [kv0, kv0+nk) as uint64 [nk]: bit i of entry j "
          "is set iff query q0+i may see key kv0+j.")
      .def(
          "score_tile",
          [](const Program& self, int64_t b, int64_t h, int64_t q0, int64_t kv0,
             nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> s) {
            self.score_tile(b, h, q0, static_cast<int64_t>(s.shape(1)), kv0,
                            static_cast<int64_t>(s.shape(0)), s.data());
          },
          arg("b"), arg("h"), arg("q0"), arg("kv0"), arg("s"),
          "Maps the scores s (float32 [nk, nq], C-contiguous: s[j, i] is query q0+i against "
          "key kv0+j) in place.");
}

}  // namespace

void bind_programs(nb::module_& m) {
  nb::class_<Program> cls(
      m, "Program",
      "A mask or score program (docs/semantics.md): FlexAttention's mask_mod/score_mod body as "
      "an expression of b, h, q, kv (and s), with tables read in place.");
  cls.def_static(
         "mask",
         [](const std::string& text, nb::kwargs tables) {
           return Program::mask(text, program_tables(tables));
         },
         arg("text"), arg("tables"), "Compile a mask program (a bool expression).")
      .def_static(
          "score",
          [](const std::string& text, nb::kwargs tables) {
            return Program::score(text, program_tables(tables));
          },
          arg("text"), arg("tables"), "Compile a score program (a number; s is the score).")
      .def_prop_ro(
          "kind",
          [](const Program& self) { return self.kind() == ProgramKind::mask ? "mask" : "score"; })
      .def_prop_ro("text", &Program::text)
      .def_prop_ro("node_count", &Program::node_count)
      .def_prop_ro("table_names", &table_names)
      .def_prop_ro("tables", &table_list, "[(name, dtype, shape)] in the program's order")
      .def_prop_ro("depends_on_batch", &Program::depends_on_batch)
      .def_prop_ro("depends_on_head", &Program::depends_on_head)
      .def_prop_ro("depends_on_score", &Program::depends_on_score)
      .def("__repr__", &describe);
  bind_program_evaluation(cls);
}

}  // namespace maskattn::python
