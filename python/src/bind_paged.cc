// The paged, quantized KV cache from Python: PagedKVCache (the C++ class itself, its pool owned by
// the Python object) and attention_paged over it. Keys and values are appended from any array
// type ([Hkv, T, D], read in place, encoded into the cache's format); the Python layer
// (maskattn/_paged.py) allocates the outputs in the caller's framework.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "call.h"
#include "maskattn/paged_kv_cache.h"

namespace maskattn::python {
namespace {

using nb::arg;

// `values` [Hkv, L, W] as a NumPy float32 array owning its memory.
nb::ndarray<nb::numpy, float> decoded_array(std::vector<float> values, int64_t heads,
                                            int64_t length, int64_t width) {
  return to_numpy(Array<float>({heads, length, width}, std::move(values)));
}

void append_binding(PagedKVCache& cache, int64_t sequence, const InputArray& k, const InputArray& v,
                    const std::string& element) {
  const TensorView kv = input_view(k, "k", element), vv = input_view(v, "v", element);
  nb::gil_scoped_release released;
  cache.append(sequence, kv, vv);
}

void attention_paged_binding(const InputArray& q, const PagedKVCache& cache,
                             const std::vector<int64_t>& sequences, const OutputArray& out,
                             const std::vector<int64_t>& query_lengths, const Mask* mask,
                             const ScoreMods* mods, const std::optional<OutputArray>& lse,
                             std::optional<double> scale, int threads, const std::string& kernel,
                             const std::string& element) {
  const TensorView qv = input_view(q, "q", element);
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  const Options options = options_of(scale, threads, kernel, "auto", false);
  compute_released(mask, mods, [&] {
    attention_paged(qv, cache, sequences, ov, query_lengths, mask_or_none(mask), mods_or_none(mods),
                    options, lv);
  });
}

}  // namespace

void bind_paged(nb::module_& m) {
  nb::class_<PagedKVCache>(m, "PagedKVCache")
      .def(
          "__init__",
          [](PagedKVCache* self, int64_t blocks, int64_t block_size, int64_t kv_heads,
             int64_t head_dim, const std::string& format, int64_t value_dim) {
            new (self) PagedKVCache(blocks, block_size, kv_heads, head_dim,
                                    parse_kv_format(format, "format"), value_dim);
          },
          arg("blocks"), arg("block_size"), arg("kv_heads"), arg("head_dim"), arg("format") = "f32",
          arg("value_dim") = 0)
      .def_prop_ro("blocks", &PagedKVCache::blocks)
      .def_prop_ro("block_size", &PagedKVCache::block_size)
      .def_prop_ro("kv_heads", &PagedKVCache::kv_heads)
      .def_prop_ro("head_dim", &PagedKVCache::head_dim)
      .def_prop_ro("value_dim", &PagedKVCache::value_dim)
      .def_prop_ro("format", [](const PagedKVCache& c) { return kv_format_name(c.format()); })
      .def_prop_ro("bytes_per_position", &PagedKVCache::bytes_per_position)
      .def_prop_ro("free_blocks", &PagedKVCache::free_blocks)
      .def_prop_ro("blocks_in_use", &PagedKVCache::blocks_in_use)
      .def("add_sequence", &PagedKVCache::add_sequence)
      .def("fork", &PagedKVCache::fork, arg("parent"))
      .def("free", &PagedKVCache::free, arg("sequence"))
      .def("contains", &PagedKVCache::contains, arg("sequence"))
      .def("length", &PagedKVCache::length, arg("sequence"))
      .def("live_sequences", &PagedKVCache::live_sequences)
      .def("truncate", &PagedKVCache::truncate, arg("sequence"), arg("length"))
      .def("blocks_needed", &PagedKVCache::blocks_needed, arg("sequence"), arg("count"))
      .def("accept", &PagedKVCache::accept, arg("sequence"), arg("draft"), arg("path"))
      .def("block_table", &PagedKVCache::block_table, arg("sequence"))
      .def("_append", &append_binding, arg("sequence"), arg("k"), arg("v"), arg("element"))
      .def(
          "decoded_keys",
          [](const PagedKVCache& c, int64_t s) {
            return decoded_array(c.decoded_keys(s), c.kv_heads(), c.length(s), c.head_dim());
          },
          arg("sequence"))
      .def(
          "decoded_values",
          [](const PagedKVCache& c, int64_t s) {
            return decoded_array(c.decoded_values(s), c.kv_heads(), c.length(s), c.value_dim());
          },
          arg("sequence"));
  m.def("attention_paged", &attention_paged_binding, arg("q"), arg("cache"), arg("sequences"),
        arg("out"), arg("query_lengths"), arg("mask").none(), arg("mods").none(), arg("lse").none(),
        arg("scale").none(), arg("threads"), arg("kernel"), arg("element"));
}

}  // namespace maskattn::python
