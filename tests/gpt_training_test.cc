// Training the GPT model: the character vocabulary, the corpus and its batches, the loss falling
// on a small text, checkpoints that resume bitwise, and checkpoint errors.
#include <filesystem>
#include <fstream>

#include "maskattn/model/trainer.h"
#include "maskattn/npy.h"
#include "test_util.h"

namespace maskattn {
namespace {

using model::CharVocabulary;
using model::Trainer;
using model::TrainOptions;

const std::string kText =
    "the cat sat on the mat.\nthe dog sat on the log.\nthe cat saw the dog.\n"
    "a cat and a dog sat on a mat and a log.\n";

std::string repeated_text(int times) {
  std::string text;
  for (int n = 0; n < times; ++n) text += kText;
  return text;
}

TrainOptions tiny_options() {
  TrainOptions options;
  options.model.context = 16;
  options.model.layers = 1;
  options.model.d_model = 16;
  options.model.heads = 2;
  options.batch = 4;
  options.steps = 40;
  options.lr = 1e-2;
  options.threads = 1;
  return options;
}

TEST(CharVocabulary, SpecialTokensFirstThenCharactersUnknownIsUnk) {
  const CharVocabulary vocabulary = CharVocabulary::from_text("bac é");
  EXPECT_EQ(vocabulary.size(), 7 + 5);  // ' ', a, b, c, é
  EXPECT_EQ(vocabulary.token(0), "<pad>");
  EXPECT_EQ(vocabulary.token(3), "<eos>");
  EXPECT_EQ(vocabulary.token(7), " ");
  const std::vector<int32_t> ids = vocabulary.encode("cab éz");
  EXPECT_EQ(ids, (std::vector<int32_t>{10, 8, 9, 7, 11, 1}));  // z is unknown: <unk>
  EXPECT_EQ(vocabulary.decode(ids), "cab é<unk>");
  EXPECT_MASKATTN_ERROR(CharVocabulary::from_text(""), "gpt: the training text is empty");
  EXPECT_MASKATTN_ERROR(vocabulary.token(12), "gpt: token id 12 is outside the vocabulary [0, 12)");
}

TEST(TextData, CorpusFilesAndTheirErrors) {
  test::TempDir dir;
  std::ofstream(dir.path("a.txt")) << "first";
  std::ofstream(dir.path("b.txt")) << "second";
  std::ofstream(dir.path("empty.txt"));
  EXPECT_EQ(model::read_corpus({dir.path("a.txt"), dir.path("b.txt")}).text, "first\nsecond");
  EXPECT_MASKATTN_ERROR(model::read_corpus({dir.path("missing.txt")}),
                        "gpt: cannot read the text file");
  EXPECT_MASKATTN_ERROR(model::read_corpus({dir.path("empty.txt")}),
                        "gpt: the training text is empty");
  if (std::filesystem::is_directory(model::kDefaultCorpusDirectory)) {
    EXPECT_GT(model::read_corpus({}).text.size(), 10000u);  // Debian's licence texts
  }
}

TEST(TextData, FixedWindowsPredictTheNextToken) {
  std::vector<int32_t> tokens(100);
  for (int32_t n = 0; n < 100; ++n) tokens[n] = n;
  model::BatchSampler sampler(&tokens, 8, false, -1, 3);
  std::vector<int32_t> x, y;
  EXPECT_EQ(sampler.draw(5, x, y), 8);
  for (int64_t n = 0; n < 40; ++n) {
    EXPECT_EQ(y[n], x[n] + 1);
    if (n % 8 != 0) {
      EXPECT_EQ(x[n], x[n - 1] + 1);
    }
  }
  std::vector<int32_t> few(5);
  model::BatchSampler short_sampler(&few, 8, false, -1, 3);
  EXPECT_MASKATTN_ERROR(short_sampler.draw(1, x, y), "fewer than one window of context + 1 = 9");
}

TEST(TextData, PaddedLinesAreBosLineEosWithIgnoredPadding) {
  const CharVocabulary vocabulary = CharVocabulary::from_text("ab\ncde\n");
  const std::vector<int32_t> tokens = vocabulary.encode("ab\ncde\n");
  const int32_t newline = vocabulary.encode("\n")[0];
  model::BatchSampler sampler(&tokens, 16, true, newline, 5);
  std::vector<int32_t> x, y;
  const int64_t length = sampler.draw(8, x, y);
  EXPECT_TRUE(length == 3 || length == 4);  // <bos> a b <eos> or <bos> c d e <eos>, minus one
  for (int64_t b = 0; b < 8; ++b) {
    EXPECT_EQ(x[b * length], 2);  // <bos>
    bool padding = false;
    for (int64_t t = 0; t < length; ++t) {
      if (x[b * length + t] == 0) padding = true;
      if (padding) {
        EXPECT_EQ(x[b * length + t], 0);
        EXPECT_EQ(y[b * length + t], model::kIgnoreTarget);
      }
    }
  }
}

TEST(Trainer, TheLossFallsOnASmallText) {
  const std::string text = repeated_text(20);
  const CharVocabulary vocabulary = CharVocabulary::from_text(text);
  Trainer trainer(vocabulary, vocabulary.encode(text), tiny_options());
  const double first = trainer.step();
  double last = first;
  for (int n = 1; n < 40; ++n) last = trainer.step();
  EXPECT_LT(last, 0.6 * first) << "first " << first << ", last " << last;
  EXPECT_LT(trainer.validation_loss(2), first);
  EXPECT_EQ(trainer.steps_done(), 40);
}

TEST(Trainer, CheckpointSaveLoadContinueIsBitwiseTheSameAsNeverStopping) {
  const std::string text = repeated_text(20);
  const CharVocabulary vocabulary = CharVocabulary::from_text(text);
  const std::vector<int32_t> tokens = vocabulary.encode(text);
  for (const bool padded : {false, true}) {
    TrainOptions options = tiny_options();
    options.padded_lines = padded;
    Trainer straight(vocabulary, tokens, options);
    for (int n = 0; n < 6; ++n) straight.step();
    Trainer first_half(vocabulary, tokens, options);
    for (int n = 0; n < 3; ++n) first_half.step();
    test::TempDir dir;
    first_half.save(dir.path("checkpoint"));
    Trainer resumed = Trainer::resume(dir.path("checkpoint"), tokens, 2);
    EXPECT_EQ(resumed.steps_done(), 3);
    for (int n = 0; n < 3; ++n) resumed.step();
    EXPECT_EQ(resumed.values(), straight.values()) << (padded ? "padded lines" : "windows");
  }
}

TEST(Trainer, CheckpointWithAMissingOrMisShapedTensorIsAClearError) {
  const std::string text = repeated_text(5);
  const CharVocabulary vocabulary = CharVocabulary::from_text(text);
  const std::vector<int32_t> tokens = vocabulary.encode(text);
  Trainer trainer(vocabulary, tokens, tiny_options());
  test::TempDir dir;
  const std::string checkpoint = dir.path("checkpoint");
  trainer.save(checkpoint);
  EXPECT_TRUE(std::filesystem::exists(checkpoint + "/lm_head.weight.npy"));
  const std::string ln = checkpoint + "/transformer.h.0.ln_1.weight.npy";
  write_npy(ln, NpyArray::from_floats(std::vector<float>(8, 1.0f), {8}));
  EXPECT_MASKATTN_ERROR(Trainer::resume(checkpoint, tokens, 1),
                        "gpt: checkpoint tensor transformer.h.0.ln_1.weight has shape [8]; the "
                        "model needs [16]");
  std::filesystem::remove(ln);
  EXPECT_MASKATTN_ERROR(Trainer::resume(checkpoint, tokens, 1),
                        "has no transformer.h.0.ln_1.weight.npy");
  EXPECT_MASKATTN_ERROR(Trainer::resume(dir.path("nothing"), tokens, 1),
                        "is not a checkpoint (no config.txt)");
}

}  // namespace
}  // namespace maskattn
