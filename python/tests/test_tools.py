"""The debugging and data tools from Python, each against an expectation built independently
with NumPy (masks written out with tril/triu and padding rules, softmax entropies in float64,
PNG/SVG file contents): the leakage audit, the health report, the heatmaps, the vocabulary,
collate and its masks, the image–text, MAE and MLM builders. Tests named test_P5x_ check the
argument errors of docs/errors.md's Python table, rows P50–P59."""

import re

import numpy as np
import pytest

import maskattn as ma

L = 6


def causal_keep(q_len, k_len=None):
    """Bottom-right aligned causal keep matrix [q_len, k_len]: key j visible to query i iff
    j <= i + (k_len - q_len)."""
    k_len = q_len if k_len is None else k_len
    return np.tril(np.ones((q_len, k_len), dtype=np.uint8), k_len - q_len)


def pairs_where(matrix4):
    return [tuple(int(x) for x in index) for index in np.argwhere(matrix4)]


# --- audit_mask ---------------------------------------------------------------------------------


def test_audit_catches_a_blocked_matrix_built_with_tril_instead_of_triu():
    wrong = ma.Mask().blocked(np.tril(np.ones((L, L)), -1))  # hides the past, not the future
    report = ma.audit_mask(wrong, expected=ma.Mask().causal(), batch=2, q_heads=2, kv_heads=1,
                           q_len=L)
    assert not report.passed
    keep = np.broadcast_to(causal_keep(L), (2, 2, L, L))
    wrong_keep = np.broadcast_to(np.triu(np.ones((L, L), dtype=np.uint8)), (2, 2, L, L))
    assert report.shape == (2, 2, L, L)
    assert report.leaks == pairs_where(wrong_keep & (1 - keep))  # the future, in (b, h, i, j) order
    assert report.blind_spots == pairs_where(keep & (1 - wrong_keep))
    assert report.kernel_leaks == []
    np.testing.assert_array_equal(report.allowed, wrong_keep)
    np.testing.assert_array_equal(report.expected, keep)
    np.testing.assert_array_equal(report.influence, wrong_keep)
    assert report.allowed_count == int(wrong_keep.sum())
    assert report.hidden_count == 2 * 2 * L * L - report.allowed_count
    assert "FAILED" in report.summary() and "(0, 0, 0, 1)" in report.summary()
    assert "passed=False" in repr(report) and "leaks=60" in repr(report)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_audit_passes_the_right_mask_with_influence_equal_to_it(dtype):
    right = ma.Mask().blocked(np.triu(np.ones((L, L)), 1))
    report = ma.audit_mask(right, expected=ma.Mask().causal(), batch=2, q_heads=2, kv_heads=1,
                           q_len=L, dtype=dtype)
    assert report.passed
    assert report.leaks == report.blind_spots == report.kernel_leaks == report.silent_pairs == []
    np.testing.assert_array_equal(report.influence, np.broadcast_to(causal_keep(L), (2, 2, L, L)))
    assert report.allowed.dtype == np.uint8 and report.influence.dtype == np.uint8
    assert "PASSED" in report.summary()


def test_audit_reports_empty_rows_of_a_keep_matrix_passed_as_blocked():
    flipped = ma.Mask().blocked(np.tril(np.ones((L, L))))  # the last query sees nothing
    report = ma.audit_mask(flipped, batch=1, q_heads=2, q_len=L)
    assert report.expected is None and not report.has_expected
    assert report.leaks == [] and report.blind_spots == []  # not checked without `expected`
    assert report.empty_rows == [(0, 0, L - 1), (0, 1, L - 1)]
    assert report.passed


def test_audit_with_kv_cache_shapes():
    # A decode step (Lq=1, Lk=5): bottom-right causal sees every cached key; top-left sees one.
    top_left = ma.Mask().causal("top_left")
    report = ma.audit_mask(top_left, expected=ma.Mask().causal(), q_len=1, k_len=5)
    assert report.blind_spots == [(0, 0, 0, j) for j in range(1, 5)]


# --- health_report ------------------------------------------------------------------------------


def reference_weights(q, k, keep, scale):
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    scores = np.where(keep, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores, weights / weights.sum(axis=-1, keepdims=True)


def test_health_report_matches_numpy_entropy_scores_and_hidden_fraction():
    rng = np.random.default_rng(0)
    B, H, D = 2, 3, 8
    q, k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(3))
    report = ma.health_report(q, k, v, ma.Mask().causal())
    keep = np.broadcast_to(causal_keep(L).astype(bool), (B, H, L, L))
    scores, weights = reference_weights(q, k, keep, 1 / np.sqrt(D))
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(weights > 0, weights * np.log(weights), 0.0).sum(axis=-1).mean(axis=-1)
    assert [(x.b, x.h) for x in report.heads] == [(b, h) for b in range(B) for h in range(H)]
    for x in report.heads:
        assert x.mean_entropy == pytest.approx(entropy[x.b, x.h], abs=1e-5)
        allowed = scores[x.b, x.h][keep[x.b, x.h]]
        assert x.score_min == pytest.approx(allowed.min(), abs=1e-5)
        assert x.score_max == pytest.approx(allowed.max(), abs=1e-5)
        assert x.hidden_fraction == pytest.approx(15 / 36)
        assert x.empty_rows == x.nan_count == x.inf_count == 0
    assert report.warnings == []
    assert "entropy" in report.summary()


def test_health_report_blhd_layout_max_heads_empty_rows_and_sentinel_warning():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, L, 2, 4)).astype(np.float32)  # [B, L, H, D]
    additive = np.where(causal_keep(L) > 0, 0.0, -1e9).astype(np.float32)
    mask = ma.Mask().additive(additive).query_lengths([4])
    report = ma.health_report(q, q, q, mask, layout="blhd", max_heads=1)
    assert len(report.heads) == 1
    assert report.heads[0].empty_rows == 2  # the two query rows beyond length 4
    assert any("finite value -1e+09" in w for w in report.warnings)


def test_health_report_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 1, 3, 4, requires_grad=True)
    report = ma.health_report(q, q, q)
    assert report.heads[0].hidden_fraction == 0.0 and report.heads[0].empty_rows == 0


# --- heatmaps -----------------------------------------------------------------------------------


def hidden_cells(svg):
    return svg.count('fill="url(#hidden)"') - 1  # every hidden cell, plus the legend's swatch


def test_heatmap_svg_of_a_mask_draws_each_hidden_pair_and_the_labels():
    allowed = ma.allowed_pairs(ma.Mask().causal().key_lengths([4, 6]), 2, 1, L)
    labels = ["<bos>", "the", "cat", "sat", "down", "<eos>"]
    svg = ma.heatmap_svg(allowed, row_labels=labels, col_labels=labels)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert hidden_cells(svg) == int((allowed == 0).sum())
    assert "&lt;bos&gt;" in svg and ">cat</text>" in svg
    assert "b=0 h=0" in svg and "b=1 h=0" in svg
    one_panel = ma.heatmap_svg(allowed[0, 0])  # [Lq, Lk] is one panel
    assert hidden_cells(one_panel) == int((allowed[0, 0] == 0).sum()) and "b=1" not in one_panel


def test_heatmap_svg_of_weights_shows_each_weight():
    rng = np.random.default_rng(2)
    q, k = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(2))
    mask = ma.Mask().causal()
    weights = ma.attention_weights(q, k, mask)
    svg = ma.heatmap_svg(ma.allowed_pairs(mask, 1, 2, 4), weights, max_panels=1)
    assert "b=0 h=0" in svg and "h=1" not in svg
    _, reference = reference_weights(q, k, causal_keep(4).astype(bool), 1 / np.sqrt(8))
    for i, j in [(0, 0), (3, 1), (2, 2)]:
        assert f"{i} → {j}: {reference[0, 0, i, j]:.4f}</title>" in svg
    assert f"0 → 1: hidden</title>" in svg


def test_write_heatmap_png_and_svg(tmp_path):
    allowed = ma.allowed_pairs(ma.Mask().sliding_window(2), 1, 1, 5)
    png = tmp_path / "mask.png"
    ma.write_heatmap(png, allowed)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 5 and height > 5
    svg = tmp_path / "mask.svg"
    ma.write_heatmap(str(svg), allowed, row_labels=list("abcde"), col_labels=list("vwxyz"))
    text = svg.read_text()
    assert hidden_cells(text) == int((allowed == 0).sum()) and ">z</text>" in text


def test_write_mask_heatmap(tmp_path):
    path = tmp_path / "batch.svg"
    batch = ma.collate([[2, 7, 8, 3], [2, 9]])
    ma.write_mask_heatmap(path, batch.decoder_self_attention(), 2, 1, 4)
    text = path.read_text()
    expected = ma.allowed_pairs(batch.decoder_self_attention(), 2, 1, 4)
    assert hidden_cells(text) == int((expected == 0).sum()) and "b=1 h=0" in text
    with pytest.raises(ma.Error, match="must end in .png or .svg"):
        ma.write_mask_heatmap(tmp_path / "m.jpg", ma.Mask(), 1, 1, 2)


# --- Vocabulary, collate and the batch masks -----------------------------------------------------


def test_vocabulary_round_trip_and_special_ids():
    vocab = ma.Vocabulary("the cat sat on the mat".split())
    assert len(vocab) == vocab.size() == 7 + 5  # "the" once
    specials = ["<pad>", "<unk>", "<bos>", "<eos>", "<sep>", "<cls>", "<mask>"]
    ids = [ma.PAD_ID, ma.UNK_ID, ma.BOS_ID, ma.EOS_ID, ma.SEP_ID, ma.CLS_ID, ma.MASK_ID]
    assert [vocab.id(token) for token in specials] == ids == list(range(7))
    encoded = vocab.encode("the cat sat <sep> on a mat")
    assert encoded[0] == ma.BOS_ID and encoded[-1] == ma.EOS_ID and ma.SEP_ID in encoded
    assert vocab.decode(encoded) == ["<bos>", "the", "cat", "sat", "<sep>", "on", "<unk>", "mat",
                                     "<eos>"]
    assert vocab.encode("cat", bos=False, eos=False) == [vocab.id("cat")]
    assert vocab.decode(np.array(encoded)) == vocab.decode(encoded)
    assert vocab.add("dog") == 12 and vocab.token(12) == "dog"
    assert vocab.add("cat") == vocab.id("cat") == 8
    with pytest.raises(ma.Error, match="outside"):
        vocab.token(99)


def test_collate_right_and_left_padding():
    sequences = [[2, 7, 4, 8, 3], [2, 9, 3]]
    right = ma.collate(sequences)
    np.testing.assert_array_equal(right.ids, [[2, 7, 4, 8, 3], [2, 9, 3, 0, 0]])
    np.testing.assert_array_equal(right.lengths, [5, 3])
    np.testing.assert_array_equal(right.starts, [0, 0])
    np.testing.assert_array_equal(right.segments, [[0, 0, 0, 1, 1], [0, 0, 0, -1, -1]])
    assert right.side == "right" and right.ids.dtype == np.int64 and len(right) == 2
    left = ma.collate(sequences, side="left", min_length=6)
    np.testing.assert_array_equal(left.ids, [[0, 2, 7, 4, 8, 3], [0, 0, 0, 2, 9, 3]])
    np.testing.assert_array_equal(left.starts, [1, 3])
    assert left.side == "left" and not left.ids.flags.writeable


def padded_keep(real_rows, real_cols):
    """[B, 1, Lq, Lk] keep from per-sequence 0/1 vectors of real queries and keys."""
    return (real_rows[:, None, :, None] & real_cols[:, None, None, :]).astype(np.uint8)


@pytest.mark.parametrize("side", ["right", "left"])
def test_batch_masks_equal_numpy_causal_and_padding(side):
    batch = ma.collate([[2, 7, 4, 8, 3], [2, 9, 3], [2, 5]], side=side)
    B, T = batch.ids.shape
    columns = np.arange(T)
    starts, lengths = np.asarray(batch.starts), np.asarray(batch.lengths)
    real = ((columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])).astype(np.uint8)
    np.testing.assert_array_equal(real, batch.ids != ma.PAD_ID)
    padding = padded_keep(real, real)
    pairs = ma.allowed_pairs(batch.decoder_self_attention(), B, 1, T)
    np.testing.assert_array_equal(pairs, padding & causal_keep(T))
    encoder = ma.allowed_pairs(batch.encoder_self_attention(), B, 1, T)
    np.testing.assert_array_equal(encoder, padding)
    np.testing.assert_array_equal(
        ma.allowed_pairs(batch.key_padding(), B, 1, T), np.broadcast_to(real[:, None, None, :],
                                                                        (B, 1, T, T)))
    np.testing.assert_array_equal(
        ma.allowed_pairs(batch.query_padding(), B, 1, T), np.broadcast_to(real[:, None, :, None],
                                                                          (B, 1, T, T)))


def test_segment_attention_is_block_diagonal_between_separators():
    batch = ma.collate([[2, 7, 4, 8, 4, 9], [2, 4, 3]])
    segments = np.asarray(batch.segments)
    np.testing.assert_array_equal(segments, [[0, 0, 0, 1, 1, 2], [0, 0, 1, -1, -1, -1]])
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] >= 0)
    pairs = ma.allowed_pairs(batch.segment_attention(), 2, 1, 6)
    np.testing.assert_array_equal(pairs[:, 0], same)


def test_cross_attention_hides_encoder_pads_and_decoder_pad_rows():
    decoder = ma.collate([[2, 7, 8], [2]])
    encoder = ma.collate([[2, 9], [2, 9, 9, 3]], side="left")
    pairs = ma.allowed_pairs(ma.cross_attention(decoder, encoder), 2, 1, 3, 4)
    expected = padded_keep((decoder.ids != 0).astype(np.uint8), (encoder.ids != 0).astype(np.uint8))
    np.testing.assert_array_equal(pairs, expected)
    with pytest.raises(ma.Error, match="B=2 sequences but the encoder batch has B=1"):
        ma.cross_attention(decoder, ma.collate([[2]]))


def test_image_text_is_causal_with_a_bidirectional_image_span():
    length = 6
    first, count = [1, 0], [3, 2]
    pairs = ma.allowed_pairs(ma.image_text(first, count, length), 2, 1, length)
    for b in range(2):
        image = np.zeros(length, dtype=bool)
        image[first[b]:first[b] + count[b]] = True
        expected = causal_keep(length).astype(bool) | (image[:, None] & image[None, :])
        np.testing.assert_array_equal(pairs[b, 0], expected)


def test_mae_patch_masking_keeps_a_seeded_subset_and_masks_the_rest():
    masking = ma.mae_patch_masking(16, 0.75, seed=5)
    keep = np.asarray(masking.keep)
    assert keep.shape == (16,) and keep.sum() == 4
    np.testing.assert_array_equal(masking.kept, np.flatnonzero(keep))
    np.testing.assert_array_equal(
        ma.allowed_pairs(masking.mask(), 1, 1, 16)[0, 0], np.outer(keep, keep))
    np.testing.assert_array_equal(ma.mae_patch_masking(16, 0.75, seed=5).keep, keep)


def test_mlm_masking_labels_are_minus_100_except_where_selected():
    rng = np.random.default_rng(3)
    vocabulary_size = 50
    sequences = [[ma.BOS_ID, *rng.integers(7, vocabulary_size, n), ma.EOS_ID] for n in (300, 200)]
    batch = ma.collate(sequences)
    ids = np.asarray(batch.ids)
    inputs, labels = ma.mlm_masking(batch, vocabulary_size, seed=11)
    selected = labels != -100
    np.testing.assert_array_equal(labels[selected], ids[selected])
    assert not selected[ids <= ma.MASK_ID].any()  # specials and <pad> are never selected
    np.testing.assert_array_equal(inputs[~selected], ids[~selected])
    assert 0.1 < selected[ids > ma.MASK_ID].mean() < 0.2
    masked = (inputs[selected] == ma.MASK_ID).mean()
    assert 0.7 < masked < 0.9
    replaced = selected & (inputs != ids) & (inputs != ma.MASK_ID)
    assert ((inputs[replaced] > ma.MASK_ID) & (inputs[replaced] < vocabulary_size)).all()
    _, all_labels = ma.mlm_masking(ids, vocabulary_size, seed=1, rate=1.0)
    np.testing.assert_array_equal(all_labels != -100, ids > ma.MASK_ID)
    _, no_labels = ma.mlm_masking(ids, vocabulary_size, seed=1, rate=0.0)
    assert (no_labels == -100).all()


def test_mlm_masking_and_collate_take_torch_tensors():
    torch = pytest.importorskip("torch")
    batch = ma.collate([torch.tensor([2, 9, 9, 3]), torch.tensor([2, 8])])
    np.testing.assert_array_equal(batch.lengths, [4, 2])
    inputs, labels = ma.mlm_masking(torch.tensor(np.asarray(batch.ids)), 12, seed=2, rate=1.0)
    assert isinstance(inputs, torch.Tensor) and labels.dtype == torch.int64
    assert labels.tolist() == [[-100, 9, 9, -100], [-100, 8, -100, -100]]


# --- argument errors: docs/errors.md rows P50–P59 -----------------------------------------------


def test_P50_audit_dtype_name():
    with pytest.raises(ma.Error, match='audit_mask: dtype must be "float32", "float16" or '
                                       '"bfloat16", got \'int8\''):
        ma.audit_mask(ma.Mask(), q_len=2, dtype="int8")


def test_P51_seed_not_an_unsigned_int():
    message = r"audit_mask: seed must be an int in \[0, 2\*\*64\), got -1"
    with pytest.raises(ma.Error, match=message):
        ma.audit_mask(ma.Mask(), q_len=2, seed=-1)
    with pytest.raises(ma.Error, match="mae_patch_masking: seed must be an int"):
        ma.mae_patch_masking(8, 0.5, seed=1.5)
    with pytest.raises(ma.Error, match="mlm_masking: seed must be an int"):
        ma.mlm_masking([[7, 8]], 10, seed=True)


def test_P52_health_max_heads():
    q = np.zeros((1, 1, 2, 4), dtype=np.float32)
    with pytest.raises(ma.Error, match="health_report: max_heads must be an int >= 1, got 0"):
        ma.health_report(q, q, q, max_heads=0)


def test_P53_heatmap_array_shapes():
    allowed = np.ones((1, 1, 4, 4), dtype=np.uint8)
    with pytest.raises(ma.Error, match=r"heatmap: allowed has shape \[4\]; expected \[B,H,Lq,Lk\]"):
        ma.heatmap_svg(np.ones(4))
    message = r"heatmap: weights have shape \[1,1,3,5\] but allowed has \[1,1,4,4\]"
    with pytest.raises(ma.Error, match=message):
        ma.heatmap_svg(allowed, np.zeros((1, 1, 3, 5)))
    with pytest.raises(ma.Error, match="heatmap: allowed cannot be read as an array"):
        ma.heatmap_svg([[1, 0], [1]])


def test_P54_heatmap_labels():
    allowed = np.ones((1, 1, 4, 3), dtype=np.uint8)
    message = "heatmap: row_labels has 3 labels but the panels have 4 rows"
    with pytest.raises(ma.Error, match=message):
        ma.heatmap_svg(allowed, row_labels=["a", "b", "c"])
    with pytest.raises(ma.Error, match="heatmap: col_labels is a string"):
        ma.heatmap_svg(allowed, col_labels="abc")


def test_P55_collate_side():
    with pytest.raises(ma.Error, match='collate: side must be "right" or "left", got "middle"'):
        ma.collate([[2, 3]], side="middle")


def test_P56_collate_sequences():
    with pytest.raises(ma.Error, match="collate: sequences is a string"):
        ma.collate("the cat")
    with pytest.raises(ma.Error, match=r"collate: sequences\[1\] has shape \[1,2\]"):
        ma.collate([[2, 3], [[2, 3]]])
    with pytest.raises(ma.Error, match=r"collate: sequences\[0\] is a single id \(2\)"):
        ma.collate([2, 3])


def test_P57_image_text_vectors():
    with pytest.raises(ma.Error, match=r"image_text: image_first has shape \[1,1\]; expected one "
                                       r"value per sequence \(rank 1\)"):
        ma.image_text([[0]], [1], 3)


def test_P58_vocabulary_words_and_ids():
    with pytest.raises(ma.Error, match="Vocabulary: words is a str"):
        ma.Vocabulary("the cat")
    with pytest.raises(ma.Error, match="Vocabulary: words must be strings, got 5"):
        ma.Vocabulary(["the", 5])
    with pytest.raises(ma.Error, match=r"Vocabulary.decode: ids has shape \[1,2\]"):
        ma.Vocabulary().decode([[2, 3]])


def test_P59_heatmap_path_type():
    with pytest.raises(ma.Error, match="write_heatmap: path must be a str or os.PathLike, got int"):
        ma.write_heatmap(3, np.ones((2, 2)))


def test_reports_are_readable():
    report = ma.audit_mask(ma.Mask().causal(), q_len=3)
    assert re.match(r"AuditReport\(passed=True, shape=\(1, 1, 3, 3\)", repr(report))
    assert "no expected mask" in report.summary()
    assert repr(ma.collate([[2, 3]])) == "maskattn.TokenBatch(ids [1,2], side='right', lengths [2])"
    assert repr(ma.mae_patch_masking(4, 0.5, 1)) == "maskattn.PatchMasking(2 of 4 patches kept)"
    assert repr(ma.Vocabulary()) == "maskattn.Vocabulary(7 tokens)"
