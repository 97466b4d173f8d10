"""The tracer of maskattn.torch (_torch_trace): attention-gym's mask_mods and score_mods become
programs that compute what PyTorch computes, pair by pair, on the whole grid; the text is
readable (tables named after their variables); what cannot be traced is a catalogued error
naming the construct and the line (P35, P36, P68–P72)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from maskattn._torch_trace import trace_mask_mod, trace_score_mod  # noqa: E402
from flex_catalogue import (B, H, L, MASK_MODS, SCORE_MODS, SCORE_TABLES,  # noqa: E402
                            index_grid, score_mod_of)

TILE = 64


def tiles(length):
    return [(start, min(TILE, length - start)) for start in range(0, length, TILE)]


def program_pairs(program, batch=B, heads=H, q_len=L, kv_len=L):
    """The allowed pairs [B, H, Q, KV] from the program's tile evaluator."""
    pairs = torch.zeros(batch, heads, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            for q0, nq in tiles(q_len):
                for k0, nk in tiles(kv_len):
                    bits = program.mask_tile(b, h, q0, nq, k0, nk).astype(np.uint64)
                    shifts = np.arange(nq, dtype=np.uint64)
                    tile = (bits[:, None] >> shifts[None, :]) & np.uint64(1)
                    pairs[b, h, q0:q0 + nq, k0:k0 + nk] = torch.from_numpy(tile.T == 1)
    return pairs


def program_scores(program, scores):
    """The program applied to float32 scores [B, H, Q, KV] by its tile evaluator."""
    result = scores.clone()
    batch, heads, q_len, kv_len = scores.shape
    for b in range(batch):
        for h in range(heads):
            for q0, nq in tiles(q_len):
                for k0, nk in tiles(kv_len):
                    tile = scores[b, h, q0:q0 + nq, k0:k0 + nk].T.contiguous().numpy()
                    program.score_tile(b, h, q0, k0, tile)
                    result[b, h, q0:q0 + nq, k0:k0 + nk] = torch.from_numpy(tile).T
    return result


@pytest.mark.parametrize("name", sorted(MASK_MODS))
def test_mask_catalogue_traces_to_pytorchs_pairs(name):
    mask_mod = MASK_MODS[name]()
    traced = trace_mask_mod(mask_mod)
    expected = flex.create_mask(mask_mod, B, H, L, L, device="cpu")
    assert torch.equal(program_pairs(traced.program()), expected), traced.text


@pytest.mark.parametrize("name", sorted(SCORE_MODS))
def test_score_catalogue_traces_to_pytorchs_scores(name):
    score_mod = score_mod_of(name)
    traced = trace_score_mod(score_mod)
    scores = torch.randn(B, H, L, L, generator=torch.Generator().manual_seed(5)) * 3
    expected = score_mod(scores, *index_grid())  # PyTorch in float32, elementwise
    got = program_scores(traced.program(), scores)
    # exp, log and tanh may differ from PyTorch's vectorised ones in the last bit
    torch.testing.assert_close(got, expected.expand_as(got), rtol=3e-7, atol=1e-6,
                               msg=lambda m: f"{traced.text}: {m}")


def test_tables_are_named_after_their_variables_and_captured_once():
    traced = trace_mask_mod(MASK_MODS["document"]())
    assert [name for name, _ in traced.tables] == ["document_id", "offsets"]
    assert traced.tables[0][1].dtype == torch.int32
    assert traced.program().text == (
        "(document_id[q] == document_id[kv]) & "
        "(q - offsets[document_id[q]] >= kv - offsets[document_id[kv]])")
    rel, = SCORE_TABLES["relative_bias"]()
    traced = trace_score_mod(score_mod_of("relative_bias", [rel]))
    assert traced.program().text == f"s + rel[h, q - kv + {L} - 1]"
    assert traced.tables[0][1] is rel  # by reference, not a copy


def test_tables_unnamed_or_clashing_get_fresh_names():
    tables = [torch.arange(8), torch.arange(8)]

    def two_tables(b, h, q_idx, kv_idx):
        return tables[0][q_idx] == tables[1][kv_idx]  # no variable holds either

    traced = trace_mask_mod(two_tables)
    assert [name for name, _ in traced.tables] == ["t0", "t1"]
    h_table = torch.arange(8)

    def reserved(b, h, q_idx, kv_idx):
        q = h_table  # a local named like a variable of the language
        return q[q_idx] >= kv_idx

    assert trace_mask_mod(reserved).tables[0][0] == "q_"


def test_conversions_follow_pytorch():
    """.long() truncates toward zero (the language's floor rounds down), bool → int is 0/1,
    int → float is explicit, and a float // is refused rather than guessed."""
    def score_mod(score, b, h, q_idx, kv_idx):
        shift = ((q_idx - kv_idx) * 0.7).long()  # negative values: toward zero
        flag = (q_idx > kv_idx).to(torch.long)
        ratio = q_idx.float() * kv_idx.float()  # float32 products, as PyTorch rounds them
        return score + shift + flag + ratio * 1e-3 + torch.ceil(score)

    traced = trace_score_mod(score_mod)
    scores = torch.randn(1, 1, L, L, generator=torch.Generator().manual_seed(6)) * 3
    got = program_scores(traced.program(), scores)
    torch.testing.assert_close(got, score_mod(scores, *index_grid(1, 1)), rtol=0, atol=0)


def test_real_scalars_and_learned_temperature():
    temperature = torch.tensor(0.5, requires_grad=True)
    offset = torch.tensor(3)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score * temperature + offset

    traced = trace_score_mod(score_mod)
    assert traced.program().text == "s * temperature[0] + 3.0"
    assert traced.tables[0][1].shape == (1,)


def test_P35_mod_that_raises_while_traced():
    def broken(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx + [1, 2]  # a TypeError of its own

    with pytest.raises(maskattn.Error, match=r"mask_mod raised TypeError: unsupported operand "
                                             r"type\(s\) for \+: 'Traced' and 'list' at "
                                             r"test_torch_trace.py:\d+ .* while traced; "
                                             r"maskattn traces it once"):
        mt.create_block_mask(broken, None, None, 8, 8)


def test_P36_mod_result_kind():
    cases = [
        (lambda b, h, q, kv: (q >= kv).int(), r"mask_mod returned an int value \(where\(\(q >= "
                                              r"kv\), 1, 0\)\); it must return a bool tensor"),
        (lambda b, h, q, kv: "yes", "mask_mod returned str; it must return a tensor"),
        (lambda b, h, q, kv: torch.ones(3, 8, dtype=torch.bool),
         r"mask_mod returned a tensor of shape \[3, 8\]; it must return one bool value per"),
    ]
    for mask_mod, message in cases:
        with pytest.raises(maskattn.Error, match=message):
            mt.create_block_mask(mask_mod, None, None, 8, 8)
    with pytest.raises(maskattn.Error, match=r"score_mod returned a bool value \(\(s > 0\)\); it "
                                             r"must return the \(modified\) score"):
        trace_score_mod(lambda s, b, h, i, j: s > 0)


@pytest.mark.parametrize("construct, mask_mod", [
    ("Python's `and`", lambda b, h, q, kv: q >= kv and kv > 2),
    ("Python's `or`", lambda b, h, q, kv: q >= kv or kv > 2),
    ("Python's `not`", lambda b, h, q, kv: not q),
    ("a Python `if`", lambda b, h, q, kv: (q >= kv) if q > 3 else (q < kv)),
    ("bool() or a Python builtin", lambda b, h, q, kv: min(q, kv) > 2),
])
def test_P68_python_control_flow_on_a_traced_value(construct, mask_mod):
    with pytest.raises(maskattn.Error, match=rf"mask_mod uses {re.escape(construct)}.* on a "
                                             rf"traced value at "
                                             rf"test_torch_trace.py:\d+ .*write it with & \| ~ "
                                             rf"and torch.where"):
        mt.create_block_mask(mask_mod, None, None, 8, 8)


@pytest.mark.parametrize("construct, score_mod", [
    (r"int\(\)", lambda s, b, h, q, kv: s + int(q)),
    (r"float\(\)", lambda s, b, h, q, kv: s * float(h)),
    (r"\.item\(\)", lambda s, b, h, q, kv: s + h.item()),
    (r"a Python index, range\(\) or slice", lambda s, b, h, q, kv: s + [0.5, 1.0][h]),
])
def test_P69_traced_value_as_a_python_number(construct, score_mod):
    with pytest.raises(maskattn.Error, match=rf"score_mod converts a traced value to a Python "
                                             rf"number \({construct}.*\) at test_torch_trace"):
        trace_score_mod(score_mod)


@pytest.mark.parametrize("construct, score_mod", [
    ("torch.sqrt", lambda s, b, h, q, kv: s + torch.sqrt(q)),
    (r"\.pow\(\)", lambda s, b, h, q, kv: s + q.pow(2)),
    (r"\*\* \(torch.pow\)", lambda s, b, h, q, kv: s ** 2),
    ("bitwise & on int/int values", lambda s, b, h, q, kv: s + (q & kv)),
    ("// of float values", lambda s, b, h, q, kv: s // 2),
    ("torch.max as a reduction", lambda s, b, h, q, kv: torch.max(s, 0)[0]),
    (r"a conversion to torch.float16", lambda s, b, h, q, kv: s.to(torch.float16)),
])
def test_P70_operation_outside_the_language(construct, score_mod):
    with pytest.raises(maskattn.Error, match=rf"score_mod uses {construct}.* at test_torch_trace"
                                             rf".*maskattn's programs do not have it"):
        trace_score_mod(score_mod)


def test_P71_captured_tensor_device_and_dtype():
    halves = torch.zeros(8, dtype=torch.float16)
    with pytest.raises(maskattn.Error, match=r"score_mod captures a tensor of shape \[8\] of dtype "
                                             r"torch.float16 at test_torch_trace.py:\d+ .*; "
                                             r"program tables are torch.int64, torch.int32, "
                                             r"torch.float32 or torch.bool"):
        trace_score_mod(lambda s, b, h, q, kv: s + halves[q])
    meta = torch.zeros(8, dtype=torch.int64, device="meta")
    with pytest.raises(maskattn.Error, match=r"mask_mod captures a tensor of shape \[8\] on meta "
                                             r"at .*; program tables are read in CPU memory"):
        trace_mask_mod(lambda b, h, q, kv: meta[q] == meta[kv])
    with pytest.raises(maskattn.Error, match=r"program table 'x' \(shape \[3\]\) has dtype "
                                             r"float64; program tables hold int64, int32, float32 "
                                             r"or bool"):
        maskattn.Mask().program("x[q] > 0.0", x=np.zeros(3))


def test_P72_captured_tensor_indexing():
    big = torch.zeros(2, 2, 2, 2)
    rel = torch.zeros(H, 2 * L - 1)
    slopes = torch.ones(H)
    cases = [
        (lambda s, b, h, q, kv: s + big[b, h, q, kv],
         r"indexes a tensor of shape \[2, 2, 2, 2\], 4 dimensions at .*; program tables have 1 "
         r"to 3 dimensions"),
        (lambda s, b, h, q, kv: s + rel[h],
         r"uses rel\[h\], a tensor of shape \[4, 259\] indexed in 1 of its 2 dimensions"),
        (lambda s, b, h, q, kv: s + rel[h, :],
         r"indexes a tensor of shape \[4, 259\] with a slice \(:\)"),
        (lambda s, b, h, q, kv: s + rel[h, q, kv],
         r"indexes a tensor of shape \[4, 259\] with 3 indices"),
        (lambda s, b, h, q, kv: s + slopes * h,
         r"uses a captured tensor of shape \[4\] without indexing it"),
        (lambda s, b, h, q, kv: s + slopes[s],
         r"indexes a tensor of shape \[4\] with a float index \(s\)"),
    ]
    for score_mod, message in cases:
        with pytest.raises(maskattn.Error, match="score_mod " + message):
            trace_score_mod(score_mod)


def test_an_index_outside_a_table_is_an_error_never_a_read():
    """PyTorch would wrap a negative traced index or read past the end; a program refuses
    (E128 before computing, or E126 at the read), quoting the readable text."""
    doc = torch.zeros(100, dtype=torch.long)
    x = torch.randn(1, 1, 100, 16)
    with pytest.raises(maskattn.Error, match=r"program `doc\[q \+ 10\] == doc\[kv\]`.*doc"):
        block_mask = mt.create_block_mask(lambda b, h, q, kv: doc[q + 10] == doc[kv],
                                          None, None, 100, 100)
        mt.flex_attention(x, x, x, block_mask=block_mask)
