// maskattn gpt ablate: the look-ahead mask's reason to exist, measured. The same model is trained
// twice from the same seed on the same batches — with the causal mask and with no mask — and
// compared: the loss each reaches as trained, the validation loss under the causal mask (how text
// is generated: a token's prediction can only use the tokens before it), the uniform guess ln(V),
// how much weight each model's most copying head puts on the key right after the query (i + 1),
// and a greedy sample from one prompt. Pictures: both loss curves, and each model's attention on
// one validation line.
#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "gpt_progress.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/heatmap.h"
#include "maskattn/model/generate.h"
#include "maskattn/plot.h"

namespace maskattn::cli {

namespace {

struct Copying {
  double weight = 0;  // mean over queries i < L − 1 of P[i, i+1]
  int64_t layer = 0, head = 0;
  std::vector<float> weights;  // that layer's weights [H, L, L]
  std::vector<uint8_t> allowed;
};

// Each head's attention on `tokens` under the model's training mask, and the head that puts the
// most weight on the next key.
Copying copying_head(const model::LoadedModel& loaded, const std::vector<int32_t>& tokens) {
  const model::GptConfig& config = loaded.parameters.config();
  const int64_t L = static_cast<int64_t>(tokens.size()), H = config.heads;
  model::Gpt gpt(loaded.parameters, loaded.causal);
  const std::vector<int32_t> targets(L, model::kIgnoreTarget);
  gpt.loss_and_gradients(loaded.values.data(), {tokens.data(), targets.data(), 1, L, -1}, nullptr,
                         0);
  Copying best;
  best.weight = -1;
  best.allowed = allowed_pairs(gpt.last_mask(), {1, H, L, L}).values();
  for (int64_t l = 0; l < config.layers; ++l) {
    const model::QkvViews qkv = gpt.qkv(l);
    std::vector<float> weights(H * L * L);
    attention_weights(qkv.q, qkv.k, MutableTensorView(weights.data(), {1, H, L, L}),
                      gpt.last_mask());
    for (int64_t h = 0; h < H; ++h) {
      double sum = 0;
      for (int64_t i = 0; i + 1 < L; ++i) sum += weights[(h * L + i) * L + i + 1];
      const double mean = L > 1 ? sum / static_cast<double>(L - 1) : 0.0;
      if (mean > best.weight) {
        best.weight = mean;
        best.layer = l;
        best.head = h;
        best.weights = weights;
      }
    }
  }
  return best;
}

// One validation line to look at: the first `context` tokens after the split's first newline.
std::vector<int32_t> validation_line(const model::LoadedModel& loaded, const std::string& text) {
  const std::vector<int32_t> validation =
      model::split_tokens(loaded.vocabulary.encode(text)).validation;
  const int64_t context = loaded.parameters.config().context;
  const std::vector<int32_t> newline = loaded.vocabulary.encode("\n");
  int64_t first = 0;
  for (int64_t n = 0; n < static_cast<int64_t>(validation.size()); ++n) {
    if (validation[n] == newline[0] && n + 1 + context <= static_cast<int64_t>(validation.size())) {
      first = n + 1;
      break;
    }
  }
  const int64_t end = std::min<int64_t>(first + context, validation.size());
  if (end - first < 2) throw Error("gpt ablate: the validation text is too short to look at");
  return {validation.begin() + first, validation.begin() + end};
}

std::string printable(std::string text) {
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

// One side of the ablation: the model trained with one mask, reloaded from its checkpoint.
struct AblationRun {
  std::string mask;
  TrainedRun run;
  model::LoadedModel loaded;
  Copying copying;
  std::string sample;
};

// The mean of the last 5 % of the training losses (at least one).
double tail_mean(const std::vector<double>& losses) {
  if (losses.empty()) return 0.0;
  const size_t count = std::min(std::max<size_t>(losses.size() / 20, 1), losses.size());
  double sum = 0;
  for (size_t n = losses.size() - count; n < losses.size(); ++n) sum += losses[n];
  return sum / static_cast<double>(count);
}

// The comparison as a Markdown table, then both models' greedy samples from `prompt`.
void print_ablation(const std::vector<AblationRun>& results, const std::vector<int32_t>& prompt) {
  const double uniform = std::log(static_cast<double>(results[0].run.vocabulary_size));
  std::printf("\n| | trained with the causal mask | trained with no mask |\n|---|---|---|\n");
  std::printf("| training loss, as trained (mean of the last 5 %% of steps) | %.3f | %.3f |\n",
              tail_mean(results[0].run.train_losses), tail_mean(results[1].run.train_losses));
  std::printf("| validation loss under the causal mask (how text is generated) | %.3f | %.3f |\n",
              results[0].run.validation_loss, results[1].run.validation_loss);
  std::printf("| uniform guess ln(V), V = %lld | %.3f | %.3f |\n",
              static_cast<long long>(results[0].run.vocabulary_size), uniform, uniform);
  std::printf(
      "| mean weight on key i+1, most copying head (layer, head) | %.3f (%lld, %lld) | "
      "%.3f (%lld, %lld) |\n",
      results[0].copying.weight, static_cast<long long>(results[0].copying.layer),
      static_cast<long long>(results[0].copying.head), results[1].copying.weight,
      static_cast<long long>(results[1].copying.layer),
      static_cast<long long>(results[1].copying.head));
  const std::string prompt_text = results[0].loaded.vocabulary.decode(prompt);
  std::printf("\ngreedy samples from the prompt \"%s\":\n  causal: %s%s\n  none:   %s%s\n",
              printable(prompt_text).c_str(), printable(prompt_text).c_str(),
              printable(results[0].sample).c_str(), printable(prompt_text).c_str(),
              printable(results[1].sample).c_str());
}

// The loss curves of both runs in one plot; returns its path.
std::string write_loss_curves(const std::string& out, const std::vector<AblationRun>& results) {
  std::vector<PlotSeries> series;
  const Rgb colours[2][2] = {{{33, 113, 181}, {107, 174, 214}}, {{203, 24, 29}, {252, 146, 114}}};
  for (size_t m = 0; m < results.size(); ++m) {
    PlotSeries train{results[m].mask + ": training loss (as trained)", {}, {}, colours[m][1]};
    for (size_t n = 0; n < results[m].run.train_losses.size(); ++n) {
      train.x.push_back(static_cast<double>(n + 1));
      train.y.push_back(results[m].run.train_losses[n]);
    }
    PlotSeries validation{
        results[m].mask + ": validation loss (causal)", {}, {}, colours[m][0], true};
    for (const auto& [step, loss] : results[m].run.validation_losses) {
      validation.x.push_back(static_cast<double>(step));
      validation.y.push_back(loss);
    }
    series.push_back(train);
    series.push_back(validation);
  }
  const std::string curves = out + "/loss_curves.png";
  write_line_plot(curves, series, "maskattn gpt ablate: with and without the look-ahead mask",
                  "step", "loss (nats per character)");
  return curves;
}

// Each model's attention over `line` in its most copying head's layer, one PNG per model;
// returns the paths.
std::vector<std::string> write_attention_maps(const std::string& out,
                                              const std::vector<AblationRun>& results,
                                              const std::vector<int32_t>& line) {
  HeatmapLabels labels;
  for (const int32_t id : line)
    labels.rows.push_back(printable(results[0].loaded.vocabulary.token(id)));
  labels.cols = labels.rows;
  std::vector<std::string> written;
  for (const AblationRun& r : results) {
    const int64_t H = r.loaded.parameters.config().heads, L = static_cast<int64_t>(line.size());
    std::vector<HeatmapPanel> panels =
        heatmap_panels(Array<uint8_t>({1, H, L, L}, r.copying.allowed), r.copying.weights, H);
    for (size_t h = 0; h < panels.size(); ++h) {
      panels[h].title = fmt::format("{}: layer {} head {}", r.mask, r.copying.layer, h);
    }
    const std::string path = out + "/attention_" + r.mask + ".png";
    write_heatmap(path, panels, labels);
    written.push_back(path);
  }
  return written;
}

}  // namespace

int run_gpt_ablate(const GptArgs& args) {
  const model::TextCorpus corpus = model::read_corpus(args.texts);
  std::vector<AblationRun> results;
  for (const char* mask : {"causal", "none"}) {
    GptArgs one = args;
    one.mask = mask;
    std::fprintf(stderr, "gpt ablate: training with mask %s\n", mask);
    const std::string out = args.out + "/" + mask;
    TrainedRun run = train_model(one, corpus, out, false);
    results.push_back({mask, std::move(run), model::load_model(out), {}, {}});
  }
  const std::vector<int32_t> line = validation_line(results[0].loaded, corpus.text);
  const std::vector<int32_t> prompt(line.begin(), line.begin() + std::min<size_t>(line.size(), 24));
  for (AblationRun& r : results) {
    r.copying = copying_head(r.loaded, line);
    model::GptDecoder decoder(r.loaded.parameters, r.loaded.values.data(), args.threads);
    model::GenerateOptions greedy;
    greedy.temperature = 0;
    greedy.tokens = 120;
    r.sample = r.loaded.vocabulary.decode(model::generate(decoder, prompt, greedy).tokens);
  }
  print_ablation(results, prompt);
  std::vector<std::string> written = {write_loss_curves(args.out, results)};
  for (const std::string& path : write_attention_maps(args.out, results, line)) {
    written.push_back(path);
  }
  std::printf("\nwrote");
  for (const std::string& path : written) std::printf(" %s", path.c_str());
  std::printf(" and both checkpoints (%s/causal, %s/none)\n", args.out.c_str(), args.out.c_str());
  return 0;
}

}  // namespace maskattn::cli
