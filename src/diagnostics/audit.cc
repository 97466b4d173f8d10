// The leakage audit: influence of each key on each output, measured on the real kernel by
// perturbation, compared with the mask and with the mask the user expected.
#include "maskattn/audit.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/element.h"
#include "diagnostics/audit_sample.h"
#include "mask/resolved_mask.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"

namespace maskattn {

namespace {

// A tensor in one dtype, stored as 16-bit words (f32 takes two).
struct Buffer {
  DType dtype;
  Dims shape;
  std::vector<uint16_t> words;
  Buffer(DType type, Dims dims) : dtype(type), shape(std::move(dims)) {
    words.assign(
        static_cast<size_t>(checked_numel(shape, "audit tensor")) * (dtype == DType::f32 ? 2 : 1),
        0);
  }
  void set(int64_t n, float x) { detail::store_float(mutable_view(), n, x); }
  float get(int64_t n) const { return detail::load_float(view(), n); }
  TensorView view() const { return TensorView(words.data(), dtype, shape); }
  MutableTensorView mutable_view() { return MutableTensorView(words.data(), dtype, shape); }
};

// The audit's limits: each key costs one attention call over the whole problem.
void require_audit_size(const AuditOptions& o, int64_t kv_heads) {
  const std::pair<int64_t, const char*> sizes[] = {
      {o.batch, "batch"}, {o.q_heads, "q_heads"}, {kv_heads, "kv_heads"},
      {o.q_len, "q_len"}, {o.k_len, "k_len"},     {o.head_dim, "head_dim"}};
  for (const auto& [value, name] : sizes) {
    if (value < 1 || value > 4096) {
      throw Error(std::string("audit: ") + name + " = " + std::to_string(value) +
                  " must be in [1, 4096]");
    }
  }
  const double pairs = static_cast<double>(o.batch) * o.q_heads * o.q_len * o.k_len;
  if (pairs > double(1 << 24)) {
    throw Error("audit: " + std::to_string(static_cast<int64_t>(pairs)) +
                " pairs (B·Hq·Lq·Lk), each key needing one attention call, is too many; keep it "
                "at most 16777216");
  }
  require_memory(
      3.0 * pairs + 16.0 * o.batch * (o.q_heads * o.q_len + kv_heads * o.k_len) * o.head_dim,
      "audit");
}

// Influence [B, Hq, Lq, Lk]: 1 where moving key j (and value j) changes any bit of output row i.
// q, k and v are the random inputs; k and v are put back after each key.
std::vector<uint8_t> measure_influence(const Mask& mask, const ScoreMods& mods,
                                       const AuditOptions& o, int64_t kv_heads, const Buffer& q,
                                       Buffer& k, Buffer& v) {
  Options options;
  options.kernel = o.kernel;
  const Dims out_shape = {o.batch, o.q_heads, o.q_len, o.head_dim};
  Buffer baseline(o.dtype, out_shape), perturbed(o.dtype, out_shape);
  attention(q.view(), k.view(), v.view(), baseline.mutable_view(), mask, mods, options);

  std::vector<uint8_t> influence(static_cast<size_t>(o.batch * o.q_heads * o.q_len * o.k_len), 0);
  for (int64_t j = 0; j < o.k_len; ++j) {
    // Move key j and value j of every (b, g) by a visible amount, then put them back.
    std::vector<float> saved;
    for (int64_t b = 0; b < o.batch; ++b) {
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t row = ((b * kv_heads + g) * o.k_len + j) * o.head_dim;
        for (int64_t d = 0; d < o.head_dim; ++d) {
          saved.push_back(k.get(row + d));
          saved.push_back(v.get(row + d));
          k.set(row + d, k.get(row + d) + 0.5f);
          v.set(row + d, v.get(row + d) + 1.0f);
        }
      }
    }
    attention(q.view(), k.view(), v.view(), perturbed.mutable_view(), mask, mods, options);
    size_t next = 0;
    for (int64_t b = 0; b < o.batch; ++b) {
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t row = ((b * kv_heads + g) * o.k_len + j) * o.head_dim;
        for (int64_t d = 0; d < o.head_dim; ++d) {
          k.set(row + d, saved[next++]);
          v.set(row + d, saved[next++]);
        }
      }
    }
    // An output row changed iff its bits changed.
    const size_t words = o.dtype == DType::f32 ? 2 : 1;
    for (int64_t row = 0; row < o.batch * o.q_heads * o.q_len; ++row) {
      const size_t first = words * static_cast<size_t>(row * o.head_dim);
      const bool changed =
          std::memcmp(baseline.words.data() + first, perturbed.words.data() + first,
                      2 * words * static_cast<size_t>(o.head_dim)) != 0;
      influence[static_cast<size_t>(row * o.k_len + j)] = changed;
    }
  }
  return influence;
}

// Every pair compared: the mask against the measured influence (kernel leaks, silent pairs) and
// against the expected mask (leaks, blind spots); rows that see no key.
void classify_pairs(const std::vector<uint8_t>& influence, AuditReport& report) {
  const MaskShape& shape = report.shape;
  const std::vector<uint8_t>& allowed = report.allowed.values();
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      for (int64_t i = 0; i < shape.q_len; ++i) {
        bool sees_any = false;
        for (int64_t j = 0; j < shape.k_len; ++j) {
          const size_t n =
              static_cast<size_t>(((b * shape.q_heads + h) * shape.q_len + i) * shape.k_len + j);
          const AuditPair pair{b, h, i, j};
          sees_any |= allowed[n] != 0;
          (allowed[n] ? report.allowed_count : report.hidden_count) += 1;
          if (!allowed[n] && influence[n]) report.kernel_leaks.push_back(pair);
          if (allowed[n] && !influence[n]) report.silent_pairs.push_back(pair);
          if (report.has_expected) {
            const bool want = report.expected.values()[n] != 0;
            if (allowed[n] && !want) report.leaks.push_back(pair);
            if (!allowed[n] && want) report.blind_spots.push_back(pair);
          }
        }
        if (!sees_any) report.empty_rows.push_back({b, h, i, 0});
      }
    }
  }
}

// The first component of the mask that allows again, for head h, a pair its causal or window
// components hide (the relaxations of ResolvedMask::relaxed, in the mask's order).
bool find_relaxation(const Mask& mask, const detail::ResolvedMask& resolved, const AuditPair& p,
                     AuditRelaxedPair& found) {
  const auto global = [&](const Array<int64_t>& ids, int64_t t) {
    return ids.at(ids.dim(0) == 1 ? 0 : p.b, t) != 0;
  };
  const int64_t query_position = resolved.qpos(p.b, p.i), key_position = resolved.kpos(p.b, p.j);
  const auto& components = mask.components();
  for (size_t n = 0; n < components.size(); ++n) {
    if (const auto* g = std::get_if<component::GlobalTokens>(&components[n])) {
      if (!g->heads.contains(p.h)) continue;
      const bool query = global(g->query_ids, p.i), key = global(g->key_ids, p.j);
      if (!query && !key) continue;
      found.reason = query && key ? Relaxation::global_both
                     : query      ? Relaxation::global_query
                                  : Relaxation::global_key;
    } else if (const auto* spans = std::get_if<component::Spans>(&components[n])) {
      const int64_t span = spans->query_ids.at(p.b, p.i);
      if (!spans->heads.contains(p.h) || span == 0 || span != spans->key_ids.at(p.b, p.j)) continue;
      found.reason = Relaxation::span;
    } else if (const auto* prefix = std::get_if<component::Prefix>(&components[n])) {
      const auto inside = [&](int64_t position) {
        return position >= 0 && position < prefix->length;
      };
      if (!prefix->heads.contains(p.h) || !inside(query_position) || !inside(key_position)) {
        continue;
      }
      found.reason = Relaxation::prefix;
    } else {
      continue;
    }
    found.pair = p;
    found.component = n;
    found.look_ahead = key_position > query_position;
    return true;
  }
  return false;
}

// The allowed pairs a causal or window component of their head hides: each was allowed again by a
// relaxing component, which is recorded with it.
void find_relaxed_pairs(const Mask& mask, AuditReport& report) {
  const MaskShape& shape = report.shape;
  const detail::ResolvedMask resolved(mask, shape);
  std::vector<const component::Window*> windows;
  for (const Component& part : mask.components()) {
    if (const auto* window = std::get_if<component::Window>(&part)) windows.push_back(window);
  }
  if (windows.empty()) return;
  const std::vector<uint8_t>& allowed = report.allowed.values();
  size_t n = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      for (int64_t i = 0; i < shape.q_len; ++i) {
        for (int64_t j = 0; j < shape.k_len; ++j, ++n) {
          if (!allowed[n]) continue;
          const int64_t distance = resolved.qpos(b, i) - resolved.kpos(b, j);  // > 0: key earlier
          bool hidden_by_window = false;
          for (const component::Window* window : windows) {
            hidden_by_window |= window->heads.contains(h) &&
                                !(distance <= window->left && -distance <= window->right);
          }
          AuditRelaxedPair found;
          if (hidden_by_window && find_relaxation(mask, resolved, {b, h, i, j}, found)) {
            report.relaxed_pairs.push_back(found);
          }
        }
      }
    }
  }
}

}  // namespace

std::string relaxed_pair_text(const AuditReport& report, const AuditRelaxedPair& relaxed) {
  const AuditPair& p = relaxed.pair;
  const char* why = "";
  switch (relaxed.reason) {
    case Relaxation::global_query:
      why = "a global query";
      break;
    case Relaxation::global_key:
      why = "a global key";
      break;
    case Relaxation::global_both:
      why = "a global query and key";
      break;
    case Relaxation::span:
      why = "the same span";
      break;
    case Relaxation::prefix:
      why = "both in the prefix";
      break;
  }
  const std::string label =
      relaxed.component < report.labels.size() ? report.labels[relaxed.component] : "relaxation";
  return label + ": b=" + std::to_string(p.b) + " h=" + std::to_string(p.h) + " query " +
         std::to_string(p.i) + " sees " + (relaxed.look_ahead ? "later" : "earlier") + " key " +
         std::to_string(p.j) + (relaxed.look_ahead ? "" : " beyond its window") + " (" + why + ")";
}

AuditReport audit_mask(const Mask& mask, const ScoreMods& mods, const Mask* expected,
                       const AuditOptions& o) {
  const int64_t kv_heads = o.kv_heads > 0 ? o.kv_heads : o.q_heads;
  require_audit_size(o, kv_heads);

  AuditReport report;
  report.shape = {o.batch, o.q_heads, o.q_len, o.k_len};
  report.allowed = allowed_pairs(mask, report.shape);
  if (expected != nullptr) {
    report.has_expected = true;
    report.expected = allowed_pairs(*expected, report.shape);
  }

  // Random inputs (audit_sample.h): scores of moderate size, so that no allowed weight underflows.
  Buffer q(o.dtype, {o.batch, o.q_heads, o.q_len, o.head_dim});
  Buffer k(o.dtype, {o.batch, kv_heads, o.k_len, o.head_dim});
  Buffer v(o.dtype, {o.batch, kv_heads, o.k_len, o.head_dim});
  const int64_t per_tensor[] = {q.view().numel(), k.view().numel(), v.view().numel()};
  const std::vector<float> sample =
      detail::audit_sample(o.seed, per_tensor[0] + per_tensor[1] + per_tensor[2]);
  size_t drawn = 0;
  for (Buffer* t : {&q, &k, &v}) {
    for (int64_t n = 0; n < t->view().numel(); ++n) t->set(n, sample[drawn++]);
  }
  const std::vector<uint8_t> influence = measure_influence(mask, mods, o, kv_heads, q, k, v);
  report.influence = Array<uint8_t>({o.batch, o.q_heads, o.q_len, o.k_len}, influence);
  classify_pairs(influence, report);
  report.labels = mask.labels();
  find_relaxed_pairs(mask, report);
  return report;
}

}  // namespace maskattn
