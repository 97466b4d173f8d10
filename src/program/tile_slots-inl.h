// Where the tile evaluator keeps a node's values (eval_tile.cc), compiled once per SIMD target (the
// "-inl.h" convention: re-included by each target pass of foreach_target.h).
//
// A tile is rows × cols pairs: keys × queries ("key rows", the forward kernel's Sᵀ and every mask
// tile) or queries × keys ("query rows", the backward's S). A node's shape is the axes it varies
// along, from its deps: none (one value per tile: constants, b/h work such as slope[h]), the
// query axis, the key axis, or both (a pair node: q and kv, or s). A node without an axis is
// read with stride 0 along it (broadcast), so `doc[q] == doc[kv]` reads the table nq + nk times.
//
// A slot is a strided 2-D view: element (r, c) at data[r · row_stride + c · col_stride], strides 0
// along the axes the node lacks. Most slots view the node's own storage in the workspace, but a
// slot can also view memory the evaluator does not own: the input scores (s, with the caller's
// row stride) and table elements read along an affine index (rel[h, q - kv + c] is a run of the
// table per row: a view, no copy). The result of a score program is written straight into the
// caller's tile through its slot.
//
// Two more representations make mask programs cheap. A bool pair node is bit rows (bit c of word
// r), the layout of a mask tile: comparisons write them 64 pairs at a time and & | ~ are one
// word operation per row. An int64 node can be affine, value(r, c) = base + dr · r + dc · c
// exactly (no wrap anywhere in the tile), as q, kv, constants and their sums and scalings are:
// comparing two affine nodes is then a threshold per row, and indexing a table with one a run;
// its values are written out only when some other operation asks for them.
//
// Workspace: thread-local vectors grown once and reused, so evaluating a tile allocates nothing.
#if defined(MASKATTN_PROGRAM_TILE_SLOTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_PROGRAM_TILE_SLOTS_INL_H_
#undef MASKATTN_PROGRAM_TILE_SLOTS_INL_H_
#else
#define MASKATTN_PROGRAM_TILE_SLOTS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "program/ir.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::program {
namespace HWY_NAMESPACE {

enum Axes : uint8_t { kRowAxis = 1, kColAxis = 2, kBothAxes = 3 };

struct Slot {
  uint8_t axes = 0;            // kRowAxis | kColAxis: the axes the node varies along
  const void* data = nullptr;  // the values, once known (has_values), viewed with the strides
  int64_t row_stride = 0, col_stride = 0;
  void* own = nullptr;       // the node's storage: int64 for bool and int64 nodes, float for f32
  uint64_t* bits = nullptr;  // bool nodes: a word per row if the node varies along rows, else one
  bool has_values = false;
  bool has_bits = false;
  bool affine = false;  // int64: value(r, c) = base + dr · r + dc · c, exactly
  int64_t base = 0, dr = 0, dc = 0;
};

template <class T>
struct In {
  const T* data;
  int64_t row_stride;
  int64_t col_stride;  // 0 or 1 for every view the operators map over
};

struct Workspace {
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<uint64_t> bits;
  std::vector<Slot> slots;
  std::vector<double> adjoints;  // the backward's, one array per node that carries a gradient
  std::vector<int64_t> adjoint_offsets;
  int64_t adjoint_sink = 0;
  std::vector<int32_t> narrow = std::vector<int32_t>(128);  // two operands as int32 (≤ 64 each)
};

// One tile's evaluation state: the geometry, the workspace and every node's slot.
struct TileState {
  const ProgramIr& ir;
  Workspace& work;
  int64_t b, h, q0, kv0;
  int64_t rows, cols;
  uint8_t q_axis, kv_axis;  // kColAxis and kRowAxis for key rows, the other way for query rows
  uint64_t full;            // the low `cols` bits

  Slot& slot(int32_t n) { return work.slots[n]; }
  const Node& node(int32_t n) const { return ir.nodes[n]; }
  int64_t rows_of(int32_t n) const { return (work.slots[n].axes & kRowAxis) ? rows : 1; }
  int64_t cols_of(int32_t n) const { return (work.slots[n].axes & kColAxis) ? cols : 1; }
};

inline uint64_t low_bits(int64_t n) {
  return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
}

// The node's own storage (where every operator writes its values), and the note that it did.
template <class T>
T* own(TileState& t, int32_t n) {
  return static_cast<T*>(t.slot(n).own);
}
template <class T>
void mark_written(TileState& t, int32_t n) {
  Slot& slot = t.slot(n);
  slot.data = slot.own;
  slot.has_values = true;
}

// An affine node's values, written into its storage on first demand.
void ensure_values(TileState& t, int32_t n);

template <class T>
In<T> view(TileState& t, int32_t n) {
  ensure_values(t, n);
  const Slot& slot = t.slot(n);
  return {static_cast<const T*>(slot.data), slot.row_stride, slot.col_stride};
}

// ---- mapping an operator over a tile --------------------------------------------------------
//
// map(out, ...) writes f(a(r, c), b(r, c), ...) for every element of the output's shape. Each
// input is either contiguous along the row or one value per row (col_stride 1 or 0); the choice
// is made once per call, so the inner loop is a plain loop over contiguous arrays that the
// compiler vectorises for the target (out may be one of the inputs: element c is read before it
// is written, so `ivdep` is safe).

template <class T>
struct Along {  // contiguous along the row
  const T* base;
  int64_t row_stride;
  const T* p = nullptr;
  void row(int64_t r) { p = base + r * row_stride; }
  T operator[](int64_t c) const { return p[c]; }
};
template <class T>
struct Same {  // one value per row
  const T* base;
  int64_t row_stride;
  T v = T();
  void row(int64_t r) { v = base[r * row_stride]; }
  T operator[](int64_t) const { return v; }
};

template <class Out, class F, class... A>
void map_rows(Out* out, int64_t out_stride, int64_t rows, int64_t cols, F f, A... a) {
  for (int64_t r = 0; r < rows; ++r) {
    (a.row(r), ...);
    Out* o = out + r * out_stride;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) o[c] = f(a[c]...);
  }
}

// Calls body(accessors...) with each input's accessor chosen once: Same when the input has one
// value per row (or the rows are one column wide), Along otherwise.
template <class Body, class... Chosen>
void with_accessors(int64_t, Body body, std::tuple<Chosen...> chosen) {
  std::apply(body, chosen);
}
template <class Body, class... Chosen, class T, class... Rest>
void with_accessors(int64_t cols, Body body, std::tuple<Chosen...> chosen, In<T> first,
                    Rest... rest) {
  if (first.col_stride == 0 || cols == 1) {
    with_accessors(cols, body,
                   std::tuple_cat(chosen, std::make_tuple(Same<T>{first.data, first.row_stride})),
                   rest...);
  } else {
    with_accessors(cols, body,
                   std::tuple_cat(chosen, std::make_tuple(Along<T>{first.data, first.row_stride})),
                   rest...);
  }
}

// f mapped over node n's shape, written into its storage.
template <class Out, class F, class... T>
void map(TileState& t, int32_t n, F f, In<T>... in) {
  const Slot& slot = t.slot(n);
  Out* out = own<Out>(t, n);
  const int64_t rows = t.rows_of(n), cols = t.cols_of(n);
  with_accessors(
      cols, [&](auto... a) { map_rows(out, slot.row_stride, rows, cols, f, a...); }, std::tuple<>(),
      in...);
  mark_written<Out>(t, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#endif  // include guard
