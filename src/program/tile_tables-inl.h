// Table reads of the tile evaluator (eval_tile.cc), compiled once per SIMD target.
//
// A read whose indices are all affine in the tile (q, kv, h, constants, their sums: doc[q],
// rel[h, q - kv + 4095]) has an affine element offset O + Rs · r + Cs · c, and each index, being
// affine, takes its extremes at the tile's corners: four checks prove the whole tile in range.
// When the table's element type is the node's (float for f32, int64 for int64) and the offset
// moves by 0 or 1 element along a row, the slot simply views the table: no copy. Otherwise the
// elements are copied along the runs (a reversed run for query rows, widening int32), and any
// other index is gathered element by element, each index checked before its read (the error
// names the first offending pair, as the scalar evaluator's would).
#if defined(MASKATTN_PROGRAM_TILE_TABLES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_PROGRAM_TILE_TABLES_INL_H_
#undef MASKATTN_PROGRAM_TILE_TABLES_INL_H_
#else
#define MASKATTN_PROGRAM_TILE_TABLES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "program/ir.h"
#include "program/tile_bits-inl.h"
#include "program/tile_slots-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::program {
namespace HWY_NAMESPACE {

// An affine read's element offset: O + Rs · r + Cs · c. False when an index is not affine or
// leaves the table somewhere in the tile.
inline bool affine_offset(TileState& t, int32_t n, int64_t& origin, int64_t& row_step,
                          int64_t& col_step) {
  const Node& node = t.node(n);
  const ProgramTable& table = t.ir.tables[node.table];
  const int64_t last_row = t.rows_of(n) - 1, last_col = t.cols_of(n) - 1;
  origin = row_step = col_step = 0;
  for (size_t k = 0; k < table.sizes.size(); ++k) {
    const Slot& index = t.slot(node.args[k]);
    if (!index.affine) return false;
    const Wide corner[4] = {
        index.base, Wide{index.base} + Wide{index.dr} * last_row,
        Wide{index.base} + Wide{index.dc} * last_col,
        Wide{index.base} + Wide{index.dr} * last_row + Wide{index.dc} * last_col};
    for (const Wide value : corner) {
      if (value < 0 || value >= table.sizes[k]) return false;
    }
    // In range at the corners, so every product below is a real element's offset: no overflow.
    origin += index.base * table.strides[k];
    row_step += index.dr * table.strides[k];
    col_step += index.dc * table.strides[k];
  }
  return true;
}

// count elements from data, step apart, into out as T. The steps that matter, 1 and -1 (a run of
// rel[h, q - kv + c] along keys is reversed), get loops of their own that the compiler vectorises.
template <class T, class Element>
void copy_elements(const Element* data, int64_t step, int64_t count, T* out) {
  const auto value = [](Element x) -> T {
    if constexpr (std::is_same_v<Element, uint8_t>) return x != 0 ? 1 : 0;
    return static_cast<T>(x);
  };
  if (step == 1) {
    for (int64_t c = 0; c < count; ++c) out[c] = value(data[c]);
  } else if (step == -1) {
    const Element* last = data - (count - 1);
    for (int64_t c = 0; c < count; ++c) out[count - 1 - c] = value(last[c]);
  } else {
    for (int64_t c = 0; c < count; ++c) out[c] = value(data[c * step]);
  }
}

// One run of the table into out: the node's element type (float for an f32 node; int64 for an
// int64 or bool node, from int64, int32 or bool elements).
template <class T>
void copy_run(const ProgramTable& table, int64_t offset, int64_t step, int64_t count, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    copy_elements(static_cast<const float*>(table.data) + offset, step, count, out);
  } else if (table.type == ProgramTableType::int32) {
    copy_elements(static_cast<const int32_t*>(table.data) + offset, step, count, out);
  } else if (table.type == ProgramTableType::boolean) {
    copy_elements(static_cast<const uint8_t*>(table.data) + offset, step, count, out);
  } else {
    copy_elements(static_cast<const int64_t*>(table.data) + offset, step, count, out);
  }
}

template <class T>
void read_runs(TileState& t, int32_t n, int64_t origin, int64_t row_step, int64_t col_step) {
  const ProgramTable& table = t.ir.tables[t.node(n).table];
  T* out = own<T>(t, n);
  const int64_t stride = t.slot(n).row_stride;
  for (int64_t r = 0; r < t.rows_of(n); ++r) {
    copy_run(table, origin + r * row_step, col_step, t.cols_of(n), out + r * stride);
  }
  mark_written<T>(t, n);
}

// Every element's indices from the index nodes' values, checked, then read.
template <class T>
void gather(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const ProgramTable& table = t.ir.tables[node.table];
  const size_t rank = table.sizes.size();
  In<int64_t> index_views[3] = {{nullptr, 0, 0}, {nullptr, 0, 0}, {nullptr, 0, 0}};
  for (size_t k = 0; k < rank; ++k) index_views[k] = view<int64_t>(t, node.args[k]);
  T* out = own<T>(t, n);
  const int64_t stride = t.slot(n).row_stride;
  for (int64_t r = 0; r < t.rows_of(n); ++r) {
    for (int64_t c = 0; c < t.cols_of(n); ++c) {
      int64_t index[3] = {0, 0, 0};
      for (size_t k = 0; k < rank; ++k) {
        const In<int64_t>& v = index_views[k];
        index[k] = v.data[r * v.row_stride + c * v.col_stride];
      }
      if (!index_in_range(table, index)) throw_index_out_of_range(t.ir, node, index);
      const int64_t offset = table_offset(table, index);
      if constexpr (std::is_same_v<T, float>) {
        out[r * stride + c] = table_f32(table, offset);
      } else {
        out[r * stride + c] = table_int(table, offset);
      }
    }
  }
  mark_written<T>(t, n);
}

// A table read into node n's slot.
inline void read_table(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const ProgramTable& table = t.ir.tables[node.table];
  Slot& slot = t.slot(n);
  int64_t origin = 0, row_step = 0, col_step = 0;
  if (!affine_offset(t, n, origin, row_step, col_step)) {
    if (node.type == Type::f32) return gather<float>(t, n);
    return gather<int64_t>(t, n);
  }
  const bool same_type = (node.type == Type::f32) ||
                         (node.type == Type::int64 && table.type == ProgramTableType::int64);
  const bool along = col_step == 0 || col_step == 1 || t.cols_of(n) == 1;
  if (same_type && along) {
    const size_t element = node.type == Type::f32 ? sizeof(float) : sizeof(int64_t);
    slot.data = static_cast<const char*>(table.data) + origin * static_cast<int64_t>(element);
    slot.row_stride = (slot.axes & kRowAxis) ? row_step : 0;
    slot.col_stride = (slot.axes & kColAxis) ? col_step : 0;
    slot.has_values = true;
    return;
  }
  if (node.type == Type::f32) return read_runs<float>(t, n, origin, row_step, col_step);
  read_runs<int64_t>(t, n, origin, row_step, col_step);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#endif  // include guard
