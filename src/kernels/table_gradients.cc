#include "kernels/table_gradients.h"

#include <algorithm>

#include "core/store_f32.h"

namespace maskattn::detail {

TableGradients::TableGradients(const Program* program, const Gradients& grads) {
  if (program == nullptr) return;
  tables_ = static_cast<int64_t>(program->tables().size());
  int64_t size = 0;
  for (int64_t t = 0; t < static_cast<int64_t>(grads.dtables.size()); ++t) {
    if (grads.dtables[t].is_null()) continue;
    wanted_.push_back(t);
    offsets_.push_back(size);
    size += grads.dtables[t].numel();
  }
  offsets_.push_back(size);
  if (!wanted_.empty()) totals_.assign(size, 0.0);
}

TableGradients::Lease TableGradients::lease() {
  Lease lease;
  if (empty()) return lease;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      lease.storage = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!lease.storage) lease.storage = std::make_unique<std::vector<double>>(offsets_.back(), 0.0);
  lease.pointers_.assign(tables_, nullptr);
  for (size_t w = 0; w < wanted_.size(); ++w) {
    lease.pointers_[wanted_[w]] = lease.storage->data() + offsets_[w];
  }
  return lease;
}

void TableGradients::fold(std::vector<double>& buffer) {
  for (size_t n = 0; n < buffer.size(); ++n) totals_[n] += buffer[n];
  std::fill(buffer.begin(), buffer.end(), 0.0);
}

void TableGradients::finish(int64_t position, Lease lease) {
  if (empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.emplace_back(position, std::move(lease.storage));
  // Fold every pending item whose turn has come, in dealing order.
  for (bool folded = true; folded;) {
    folded = false;
    for (size_t n = 0; n < pending_.size(); ++n) {
      if (pending_[n].first != next_) continue;
      fold(*pending_[n].second);
      free_.push_back(std::move(pending_[n].second));
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(n));
      ++next_;
      folded = true;
      break;
    }
  }
}

void TableGradients::store(const Gradients& grads, bool accumulate) const {
  std::vector<float> values;
  for (size_t w = 0; w < wanted_.size(); ++w) {
    const MutableTensorView& view = grads.dtables[wanted_[w]];
    values.assign(totals_.begin() + offsets_[w], totals_.begin() + offsets_[w + 1]);
    store_f32(values.data(), view, accumulate);
  }
}

}  // namespace maskattn::detail
