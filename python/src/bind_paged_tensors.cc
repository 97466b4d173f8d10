// Attention over a paged KV cache the caller owns (maskattn/paged_tensors.h), from Python: the
// pool tensors [num_blocks, block_size, Hkv, D] of FlashAttention's flash_attn_with_kvcache or of
// transformers' continuous batching are read in place through their DLPack views, the block
// table as an int32 [B, max_blocks] array. The Python layer (maskattn/_paged_tensors.py) checks
// the arguments, appends new rows and allocates the output.
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
#include "maskattn/error.h"
#include "maskattn/paged_tensors.h"

namespace maskattn::python {
namespace {

using nb::arg;
using BlockTable = nb::ndarray<nb::ro, const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The Python layer checks the table's rows too; this guards direct calls of the binding, since
// the library cannot see how many rows a pointer has.
PagedTensors pages_of(const InputArray& keys, const InputArray& values, const BlockTable& table,
                      const std::vector<int64_t>& lengths, bool causal,
                      const std::string& element) {
  if (table.shape(0) < lengths.size()) {
    throw Error("block_table has " + std::to_string(table.shape(0)) + " rows but there are " +
                std::to_string(lengths.size()) + " sequences");
  }
  PagedTensors kv;
  kv.keys = input_view(keys, "k_cache", element);
  kv.values = input_view(values, "v_cache", element);
  kv.block_table = table.data();
  kv.table_columns = static_cast<int64_t>(table.shape(1));
  kv.lengths = lengths;
  kv.causal = causal;
  return kv;
}

void attention_paged_tensors_binding(const InputArray& q, const InputArray& keys,
                                     const InputArray& values, const BlockTable& table,
                                     const std::vector<int64_t>& lengths, bool causal,
                                     const OutputArray& out,
                                     const std::vector<int64_t>& query_lengths, const Mask* mask,
                                     const ScoreMods* mods, const std::optional<OutputArray>& lse,
                                     std::optional<double> scale, int threads,
                                     const std::string& kernel, const std::string& element) {
  const TensorView qv = input_view(q, "q", element);
  const PagedTensors kv = pages_of(keys, values, table, lengths, causal, element);
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  const Options options = options_of(scale, threads, kernel, "auto", false);
  compute_released(mask, mods, [&] {
    attention_paged(qv, kv, ov, query_lengths, mask_or_none(mask), mods_or_none(mods), options, lv);
  });
}

}  // namespace

void bind_paged_tensors(nb::module_& m) {
  m.def("attention_paged_tensors", &attention_paged_tensors_binding, arg("q"), arg("k_cache"),
        arg("v_cache"), arg("block_table"), arg("lengths"), arg("causal"), arg("out"),
        arg("query_lengths"), arg("mask").none(), arg("mods").none(), arg("lse").none(),
        arg("scale").none(), arg("threads"), arg("kernel"), arg("element"));
}

}  // namespace maskattn::python
