// The gradients of a score program's float32 tables (Gradients::dtables), summed the same way for
// any thread count.
//
// A table element is read by pairs all over the problem (rel[h, q − kv + c] by a whole diagonal),
// so work items that own disjoint keys still add into the same elements: the sum must not depend
// on which item finishes first. Each item adds into its own zeroed buffers (doubles, one per
// wanted table); a finished item is folded into the totals in a fixed order — the order the items
// are dealt in — as soon as every item before it has been folded. Few buffers are alive at once
// (an item waits only for items that started before it), and the totals are the same bits for
// any thread count. Memory: one table-sized buffer per item in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/program.h"

namespace maskattn::detail {

class TableGradients {
 public:
  // The wanted tables: grads.dtables' non-null views (all null, or no program: nothing to do).
  TableGradients(const Program* program, const Gradients& grads);

  bool empty() const { return wanted_.empty(); }

  // One item's buffers: pointers() holds one per table of the program (null where not wanted),
  // as Program::score_tile_backward takes them.
  class Lease {
   public:
    double* const* pointers() const { return pointers_.data(); }

   private:
    friend class TableGradients;
    std::unique_ptr<std::vector<double>> storage;  // the wanted tables, one after another
    std::vector<double*> pointers_;
  };
  Lease lease();
  // The item dealt `position`-th is done: its sums join the totals in dealing order.
  void finish(int64_t position, Lease lease);

  // The totals into the views, f32 (added to what they hold when `accumulate`).
  void store(const Gradients& grads, bool accumulate) const;

 private:
  void fold(std::vector<double>& buffer);

  std::vector<int64_t> wanted_;   // table indices
  std::vector<int64_t> offsets_;  // of each wanted table in a buffer; back() = the buffer size
  int64_t tables_ = 0;
  std::mutex mutex_;
  std::vector<double> totals_;
  int64_t next_ = 0;  // the position to fold next
  std::vector<std::pair<int64_t, std::unique_ptr<std::vector<double>>>> pending_;
  std::vector<std::unique_ptr<std::vector<double>>> free_;
};

}  // namespace maskattn::detail
