// Checkpoints of the GPT trainer: a directory PyTorch can read.
//
//   <state_dict name>.npy        every parameter, float32, e.g. transformer.h.0.attn.c_attn.weight
//   lm_head.weight.npy           the tied head (a copy of transformer.wte.weight), so that
//                                model.load_state_dict() of a nanoGPT-shaped model loads strictly
//   optimizer.exp_avg.npy        AdamW's two moments, flat, in the parameters' order
//   optimizer.exp_avg_sq.npy
//   vocabulary.npy               int64 [characters, 5]: byte count, then up to 4 UTF-8 bytes
//   config.txt                   "key value" lines: the model, the training options, the step
//                                and the batch sampler's state (doubles to 17 digits: exact)
// Loading checks every tensor's presence and shape against config.txt and names what is wrong.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "maskattn/error.h"
#include "maskattn/model/trainer.h"
#include "maskattn/npy.h"

namespace maskattn::model {

namespace {

std::string path_in(const std::string& directory, const std::string& file) {
  return (std::filesystem::path(directory) / file).string();
}

std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::vector<float> read_floats(const std::string& directory, const std::string& name,
                               const Dims& shape) {
  const std::string path = path_in(directory, name + ".npy");
  if (!std::filesystem::exists(path)) {
    throw Error("gpt: checkpoint " + directory + " has no " + name + ".npy");
  }
  const NpyArray array = read_npy(path);
  if (array.shape() != shape) {
    throw Error("gpt: checkpoint tensor " + name + " has shape " + shape_string(array.shape()) +
                "; the model needs " + shape_string(shape));
  }
  return array.to_float32(name);
}

std::map<std::string, std::string> read_config(const std::string& directory) {
  std::ifstream in(path_in(directory, "config.txt"));
  if (!in) throw Error("gpt: " + directory + " is not a checkpoint (no config.txt)");
  std::map<std::string, std::string> values;
  for (std::string key, value; in >> key >> value;) values[key] = value;
  return values;
}

}  // namespace

void Trainer::save(const std::string& directory) const {
  std::filesystem::create_directories(directory);
  for (const NamedTensor& tensor : gpt_.parameters().tensors()) {
    const std::vector<float> values(params_.begin() + tensor.offset,
                                    params_.begin() + tensor.offset + tensor.size);
    write_npy(path_in(directory, tensor.name + ".npy"),
              NpyArray::from_floats(values, tensor.shape));
    if (tensor.name == "transformer.wte.weight") {
      write_npy(path_in(directory, "lm_head.weight.npy"),
                NpyArray::from_floats(values, tensor.shape));
    }
  }
  const auto count = static_cast<int64_t>(params_.size());
  write_npy(path_in(directory, "optimizer.exp_avg.npy"), NpyArray::from_floats(exp_avg_, {count}));
  write_npy(path_in(directory, "optimizer.exp_avg_sq.npy"),
            NpyArray::from_floats(exp_avg_sq_, {count}));
  std::vector<int64_t> characters;
  for (const std::string& character : vocabulary_.characters()) {
    characters.push_back(static_cast<int64_t>(character.size()));
    for (size_t n = 0; n < 4; ++n) {
      characters.push_back(n < character.size() ? static_cast<unsigned char>(character[n]) : 0);
    }
  }
  write_npy(
      path_in(directory, "vocabulary.npy"),
      NpyArray::from_int64(characters, {static_cast<int64_t>(vocabulary_.characters().size()), 5}));
  const GptConfig& m = options_.model;
  std::ofstream config(path_in(directory, "config.txt"));
  config << "vocab " << m.vocab << "\ncontext " << m.context << "\nlayers " << m.layers
         << "\nd_model " << m.d_model << "\nheads " << m.heads << "\nln_eps " << exact(m.ln_eps)
         << "\ncausal " << options_.causal << "\npadded_lines " << options_.padded_lines
         << "\nbatch " << options_.batch << "\nsteps " << options_.steps << "\nwarmup "
         << options_.warmup << "\nlr " << exact(options_.lr) << "\nmin_lr "
         << exact(options_.min_lr) << "\nweight_decay " << exact(options_.weight_decay) << "\nclip "
         << exact(options_.clip) << "\nseed " << options_.seed << "\nstep " << step_
         << "\nsampler_state " << sampler_.state() << "\n";
  if (!config) throw Error("gpt: cannot write " + path_in(directory, "config.txt"));
}

namespace {

const std::string& config_value(const std::string& directory,
                                const std::map<std::string, std::string>& config, const char* key) {
  const auto found = config.find(key);
  if (found == config.end()) {
    throw Error("gpt: checkpoint " + directory + "/config.txt has no '" + key + "' line");
  }
  return found->second;
}

// The options config.txt records (threads are the caller's).
TrainOptions read_options(const std::string& directory,
                          const std::map<std::string, std::string>& config) {
  const auto value = [&](const char* key) { return config_value(directory, config, key); };
  TrainOptions options;
  try {
    options.model.vocab = std::stoll(value("vocab"));
    options.model.context = std::stoll(value("context"));
    options.model.layers = std::stoll(value("layers"));
    options.model.d_model = std::stoll(value("d_model"));
    options.model.heads = std::stoll(value("heads"));
    options.model.ln_eps = std::stof(value("ln_eps"));
    options.causal = value("causal") == "1";
    options.padded_lines = value("padded_lines") == "1";
    options.batch = std::stoll(value("batch"));
    options.steps = std::stoll(value("steps"));
    options.warmup = std::stoll(value("warmup"));
    options.lr = std::stod(value("lr"));
    options.min_lr = std::stod(value("min_lr"));
    options.weight_decay = std::stod(value("weight_decay"));
    options.clip = std::stod(value("clip"));
    options.seed = std::stoull(value("seed"));
  } catch (const std::logic_error&) {  // stoll and friends on text that is not a number
    throw Error("gpt: checkpoint " + directory + "/config.txt holds a value that is not a number");
  }
  return options;
}

CharVocabulary read_vocabulary(const std::string& directory) {
  const std::string path = path_in(directory, "vocabulary.npy");
  if (!std::filesystem::exists(path)) {
    throw Error("gpt: checkpoint " + directory + " has no vocabulary.npy");
  }
  const NpyArray characters = read_npy(path);
  if (characters.rank() != 2 || characters.shape()[1] != 5) {
    throw Error("gpt: checkpoint vocabulary.npy has shape " + shape_string(characters.shape()) +
                "; expected [characters, 5]");
  }
  const std::vector<int64_t> packed = characters.to_int64("vocabulary.npy");
  std::vector<std::string> vocabulary;
  for (size_t at = 0; at + 5 <= packed.size(); at += 5) {
    std::string character;
    for (int64_t n = 0; n < std::clamp<int64_t>(packed[at], 0, 4); ++n) {
      character += static_cast<char>(packed[at + 1 + n]);
    }
    vocabulary.push_back(character);
  }
  return CharVocabulary(std::move(vocabulary));
}

void read_parameters(const std::string& directory, const GptParameters& parameters,
                     std::vector<float>& values) {
  values.assign(parameters.count(), 0.0f);
  for (const NamedTensor& tensor : parameters.tensors()) {
    const std::vector<float> read = read_floats(directory, tensor.name, tensor.shape);
    std::copy(read.begin(), read.end(), values.begin() + tensor.offset);
  }
}

void check_vocabulary(const std::string& directory, const TrainOptions& options,
                      const CharVocabulary& vocabulary) {
  if (vocabulary.size() != options.model.vocab) {
    throw Error("gpt: checkpoint " + directory + " has a vocabulary of " +
                std::to_string(options.model.vocab) + " tokens but vocabulary.npy gives " +
                std::to_string(vocabulary.size()));
  }
}

}  // namespace

LoadedModel load_model(const std::string& directory) {
  const std::map<std::string, std::string> config = read_config(directory);
  const TrainOptions options = read_options(directory, config);
  CharVocabulary vocabulary = read_vocabulary(directory);
  check_vocabulary(directory, options, vocabulary);
  LoadedModel model{std::move(vocabulary),
                    GptParameters(options.model),
                    {},
                    options.causal,
                    std::stoll(config_value(directory, config, "step"))};
  read_parameters(directory, model.parameters, model.values);
  return model;
}

Trainer Trainer::resume(const std::string& directory, const std::vector<int32_t>& tokens,
                        int threads) {
  const std::map<std::string, std::string> config = read_config(directory);
  TrainOptions options = read_options(directory, config);
  options.threads = threads;
  CharVocabulary vocabulary = read_vocabulary(directory);
  check_vocabulary(directory, options, vocabulary);
  Trainer trainer(std::move(vocabulary), tokens, options, false);
  read_parameters(directory, trainer.gpt_.parameters(), trainer.params_);
  const auto count = static_cast<int64_t>(trainer.params_.size());
  trainer.exp_avg_ = read_floats(directory, "optimizer.exp_avg", {count});
  trainer.exp_avg_sq_ = read_floats(directory, "optimizer.exp_avg_sq", {count});
  trainer.step_ = std::stoll(config_value(directory, config, "step"));
  trainer.sampler_.set_state(std::stoull(config_value(directory, config, "sampler_state")));
  return trainer;
}

}  // namespace maskattn::model
