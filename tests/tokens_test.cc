// Tokens and batches: fixed special ids, <unk> for unknown words, collate() on both sides with
// the mask components that go with it, <sep> segments, and the property that padding (side and
// amount) never changes the outputs of real tokens.
#include <algorithm>

#include "test_util.h"

namespace maskattn {
namespace {

TEST(Vocabulary, SpecialTokensHaveFixedIdsAndUnknownWordsMapToUnk) {
  const Vocabulary vocabulary({"I", "love", "dog", "love"});
  EXPECT_EQ(vocabulary.size(), 10);
  EXPECT_EQ(vocabulary.id("<pad>"), kPadId);
  EXPECT_EQ(vocabulary.id("<unk>"), kUnkId);
  EXPECT_EQ(vocabulary.id("<bos>"), kBosId);
  EXPECT_EQ(vocabulary.id("<eos>"), kEosId);
  EXPECT_EQ(vocabulary.id("<sep>"), kSepId);
  EXPECT_EQ(vocabulary.id("<cls>"), kClsId);
  EXPECT_EQ(vocabulary.id("<mask>"), kMaskId);
  EXPECT_EQ(vocabulary.id("love"), 8);  // the duplicate kept its first id
  EXPECT_EQ(vocabulary.id("cat"), kUnkId);
  const std::vector<int64_t> ids = vocabulary.encode("I love cat <sep> dog");
  EXPECT_EQ(ids, (std::vector<int64_t>{kBosId, 7, 8, kUnkId, kSepId, 9, kEosId}));
  EXPECT_EQ(vocabulary.decode(ids),
            (std::vector<std::string>{"<bos>", "I", "love", "<unk>", "<sep>", "dog", "<eos>"}));
  EXPECT_EQ(vocabulary.encode("dog", false, false), (std::vector<int64_t>{9}));
  EXPECT_MASKATTN_ERROR(vocabulary.token(10), "vocabulary: id 10 is outside [0, 10)");
  Vocabulary growing;
  EXPECT_MASKATTN_ERROR(growing.add("two words"), "is empty or contains whitespace");
}

TEST(Collate, BothSidesWithLengthsStartsAndSegments) {
  const std::vector<std::vector<int64_t>> sequences = {{2, 6, 4, 7, 3}, {2, 8, 3}};
  const TokenBatch right = collate(sequences, PadSide::right);
  EXPECT_EQ(right.ids.values(), (std::vector<int64_t>{2, 6, 4, 7, 3, 2, 8, 3, 0, 0}));
  EXPECT_EQ(right.lengths, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(right.starts, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(right.segments.values(), (std::vector<int64_t>{0, 0, 0, 1, 1, 0, 0, 0, -1, -1}));
  const TokenBatch left = collate(sequences, PadSide::left, 6);
  EXPECT_EQ(left.ids.values(), (std::vector<int64_t>{0, 2, 6, 4, 7, 3, 0, 0, 0, 2, 8, 3}));
  EXPECT_EQ(left.starts, (std::vector<int64_t>{1, 3}));
  EXPECT_MASKATTN_ERROR(collate({}, PadSide::right), "collate: no sequences");
  EXPECT_MASKATTN_ERROR(collate({{2, -1}}, PadSide::right), "negative token id -1 at 1");
}

TEST(Collate, MasksOfAPaddedBatch) {
  const TokenBatch left = collate({{2, 6, 7, 3}, {2, 8}}, PadSide::left);
  // Left padding + causal: the first real token sees only itself, <pad> rows see nothing.
  EXPECT_EQ(test::grid(left.decoder_self_attention(), {2, 1, 4, 4}, 1),
            (std::vector<std::string>{"....", "....", "..1.", "..11"}));
  const TokenBatch right = collate({{2, 6, 7, 3}, {2, 8}}, PadSide::right);
  EXPECT_EQ(test::grid(right.decoder_self_attention(), {2, 1, 4, 4}, 1),
            (std::vector<std::string>{"1...", "11..", "....", "...."}));
  EXPECT_EQ(test::grid(right.encoder_self_attention(), {2, 1, 4, 4}, 1),
            (std::vector<std::string>{"11..", "11..", "....", "...."}));
  const TokenBatch pair = collate({{2, 6, 4, 7, 3}}, PadSide::right);
  EXPECT_EQ(test::grid(pair.segment_attention(), {1, 1, 5, 5}),
            (std::vector<std::string>{"111..", "111..", "111..", "...11", "...11"}));
}

TEST(Collate, CrossAttentionIgnoresEncoderPads) {
  const TokenBatch source = collate({{2, 6, 7, 3}, {2, 8, 3}}, PadSide::right);
  const TokenBatch target = collate({{2, 9}, {2, 9, 10}}, PadSide::right);
  const Mask mask = cross_attention(target, source);
  EXPECT_EQ(test::grid(mask, {2, 1, 3, 4}, 0), (std::vector<std::string>{"1111", "1111", "...."}));
  EXPECT_EQ(test::grid(mask, {2, 1, 3, 4}, 1), (std::vector<std::string>{"111.", "111.", "111."}));
  EXPECT_MASKATTN_ERROR(cross_attention(target, collate({{2}}, PadSide::right)),
                        "cross_attention: the decoder batch has B=2 sequences but the encoder "
                        "batch has B=1");
}

TEST(Collate, ImageTokensSeeLaterImageTokensAndTextNeverSeesTheFuture) {
  // <bos> then 3 image tokens (positions 1-3), then text.
  const Mask mask = image_text({1}, {3}, 6);
  EXPECT_EQ(test::grid(mask, {1, 1, 6, 6}), (std::vector<std::string>{"1.....",  //
                                                                      "1111..",  //
                                                                      "1111..",  //
                                                                      "1111..",  //
                                                                      "11111.",  //
                                                                      "111111"}));
  EXPECT_MASKATTN_ERROR(image_text({4}, {3}, 6), "image tokens [4, 7) outside [0, 6)");
}

TEST(DataMasking, MaePatchMaskingKeepsASeededSubset) {
  const PatchMasking a = mae_patch_masking(196, 0.75, 7), b = mae_patch_masking(196, 0.75, 7);
  EXPECT_EQ(a.kept, b.kept);  // reproducible from the seed
  EXPECT_EQ(a.kept.size(), 49u);
  EXPECT_TRUE(std::is_sorted(a.kept.begin(), a.kept.end()));
  EXPECT_NE(a.kept, mae_patch_masking(196, 0.75, 8).kept);
  // As a mask: kept patches see exactly the kept patches; masked ones see nothing.
  const Array<uint8_t> pairs = allowed_pairs(a.mask(), {1, 1, 196, 196});
  for (int64_t i = 0; i < 196; ++i) {
    for (int64_t j = 0; j < 196; ++j) {
      ASSERT_EQ(pairs.values()[i * 196 + j], a.keep[i] && a.keep[j]) << i << "," << j;
    }
  }
  EXPECT_MASKATTN_ERROR(mae_patch_masking(10, 1.0, 1), "need patches ≥ 1 and a ratio in [0, 1)");
}

TEST(DataMasking, MlmSelectsFifteenPercentSplitEightyTenTen) {
  // 20000 word tokens and a few specials: the rates are checked to within a few standard errors.
  std::vector<int64_t> ids(20000);
  for (size_t n = 0; n < ids.size(); ++n) ids[n] = n % 100 == 0 ? kPadId : 7 + n % 50;
  const MlmExample mlm = mlm_masking(Array<int64_t>({4, 5000}, ids), 57, 3);
  int64_t selected = 0, masked = 0, random_word = 0, kept = 0;
  for (size_t n = 0; n < ids.size(); ++n) {
    const int64_t label = mlm.labels.values()[n], input = mlm.inputs.values()[n];
    if (ids[n] == kPadId) {
      ASSERT_EQ(label, -100);  // never selected
      ASSERT_EQ(input, kPadId);
      continue;
    }
    if (label == -100) {
      ASSERT_EQ(input, ids[n]);
      continue;
    }
    ASSERT_EQ(label, ids[n]);
    ++selected;
    if (input == kMaskId) {
      ++masked;
    } else if (input == ids[n]) {
      ++kept;
    } else {
      ++random_word;
      ASSERT_GT(input, kMaskId);
      ASSERT_LT(input, 57);
    }
  }
  EXPECT_NEAR(selected / 19800.0, 0.15, 0.01);
  EXPECT_NEAR(masked / static_cast<double>(selected), 0.8, 0.03);
  // A random word equal to the original counts as kept: ~10 % + 10 %/50 and ~10 % − that.
  EXPECT_NEAR(kept / static_cast<double>(selected), 0.102, 0.02);
  EXPECT_NEAR(random_word / static_cast<double>(selected), 0.098, 0.02);
}

TEST(Collate, PaddingNeverChangesTheOutputsOfRealTokens) {
  // Sequences of 10 to 19 tokens, collated left and right to 24 and 40 columns; each real row of
  // the decoder must equal, bit for bit, the same sequence run alone under a causal mask.
  const int64_t D = 16;
  std::vector<std::vector<int64_t>> sequences;
  for (int64_t n = 0; n < 4; ++n) {
    std::vector<int64_t> sequence = {kBosId};
    for (int64_t t = 0; t < 8 + 3 * n; ++t) sequence.push_back(6 + (t * 7 + n) % 20);
    sequence.push_back(kEosId);
    sequences.push_back(sequence);
  }
  const auto embed = [&](int64_t id) { return test::random_values(D, 1000 + id); };
  std::vector<std::vector<float>> alone;
  for (const auto& sequence : sequences) {
    const int64_t L = static_cast<int64_t>(sequence.size());
    std::vector<float> x;
    for (int64_t id : sequence) {
      const std::vector<float> e = embed(id);
      x.insert(x.end(), e.begin(), e.end());
    }
    std::vector<float> out(x.size());
    const TensorView view(x.data(), {1, 1, L, D});
    attention(view, view, view, MutableTensorView(out.data(), {1, 1, L, D}), Mask().causal());
    alone.push_back(out);
  }
  for (PadSide side : {PadSide::right, PadSide::left}) {
    for (int64_t length : {24, 40}) {
      const TokenBatch batch = collate(sequences, side, length);
      const int64_t B = batch.ids.dim(0), L = batch.ids.dim(1);
      std::vector<float> x;
      for (int64_t id : batch.ids.values()) {
        const std::vector<float> e = embed(id);
        x.insert(x.end(), e.begin(), e.end());
      }
      std::vector<float> out(x.size());
      const TensorView view(x.data(), {B, 1, L, D});
      attention(view, view, view, MutableTensorView(out.data(), {B, 1, L, D}),
                batch.decoder_self_attention());
      for (int64_t b = 0; b < B; ++b) {
        const float* row = out.data() + (b * L + batch.starts[b]) * D;
        EXPECT_TRUE(std::equal(alone[b].begin(), alone[b].end(), row))
            << (side == PadSide::left ? "left" : "right") << " L=" << length << " b=" << b;
        for (int64_t t = 0; t < L; ++t) {  // <pad> rows are exactly zero
          if (t >= batch.starts[b] && t < batch.starts[b] + batch.lengths[b]) continue;
          for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out[(b * L + t) * D + d], 0.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace maskattn
