"""Continuous batching with maskattn: ``maskattn.transformers.generate_batch`` /
``init_continuous_batching`` in tiny real models, and ``maskattn.torch.attention_with_kvcache``
(FlashAttention's ``flash_attn_with_kvcache`` over caller-owned pages) on its own.

* greedy tokens of several prompts of different lengths (spanning several 32-position pages,
  decoding across page edges) equal transformers' own continuous batching with sdpa, and
  ``generate()``; both of maskattn's paths ran (the packed prefill and the block-table decode,
  which reads transformers' page tensors in place), and the decode path can be switched off;
* Mistral (sliding-window layers: no block tables, windows on packed requests) likewise; Gemma-2
  (softcap, sliding layers) against eager ``generate()``, since transformers' paged|eager drops
  the softcap;
* attention_with_kvcache: appended rows land where FlashAttention writes them, the result is
  bitwise maskattn.attention_paged on a PagedKVCache holding the same rows, and within the
  accuracy rule of a float64 computation on the gathered rows; windows, softcap, LSE, the
  non-paged cache form.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import maskattn  # noqa: E402
import maskattn.torch as mtorch  # noqa: E402
import maskattn.transformers as mt  # noqa: E402
from maskattn import _transformers_cb as cb_module  # noqa: E402
from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402

COMMON = dict(vocab_size=100, max_position_embeddings=256, initializer_range=0.3,
              bos_token_id=None, eos_token_id=None, pad_token_id=0)
LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def tiny(config_class, builtin, **args):
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**COMMON, **args)
    model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    return model_class._from_config(config, attn_implementation=builtin,
                                    dtype=torch.float32).eval()


def prompts(*lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 100, (n,), generator=generator).tolist() for n in lengths]


def cb_config():
    return ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=256, page_size=32)


GREEDY = GenerationConfig(max_new_tokens=30, do_sample=False, eos_token_id=-1, pad_token_id=0)


@pytest.fixture(autouse=True)
def registered():
    mt.register()


@pytest.fixture
def path_counts(monkeypatch):
    """How many attention calls took each of the backend's two continuous-batching paths."""
    counts = {"decode": 0, "varlen": 0}
    for name in counts:
        original = getattr(cb_module, f"_{name}")

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cb_module, f"_{name}", counted)
    return counts


def tokens(results):
    return [result.generated_tokens for result in results.values()]


def test_llama_generate_batch_matches_sdpa_and_generate(path_counts):
    model = tiny("LlamaConfig", "sdpa", **LLAMA)
    batch = prompts(5, 17, 3, 40, 70)
    expected = model.generate_batch(batch, generation_config=GREEDY,
                                    continuous_batching_config=cb_config(), progress_bar=False)
    model.set_attn_implementation("maskattn")
    got = mt.generate_batch(model, batch, GREEDY, cb_config())
    assert list(got) == list(expected)
    assert all(result.error is None for result in got.values())
    assert tokens(got) == tokens(expected)
    # Both paths ran: packed prefill, and decode steps reading transformers' pages in place.
    assert path_counts["varlen"] > 0 and path_counts["decode"] > 0
    assert model.config._attn_implementation == "maskattn"  # the stand-in is gone
    model.set_attn_implementation("sdpa")
    one = torch.tensor([batch[4]])
    assert model.generate(one, generation_config=GREEDY)[0, 70:].tolist() == tokens(got)[4]


def test_decode_fast_path_off_gives_the_same_tokens(path_counts):
    model = tiny("LlamaConfig", "maskattn", **LLAMA)
    batch = prompts(9, 33, 2)
    fast = mt.generate_batch(model, batch, GREEDY, cb_config())
    decode_calls = path_counts["decode"]
    slow = mt.generate_batch(model, batch, GREEDY, cb_config(), decode_fast_path=False)
    assert decode_calls > 0 and path_counts["decode"] == decode_calls
    assert tokens(fast) == tokens(slow)


def test_manager_api(path_counts):
    model = tiny("LlamaConfig", "maskattn", **LLAMA)
    manager = mt.init_continuous_batching(model, GREEDY, cb_config())
    assert manager.continuous_batching_config.max_blocks_per_request > 0
    manager.start()
    try:
        request = manager.add_request(prompts(12)[0], max_new_tokens=6)
        result = manager.get_result(request_id=request, timeout=60)
        while result is not None and not result.is_finished():
            result = manager.get_result(request_id=request, timeout=60)
    finally:
        manager.stop(block=True)
        manager.destroy()
    assert result is not None and len(result.generated_tokens) == 6
    assert path_counts["decode"] > 0


def test_mistral_sliding_window_matches_sdpa(path_counts):
    model = tiny("MistralConfig", "sdpa", **LLAMA, sliding_window=8)
    batch = prompts(5, 17, 40)
    expected = model.generate_batch(batch, generation_config=GREEDY,
                                    continuous_batching_config=cb_config(), progress_bar=False)
    model.set_attn_implementation("maskattn")
    got = mt.generate_batch(model, batch, GREEDY, cb_config())
    assert tokens(got) == tokens(expected)
    # transformers keeps block tables to full-attention models: every call is packed.
    assert path_counts["decode"] == 0 and path_counts["varlen"] > 0


def test_gemma2_softcap_matches_eager_generate():
    model = tiny("Gemma2Config", "maskattn", **LLAMA, head_dim=8, sliding_window=8,
                 attn_logit_softcapping=5.0, final_logit_softcapping=None,
                 query_pre_attn_scalar=8)
    batch = prompts(5, 17, 40)
    got = mt.generate_batch(model, batch, GREEDY, cb_config())
    model.set_attn_implementation("eager")
    for prompt, result in zip(batch, got.values()):
        ids = torch.tensor([prompt])
        expected = model.generate(ids, generation_config=GREEDY)[0, len(prompt):].tolist()
        assert result.generated_tokens == expected


# ---------------------------------------------------------------------------------------------
# attention_with_kvcache
# ---------------------------------------------------------------------------------------------

def paged_problem(lengths, block_size=16, heads=2, dim=16, blocks=32, dtype=torch.float32,
                  seed=0):
    """Pools [blocks, block_size, Hkv, D] holding sequences of `lengths` under shuffled block
    tables (−1 past each sequence's blocks), and the same rows as [Hkv, L, D] per sequence."""
    generator = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(blocks, block_size, heads, dim, generator=generator).to(dtype)
    v_cache = torch.randn(blocks, block_size, heads, dim, generator=generator).to(dtype)
    columns = max(-(-n // block_size) for n in lengths) + 1
    order = torch.randperm(blocks, generator=generator).tolist()
    table = torch.full((len(lengths), columns), -1, dtype=torch.int32)
    rows = []
    for b, n in enumerate(lengths):
        used = -(-n // block_size)
        table[b, :used] = torch.tensor([order.pop() for _ in range(used)], dtype=torch.int32)
        positions = torch.arange(n)
        blocks_of = table[b].long()[positions // block_size]
        rows.append((k_cache[blocks_of, positions % block_size].permute(1, 0, 2),
                     v_cache[blocks_of, positions % block_size].permute(1, 0, 2)))
    return k_cache, v_cache, table, rows


def contiguous_cache(rows, lengths, capacity):
    """paged_problem's rows as a contiguous cache [B, capacity, Hkv, D] (no block table), zero past
    each sequence's length."""
    heads, dim = rows[0][0].shape[0], rows[0][0].shape[2]
    k_cache = torch.zeros(len(rows), capacity, heads, dim)
    v_cache = torch.zeros(len(rows), capacity, heads, dim)
    for b, (k, v) in enumerate(rows):
        k_cache[b, :lengths[b]] = k.permute(1, 0, 2)
        v_cache[b, :lengths[b]] = v.permute(1, 0, 2)
    return k_cache, v_cache


def dense_f64(q, rows, lengths, causal=True, window=None, softcap=None):
    """The float64 truth: per sequence, scores over its rows, queries at its end."""
    outs = []
    for b, (k, v) in enumerate(rows):
        n, q_len = lengths[b], q.shape[1]
        qb = q[b].double().permute(1, 0, 2)  # [Hq, Lq, D]
        group = qb.shape[0] // k.shape[0]
        kk = k.double().repeat_interleave(group, 0)
        vv = v.double().repeat_interleave(group, 0)
        scores = qb @ kk.transpose(1, 2) / q.shape[-1] ** 0.5
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        qpos = torch.arange(q_len)[:, None] + n - q_len
        kpos = torch.arange(n)[None, :]
        allowed = torch.ones(q_len, n, dtype=torch.bool)
        if causal:
            allowed &= kpos <= qpos
        if window is not None:
            allowed &= kpos >= qpos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a row without keys gives 0
        outs.append((weights @ vv).permute(1, 0, 2))
    return torch.stack(outs)


@pytest.mark.parametrize("window", [None, 5])
def test_packed_prefill_is_one_call_per_request_bitwise(window):
    """The index form (prefill and mixed batches) runs one varlen call; each request's rows are
    bit for bit maskattn.attention on its own rows (queries at the end of its keys), a request
    with no new tokens writes nothing, and rows past cu_seq_lens_q[-1] are 0."""
    generator = torch.Generator().manual_seed(3)
    cu_q, cu_k = [0, 5, 5, 6, 14], [0, 9, 12, 19, 27]  # request 1 brings no queries
    q = torch.randn(1, 4, 16, 8, generator=generator)  # two rows past cu_q[-1]
    k = torch.randn(1, 2, 27, 8, generator=generator)
    v = torch.randn(1, 2, 27, 8, generator=generator)
    kwargs = {"cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
              "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32)}
    out = cb_module.continuous_batching_forward(q, k, v, 0.3, window, None, kwargs)
    assert out.shape == (1, 16, 4, 8)
    mask = maskattn.Mask().causal()
    if window:
        mask = mask & maskattn.Mask().sliding_window(window)
    for s in range(4):
        (q0, q1), (k0, k1) = (cu_q[s], cu_q[s + 1]), (cu_k[s], cu_k[s + 1])
        if q1 == q0:
            continue
        alone = maskattn.attention(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], mask,
                                   scale=0.3)
        assert torch.equal(out[0, q0:q1], alone[0].transpose(0, 1))
    assert torch.count_nonzero(out[0, 14:]) == 0


@pytest.mark.parametrize("q_len", [1, 3, 70])
def test_attention_with_kvcache_bitwise_equal_to_attention_paged(q_len):
    lengths = [90, 77, 129]
    k_cache, v_cache, table, rows = paged_problem(lengths)
    q = torch.randn(3, q_len, 4, 16, generator=torch.Generator().manual_seed(3))
    got = mtorch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        block_table=table, causal=True)
    cache = maskattn.PagedKVCache(32, 16, 2, 16)
    ids = []
    for k, v in rows:
        ids.append(cache.add_sequence())
        cache.append(ids[-1], k, v)
    expected = maskattn.attention_paged(q, cache, ids, layout="blhd")
    assert torch.equal(got, expected)
    truth = dense_f64(q, rows, lengths)
    assert (got.double() - truth).abs().max() < 2e-6


def test_attention_with_kvcache_appends_where_flash_writes():
    lengths = [20, 47]
    k_cache, v_cache, table, rows = paged_problem(lengths, blocks=16, seed=4)
    table[1, 3] = min(set(range(16)) - set(table.flatten().tolist()))  # room for rows 48, 49
    generator = torch.Generator().manual_seed(5)
    k_new, v_new = torch.randn(2, 3, 2, 16, generator=generator), torch.randn(2, 3, 2, 16,
                                                                              generator=generator)
    q = torch.randn(2, 3, 4, 16, generator=generator)
    out, lse = mtorch.attention_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        block_table=table, causal=True, return_softmax_lse=True)
    after = [n + 3 for n in lengths]
    for b, n in enumerate(lengths):
        positions = torch.arange(n, n + 3)
        blocks = table[b].long()[positions // 16]
        assert torch.equal(k_cache[blocks, positions % 16], k_new[b])
        assert torch.equal(v_cache[blocks, positions % 16], v_new[b])
        rows[b] = (torch.cat([rows[b][0], k_new[b].permute(1, 0, 2)], 1),
                   torch.cat([rows[b][1], v_new[b].permute(1, 0, 2)], 1))
    assert (out.double() - dense_f64(q, rows, after)).abs().max() < 2e-6
    assert lse.shape == (2, 4, 3) and torch.isfinite(lse).all()


def test_attention_with_kvcache_window_softcap_and_the_contiguous_form():
    lengths = [64, 33]
    k_cache, v_cache, table, rows = paged_problem(lengths, seed=6)
    # Lq = 40 > 33: entry 1's first 7 queries sit before position 0 and see nothing (zeros).
    q = torch.randn(2, 40, 4, 16, generator=torch.Generator().manual_seed(7))
    got = mtorch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        block_table=table, causal=True, window_size=(10, 0),
                                        softcap=2.0)
    truth = dense_f64(q, rows, lengths, window=10, softcap=2.0)
    assert (got.double() - truth).abs().max() < 2e-6
    assert not got[1, :7].any() and got[1, 7:].abs().min() > 0
    # The same rows as a contiguous cache [B, L_cache, Hkv, D] (no block table).
    contiguous_k, contiguous_v = contiguous_cache(rows, lengths, 80)
    dense = mtorch.attention_with_kvcache(q, contiguous_k, contiguous_v, cache_seqlens=lengths,
                                          causal=True, window_size=(10, -1), softcap=2.0)
    assert (dense.double() - truth).abs().max() < 2e-6
    # causal=False (FlashAttention's default): every query sees the whole sequence.
    loose = mtorch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                          block_table=table)
    assert (loose.double() - dense_f64(q, rows, lengths, causal=False)).abs().max() < 2e-6


def test_attention_with_kvcache_draft_trees_over_ragged_lengths():
    """A draft tree over sequences of different lengths is each sequence's own (docs/semantics.md
    §18): the paged form equals attention_paged on a PagedKVCache holding the same rows and each
    sequence called alone, bit for bit; the contiguous form (L_cache = 50, read as copied pages)
    gives the same bits."""
    lengths = [45, 6, 30]
    k_cache, v_cache, table, rows = paged_problem(lengths, seed=8)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, -1], [-1, -1, 0, 1]])
    q = torch.randn(3, 6, 4, 16, generator=torch.Generator().manual_seed(9))  # 2 rows before
    mask = maskattn.Mask().tree(parents)
    got = mtorch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        block_table=table, causal=True, mask=mask)
    cache = maskattn.PagedKVCache(32, 16, 2, 16)
    ids = []
    for k, v in rows:
        ids.append(cache.add_sequence())
        cache.append(ids[-1], k, v)
    assert torch.equal(got, maskattn.attention_paged(q, cache, ids, mask=mask, layout="blhd"))
    for b in range(3):
        alone = mtorch.attention_with_kvcache(q[b:b + 1], k_cache, v_cache,
                                              cache_seqlens=lengths[b:b + 1],
                                              block_table=table[b:b + 1], causal=True,
                                              mask=maskattn.Mask().tree(parents[b]))
        assert torch.equal(got[b:b + 1], alone)
    contiguous_k, contiguous_v = contiguous_cache(rows, lengths, 50)
    dense = mtorch.attention_with_kvcache(q, contiguous_k, contiguous_v, cache_seqlens=lengths,
                                          causal=True, mask=mask)
    assert torch.equal(dense, got)


def test_attention_with_kvcache_bfloat16_pages():
    lengths = [50, 17]
    k_cache, v_cache, table, rows = paged_problem(lengths, dtype=torch.bfloat16, seed=8)
    q = torch.randn(2, 1, 4, 16, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    got = mtorch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                        block_table=table, causal=True)
    assert got.dtype == torch.bfloat16
    truth = dense_f64(q, rows, lengths)
    assert (got.double() - truth).abs().max() < 2 ** -7  # one bf16 rounding of values ≤ ~2


# ---------------------------------------------------------------------------------------------
# Errors (docs/errors.md P90–P93)
# ---------------------------------------------------------------------------------------------

def kvcache_args():
    k_cache, v_cache, table, _ = paged_problem([20, 5], blocks=8)
    return torch.zeros(2, 1, 4, 16), k_cache, v_cache, table


def test_P90_attention_with_kvcache_arguments():
    q, k_cache, v_cache, table = kvcache_args()
    call = mtorch.attention_with_kvcache
    with pytest.raises(maskattn.Error, match=r"k_cache must be a torch tensor \[num_blocks, "
                                             r"block_size, Hkv, D\], got ndarray"):
        call(q, k_cache.numpy(), v_cache, cache_seqlens=[20, 5], block_table=table)
    with pytest.raises(maskattn.Error, match=r"q has shape \[2, 4, 16\] on cpu; expected a CPU "
                                             r"tensor \[B, Lq, Hq, D\]"):
        call(q[:, 0], k_cache, v_cache, cache_seqlens=[20, 5], block_table=table)
    with pytest.raises(maskattn.Error, match="q has dtype torch.float32 and k_cache "
                                             "torch.bfloat16; they share one of"):
        call(q, k_cache.bfloat16(), v_cache, cache_seqlens=[20, 5], block_table=table)
    with pytest.raises(maskattn.Error, match="k and v are given together"):
        call(q, k_cache, v_cache, k=torch.zeros(2, 1, 2, 16), cache_seqlens=[20, 5],
             block_table=table)
    with pytest.raises(maskattn.Error, match=r"k \[2, 1, 3, 16\] and v \[2, 1, 3, 16\] must be "
                                             r"\[B, L_new, Hkv, D\|Dv\]"):
        call(q, k_cache, v_cache, torch.zeros(2, 1, 3, 16), torch.zeros(2, 1, 3, 16),
             cache_seqlens=[20, 5], block_table=table)
    with pytest.raises(maskattn.Error, match="cache_seqlens is required with a block_table"):
        call(q, k_cache, v_cache, block_table=table)
    for bad in ([20], [20, -1], [2.5, 1.0]):
        with pytest.raises(maskattn.Error, match="cache_seqlens must be an int or 2 ints >= 0"):
            call(q, k_cache, v_cache, cache_seqlens=bad, block_table=table)
    with pytest.raises(maskattn.Error, match=r"block_table must be an integer tensor \[B, "
                                             r"max_blocks\] with B = 2, got torch.float32"):
        call(q, k_cache, v_cache, cache_seqlens=[20, 5], block_table=table.float())
    with pytest.raises(maskattn.Error, match="window_size must be two ints"):
        call(q, k_cache, v_cache, cache_seqlens=[20, 5], block_table=table, window_size=4)
    with pytest.raises(maskattn.Error, match="give softcap either as softcap= or in mods"):
        call(q, k_cache, v_cache, cache_seqlens=[20, 5], block_table=table, softcap=2.0,
             mods=maskattn.ScoreMods(softcap=3.0))
    # The library's own checks arrive as maskattn.Error too (E155: a table entry outside).
    table[0, 0] = 99
    with pytest.raises(maskattn.Error, match=r"block_table\[0\]\[0\] = 99 is not a block"):
        call(q, k_cache, v_cache, cache_seqlens=[20, 5], block_table=table)


def test_P91_new_rows_that_do_not_fit():
    q, k_cache, v_cache, table = kvcache_args()
    k_new = v_new = torch.ones(2, 1, 2, 16)
    before = k_cache.clone()
    with pytest.raises(maskattn.Error, match=r"appending 1 rows after cache_seqlens \[20, 48\] "
                                             r"needs 49 positions but the block_table holds 3 "
                                             r"blocks of 16"):
        mtorch.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=[20, 48],
                                      block_table=table)
    with pytest.raises(maskattn.Error, match=r"the block_table entries for the new rows "
                                             r"\[\[\d+\], \[-1\]\] must be blocks of k_cache"):
        mtorch.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=[20, 16],
                                      block_table=table)
    dense_k, dense_v = torch.zeros(2, 8, 2, 16), torch.zeros(2, 8, 2, 16)
    with pytest.raises(maskattn.Error, match=r"appending 1 rows after cache_seqlens \[8, 3\] "
                                             r"needs 9 positions but k_cache holds 8"):
        mtorch.attention_with_kvcache(q, dense_k, dense_v, k_new, v_new, cache_seqlens=[8, 3])
    assert torch.equal(k_cache, before) and not dense_k.any()


def test_P92_continuous_batching_needs_a_maskattn_model():
    model = tiny("LlamaConfig", "sdpa", **LLAMA)
    with pytest.raises(maskattn.Error, match="the model's attn_implementation is 'sdpa', not a "
                                             "name maskattn.transformers.register\\(\\) "
                                             "registered"):
        mt.generate_batch(model, prompts(4), GREEDY)
    with pytest.raises(maskattn.Error, match="Module has no init_continuous_batching"):
        mt.init_continuous_batching(torch.nn.Module())
    assert model.config._attn_implementation == "sdpa"


def test_P93_continuous_batching_calls_the_backend_cannot_serve():
    model = tiny("LlamaConfig", "maskattn", **LLAMA)
    module = model.model.layers[0].self_attn
    q, k = torch.zeros(1, 4, 5, 8), torch.zeros(1, 2, 5, 8)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    forward = mt.attention_forward
    with pytest.raises(maskattn.Error, match=r"cu_seq_lens_k is a dict by layer type "
                                             r"\['full_attention'\]"):
        forward(module, q, k, k, None, scaling=1.0, cu_seq_lens_q=cu,
                cu_seq_lens_k={"full_attention": cu})
    with pytest.raises(maskattn.Error, match=r"request 1 has 3 queries but 1 keys"):
        forward(module, q, k, k, None, scaling=1.0, cu_seq_lens_q=cu,
                cu_seq_lens_k=torch.tensor([0, 2, 3], dtype=torch.int32))
    with pytest.raises(maskattn.Error, match=r"cu_seq_lens_q \[0, 2, 9\] and cu_seq_lens_k "
                                             r"\[0, 2, 5\] do not describe query"):
        forward(module, q, k, k, None, scaling=1.0, cu_seq_lens_k=cu,
                cu_seq_lens_q=torch.tensor([0, 2, 9], dtype=torch.int32))
    pages = torch.zeros(4, 16, 2, 8)
    with pytest.raises(maskattn.Error, match=r"a block-table call needs one query per request, "
                                             r"got query \[1, 4, 5, 8\] for block_table \[2, 3\]"):
        forward(module, q, k, k, None, scaling=1.0, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                block_table=torch.zeros(2, 3, dtype=torch.int32), k_cache=pages, v_cache=pages)
