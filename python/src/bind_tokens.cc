// Tokens and batches from Python: Vocabulary, collate() and its TokenBatch, the batch mask
// builders (cross_attention, image_text), MAE patch masking and MLM input masking.
//
// TokenBatch and PatchMasking are the C++ structs themselves; their arrays are exposed as
// read-only NumPy views that keep the Python object alive (no copy, and no way to make ids,
// lengths and the masks built from them disagree by writing into one of them). Python callers
// pass token ids as lists, NumPy arrays or tensors; they are copied in with the rank checked.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "maskattn/error.h"
#include "maskattn/tokens.h"

namespace maskattn::python {
namespace {

using nb::arg;

// `values` (shape `shape`, owned by the C++ object behind `owner`) as a read-only NumPy array
// that keeps `owner` alive.
template <typename T>
nb::ndarray<nb::numpy, const T> read_only_view(const T* values, std::vector<size_t> shape,
                                               nb::handle owner) {
  return nb::ndarray<nb::numpy, const T>(values, shape.size(), shape.data(), owner);
}

template <typename T>
nb::ndarray<nb::numpy, const T> read_only_view(const Array<T>& array, nb::handle owner) {
  return read_only_view(array.data(),
                        std::vector<size_t>(array.shape().begin(), array.shape().end()), owner);
}

template <typename T>
nb::ndarray<nb::numpy, const T> read_only_view(const std::vector<T>& values, nb::handle owner) {
  return read_only_view(values.data(), {values.size()}, owner);
}

// A Python str's text. Not nb::cast<std::string>: that template is also instantiated in files
// that do not include nanobind/stl/string.h, and the linker may keep their copy, which cannot
// convert (std::bad_cast).
std::string text_of(nb::handle text) {
  return nb::borrow<nb::str>(text).c_str();
}

// A rank-1 array of token ids (a list, NumPy array or tensor), or an Error naming `name`.
std::vector<int64_t> id_vector(nb::handle values, const std::string& name, const char* what) {
  if (nb::isinstance<nb::str>(values) || nb::isinstance<nb::bytes>(values)) {
    throw Error(name + " is a string; " + what);
  }
  const Array<int64_t> array = int_array(values, name.c_str());
  if (array.rank() != 1) {
    throw Error(name + " has shape " + shape_string(array.shape()) + "; " + what);
  }
  return array.values();
}

std::string list_string(const std::vector<int64_t>& values) {
  return shape_string(Dims(values.begin(), values.end()));
}

void bind_vocabulary(nb::module_& m) {
  m.attr("PAD_ID") = kPadId;
  m.attr("UNK_ID") = kUnkId;
  m.attr("BOS_ID") = kBosId;
  m.attr("EOS_ID") = kEosId;
  m.attr("SEP_ID") = kSepId;
  m.attr("CLS_ID") = kClsId;
  m.attr("MASK_ID") = kMaskId;
  nb::class_<Vocabulary>(m, "Vocabulary",
                         "Token strings and their ids: the seven special tokens (<pad> <unk> <bos> "
                         "<eos> <sep> <cls> <mask>, ids 0-6), then the words in order.")
      .def(
          "__init__",
          [](Vocabulary* self, nb::handle words) {
            std::vector<std::string> list;
            if (nb::isinstance<nb::str>(words)) {
              throw Error("Vocabulary: words is a str; give a list of words (e.g. text.split())");
            }
            if (!words.is_none()) {
              for (nb::handle word : words) {
                if (!nb::isinstance<nb::str>(word)) {
                  throw Error("Vocabulary: words must be strings, got " + text_of(nb::repr(word)));
                }
                list.push_back(text_of(word));
              }
            }
            new (self) Vocabulary(list);
          },
          arg("words") = nb::none())
      .def("add", &Vocabulary::add, arg("word"), "The word's id, new or existing.")
      .def("id", &Vocabulary::id, arg("token"), "The token's id; UNK_ID for an unknown token.")
      .def("token", &Vocabulary::token, arg("id"))
      .def("size", &Vocabulary::size)
      .def("__len__", &Vocabulary::size)
      .def("encode", &Vocabulary::encode, arg("text"), arg("bos") = true, arg("eos") = true,
           "Whitespace-separated words → ids, wrapped in <bos> … <eos> unless told otherwise.")
      .def(
          "decode",
          [](const Vocabulary& self, nb::handle ids) {
            return self.decode(id_vector(ids, "Vocabulary.decode: ids",
                                         "expected one sequence of token ids (rank 1)"));
          },
          arg("ids"))
      .def("__repr__", [](const Vocabulary& self) {
        return "maskattn.Vocabulary(" + std::to_string(self.size()) + " tokens)";
      });
}

PadSide side_named(const std::string& side) {
  if (side == "right") return PadSide::right;
  if (side == "left") return PadSide::left;
  throw Error("collate: side must be \"right\" or \"left\", got \"" + side + "\"");
}

std::vector<std::vector<int64_t>> sequence_list(nb::handle sequences) {
  if (nb::isinstance<nb::str>(sequences) || nb::isinstance<nb::bytes>(sequences)) {
    throw Error(
        "collate: sequences is a string; give a list of token id sequences "
        "(Vocabulary.encode makes one from text)");
  }
  std::vector<std::vector<int64_t>> list;
  for (nb::handle sequence : sequences) {
    list.push_back(id_vector(sequence, "collate: sequences[" + std::to_string(list.size()) + "]",
                             "each sequence is a rank-1 list of token ids"));
  }
  return list;
}

void bind_token_batch(nb::module_& m) {
  nb::class_<TokenBatch>(m, "TokenBatch",
                         "A padded batch of token sequences (from collate) and the masks that go "
                         "with it. Its arrays are read-only views.")
      .def_prop_ro("ids",
                   [](const TokenBatch& self) { return read_only_view(self.ids, nb::find(self)); })
      .def_prop_ro(
          "lengths",
          [](const TokenBatch& self) { return read_only_view(self.lengths, nb::find(self)); })
      .def_prop_ro(
          "starts",
          [](const TokenBatch& self) { return read_only_view(self.starts, nb::find(self)); })
      .def_prop_ro(
          "segments",
          [](const TokenBatch& self) { return read_only_view(self.segments, nb::find(self)); })
      .def_prop_ro("side",
                   [](const TokenBatch& self) {
                     return std::string(self.side == PadSide::left ? "left" : "right");
                   })
      .def("key_padding", &TokenBatch::key_padding)
      .def("query_padding", &TokenBatch::query_padding)
      .def("decoder_self_attention", &TokenBatch::decoder_self_attention)
      .def("encoder_self_attention", &TokenBatch::encoder_self_attention)
      .def("segment_attention", &TokenBatch::segment_attention)
      .def("__len__", [](const TokenBatch& self) { return self.ids.dim(0); })
      .def("__repr__", [](const TokenBatch& self) {
        return "maskattn.TokenBatch(ids " + shape_string(self.ids.shape()) + ", side='" +
               (self.side == PadSide::left ? "left" : "right") + "', lengths " +
               list_string(self.lengths) + ")";
      });
  m.def(
      "collate",
      [](nb::handle sequences, const std::string& side, int64_t min_length) {
        const PadSide pad_side = side_named(side);
        return collate(sequence_list(sequences), pad_side, min_length);
      },
      arg("sequences"), arg("side"), arg("min_length"));
  m.def("cross_attention", &cross_attention, arg("decoder"), arg("encoder"));
}

void bind_data_masking(nb::module_& m) {
  m.def(
      "image_text",
      [](nb::handle image_first, nb::handle image_count, int64_t length) {
        const char* what = "expected one value per sequence (rank 1)";
        return image_text(id_vector(image_first, "image_text: image_first", what),
                          id_vector(image_count, "image_text: image_count", what), length);
      },
      arg("image_first"), arg("image_count"), arg("length"));
  nb::class_<PatchMasking>(m, "PatchMasking",
                           "MAE patch masking: which patches the encoder keeps (read-only views).")
      .def_prop_ro(
          "keep",
          [](const PatchMasking& self) { return read_only_view(self.keep, nb::find(self)); })
      .def_prop_ro(
          "kept",
          [](const PatchMasking& self) { return read_only_view(self.kept, nb::find(self)); })
      .def("mask", &PatchMasking::mask)
      .def("__repr__", [](const PatchMasking& self) {
        return "maskattn.PatchMasking(" + std::to_string(self.kept.size()) + " of " +
               std::to_string(self.keep.size()) + " patches kept)";
      });
  m.def("mae_patch_masking", &mae_patch_masking, arg("patches"), arg("mask_ratio"), arg("seed"));
  m.def(
      "mlm_masking",
      [](nb::handle ids, int64_t vocabulary_size, uint64_t seed, double rate) {
        MlmExample example = mlm_masking(int_array(ids, "ids"), vocabulary_size, seed, rate);
        return nb::make_tuple(to_numpy(std::move(example.inputs)),
                              to_numpy(std::move(example.labels)));
      },
      arg("ids"), arg("vocabulary_size"), arg("seed"), arg("rate"));
}

}  // namespace

void bind_tokens(nb::module_& m) {
  bind_vocabulary(m);
  bind_token_batch(m);
  bind_data_masking(m);
}

}  // namespace maskattn::python
