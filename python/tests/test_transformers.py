"""maskattn.transformers: the "maskattn" attention backend in real Hugging Face models.

Tiny randomly initialised models (``from_config``, no download; hidden 32, 2 layers, vocabulary
100) run with ``attn_implementation="maskattn"`` and with transformers' own "sdpa" and "eager",
from the same seeded weights, in float32:

* logits at real tokens: ``assert_close(rtol=1e-5, atol=1e-5)`` (measured: ≤ 4e-6 on logits up
  to ~9). Padded query rows are left out of the comparison: eager's finite ``finfo.min``
  mask averages all keys of a fully hidden row, where sdpa and maskattn give 0 (docs/python.md,
  "Hugging Face");
* greedy ``generate()`` with the KV cache, 8 new tokens: identical tokens;
* gradients of the LM loss for every parameter: max |Δ| ≤ 1e-5 · max |g_sdpa| (measured ≤ 2e-6).

The mask translation is checked on its own against transformers' ``sdpa_mask`` (the dense truth)
for every mask function transformers composes. maskattn computes in float32, float16 and
bfloat16 only; a float64 model is the P42 error, and bfloat16 is checked against a float32
reference with the "2× sdpa's error" rule.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import maskattn  # noqa: E402
import maskattn.transformers as mt  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
COMMON = dict(vocab_size=100, max_position_embeddings=64, initializer_range=0.3,
              bos_token_id=None, eos_token_id=None, pad_token_id=0)
FAMILIES = {
    # name: (config class, its arguments)
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.0,
                                resid_pdrop=0.0, embd_pdrop=0.0)),
    "mistral": ("MistralConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      sliding_window=4)),
}
# Models whose attention sdpa cannot run (transformers uses eager for them): compared with eager.
EAGER_FAMILIES = {
    # Gemma-2: tanh softcap on the scores, alternating sliding-window and full layers.
    "gemma2": ("Gemma2Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    sliding_window=4, attn_logit_softcapping=5.0,
                                    final_logit_softcapping=None, query_pre_attn_scalar=8)),
    # gpt-oss: a learned sink logit per head (s_aux), sliding and full layers, experts.
    "gpt_oss": ("GptOssConfig", dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     sliding_window=4, num_local_experts=4,
                                     num_experts_per_tok=2)),
}
LOGIT_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
GRADIENT_TOLERANCE = 1e-5


@pytest.fixture(autouse=True, scope="module")
def registered():
    mt.register()


def config_of(family, **overrides):
    class_name, arguments = {**FAMILIES, **EAGER_FAMILIES}[family]
    config_class = getattr(transformers, class_name, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    return config_class(**{**COMMON, **arguments, **overrides})


def model_of(config, implementation, dtype=torch.float32):
    torch.manual_seed(0)  # the same weights for every implementation
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=implementation)
    return model.to(dtype).eval()


def padded_batch(side="left", length=10):
    """Three sequences with 0, 3 and 6 pad tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (3, length), generator=generator)
    attention_mask = torch.ones(3, length, dtype=torch.long)
    for row, pads in enumerate((0, 3, 6)):
        if side == "left":
            attention_mask[row, :pads] = 0
        else:
            attention_mask[row, length - pads:] = 0
    return ids.masked_fill(attention_mask == 0, 0), attention_mask


@pytest.fixture
def no_dense_masks(monkeypatch):
    """Fails the test if a mask had to be evaluated as a dense Lq×Lk tensor."""
    def refuse(*args, **kwargs):
        raise AssertionError("maskattn.transformers built a dense mask")
    monkeypatch.setattr(mt, "_dense_mask", refuse)


# --- the mask translation, against transformers' own dense masks ---------------------------------

def _mask_cases():
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False
    left_padding = torch.tensor([0, 3])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5, 0, 1, 2]])
    packed = mu.find_packed_sequence_indices(positions)
    blocks = torch.tensor([[-1, 0, 0, 0, -1, -1, 1, 1, -1], [-1, -1, -1, -1, 2, 2, 2, -1, -1]])
    sliding = mu.sliding_window_causal_mask_function(3)
    full = dict(batch_size=2, q_length=9, kv_length=9, attention_mask=keep)
    return {
        # name: (arguments of sdpa_mask / prepare_mask, structured?)
        "causal": (dict(batch_size=2, q_length=9, kv_length=9), True),
        "causal+padding": (full, True),
        "causal decoding": (dict(full, q_length=1, q_offset=8), True),
        "causal static cache": (dict(full, q_length=2, kv_length=12, q_offset=7), True),
        "sliding window": (dict(full, mask_function=sliding), True),
        "sliding window cache": (
            dict(full, q_length=1, kv_length=3, q_offset=8, kv_offset=6, mask_function=sliding),
            True),
        "sliding window static cache": (
            dict(full, q_length=1, kv_length=12, q_offset=8, mask_function=sliding), False),
        "bidirectional": (dict(full, mask_function=mu.bidirectional_mask_function), True),
        "bidirectional window": (
            dict(full, mask_function=mu.sliding_window_bidirectional_mask_function(2)), True),
        "chunked": (dict(full, mask_function=mu.chunked_causal_mask_function(4, left_padding)),
                    True),
        "chunked decoding": (dict(full, q_length=2, q_offset=7,
                                  mask_function=mu.chunked_causal_mask_function(4, left_padding)),
                             True),
        "packed": (dict(batch_size=2, q_length=9, kv_length=9, mask_function=mu.and_masks(
            mu.remap_positions_for_packed_sequence(mu.causal_mask_function, positions),
            mu.packed_sequence_mask_function(packed))), True),
        "packed sliding window": (dict(batch_size=2, q_length=9, kv_length=9, mask_function=(
            mu.and_masks(mu.remap_positions_for_packed_sequence(sliding, positions),
                         mu.packed_sequence_mask_function(packed)))), True),
        "block overlay": (dict(full, mask_function=mu.or_masks(
            mu.causal_mask_function, mu.blockwise_overlay(blocks))), True),
        "a model's own function": (dict(full, mask_function=mu.and_masks(
            mu.causal_mask_function, lambda b, h, q, kv: (q + kv) % 3 != 0)), False),
        "or with a model's function": (dict(full, mask_function=mu.or_masks(
            mu.causal_mask_function, lambda b, h, q, kv: kv == 0)), False),
    }


MASK_CASES = _mask_cases()


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_prepared_mask_allows_exactly_what_sdpa_mask_allows(case):
    arguments, structured = MASK_CASES[case]
    prepared = mt.prepare_mask(**arguments)
    expected = mu.sdpa_mask(allow_is_causal_skip=False, **arguments).numpy()
    batch, q_len, kv_len = arguments["batch_size"], arguments["q_length"], arguments["kv_length"]
    got = maskattn.allowed_pairs(prepared.mask, batch, 1, q_len, kv_len).astype(bool)
    np.testing.assert_array_equal(got, expected)
    assert prepared.structured == structured, prepared
    assert tuple(prepared.shape) == (batch, 1, q_len, kv_len)


def test_structured_masks_name_their_components():
    arguments, _ = MASK_CASES["sliding window"]
    assert mt.prepare_mask(**arguments).mask.describe() == "sliding_window(3) & key_keep"
    arguments, _ = MASK_CASES["packed"]
    assert mt.prepare_mask(**arguments).mask.describe() == "causal & segments"


def test_register_adds_the_attention_and_mask_functions():
    assert mt.register() == "maskattn"  # idempotent
    assert transformers.AttentionInterface._global_mapping["maskattn"] is mt.attention_forward
    assert mu.ALL_MASK_ATTENTION_FUNCTIONS["maskattn"] is mt.prepare_mask


def test_set_attn_implementation_and_from_pretrained_select_maskattn(tmp_path, monkeypatch):
    calls = []
    import maskattn.torch as maskattn_torch

    counted = maskattn_torch.attention

    def counting(*args, **kwargs):
        calls.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(maskattn_torch, "attention", counting)
    model = model_of(config_of("llama"), "sdpa")
    ids, attention_mask = padded_batch("left")
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=attention_mask).logits
        model.set_attn_implementation("maskattn")
        switched = model(input_ids=ids, attention_mask=attention_mask).logits
        model.save_pretrained(tmp_path)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, attn_implementation="maskattn").eval()
        reloaded = loaded(input_ids=ids, attention_mask=attention_mask).logits
    assert len(calls) == 4  # two layers, two forwards
    real = attention_mask.bool()
    torch.testing.assert_close(switched[real], expected[real], **LOGIT_TOLERANCE)
    torch.testing.assert_close(reloaded[real], expected[real], **LOGIT_TOLERANCE)


# --- whole models against sdpa and eager ----------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_sdpa_and_eager(family, side, no_dense_masks):
    config = config_of(family)
    ids, attention_mask = padded_batch(side)
    logits = {}
    for implementation in ("maskattn", "sdpa", "eager"):
        with torch.no_grad():
            logits[implementation] = model_of(config, implementation)(
                input_ids=ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    for reference in ("sdpa", "eager"):
        torch.testing.assert_close(logits["maskattn"][real], logits[reference][real],
                                   **LOGIT_TOLERANCE)
    assert torch.isfinite(logits["maskattn"]).all()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_gives_the_same_tokens(family, cache):
    if cache == "static" and family != "llama":
        pytest.skip("the static cache is checked on Llama only (it is the same code path)")
    config = config_of(family)
    ids, attention_mask = padded_batch("left")
    tokens = {}
    for implementation in ("maskattn", "sdpa", "eager"):
        with torch.no_grad():
            out = model_of(config, implementation).generate(
                input_ids=ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False,
                cache_implementation=None if cache == "dynamic" else "static")
        tokens[implementation] = out[:, ids.shape[1]:]
    assert tokens["maskattn"].shape == (3, 8)
    assert torch.equal(tokens["maskattn"], tokens["sdpa"])
    assert torch.equal(tokens["maskattn"], tokens["eager"])
    assert len(set(tokens["maskattn"].flatten().tolist())) > 3  # not a degenerate repeat


def _loss_and_gradients(model, ids, attention_mask, **inputs):
    model.train()
    # A label is predicted from the logits one position earlier: leave out the first real token
    # too, whose logits come from a fully hidden padded row (eager gives those rows an average).
    previous_is_pad = torch.nn.functional.pad(attention_mask[:, :-1] == 0, (1, 0))
    labels = ids.masked_fill((attention_mask == 0) | previous_is_pad, -100)
    loss = model(input_ids=ids, attention_mask=attention_mask, labels=labels, **inputs).loss
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def assert_gradients_match(got, expected):
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        error = (got[name] - grad).abs().max().item()
        assert error <= GRADIENT_TOLERANCE * grad.abs().max().item() + 1e-12, (name, error)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradients_match_sdpa(family):
    config = config_of(family)
    ids, attention_mask = padded_batch("left")
    loss, grads = _loss_and_gradients(model_of(config, "maskattn"), ids, attention_mask)
    sdpa_loss, sdpa_grads = _loss_and_gradients(model_of(config, "sdpa"), ids, attention_mask)
    assert loss == pytest.approx(sdpa_loss, rel=1e-6)
    assert_gradients_match(grads, sdpa_grads)


def test_packed_sequences_match_sdpa_and_each_document_alone(no_dense_masks):
    # No attention mask, positions restarting at 0: transformers detects packed documents.
    config = config_of("llama")
    ids, _ = padded_batch("left", length=9)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]] * 3)
    logits = {}
    for implementation in ("maskattn", "sdpa"):
        with torch.no_grad():
            logits[implementation] = model_of(config, implementation)(
                input_ids=ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(logits["maskattn"], logits["sdpa"], **LOGIT_TOLERANCE)
    with torch.no_grad():
        alone = model_of(config, "maskattn")(input_ids=ids[:, 4:7], use_cache=False).logits
    torch.testing.assert_close(logits["maskattn"][:, 4:7], alone, **LOGIT_TOLERANCE)


def test_sliding_window_changes_the_logits():
    # Guards the Mistral comparisons: with L=10 > sliding_window=4 the window really hides pairs.
    ids, attention_mask = padded_batch("left")
    with torch.no_grad():
        windowed = model_of(config_of("mistral"), "maskattn")(input_ids=ids).logits
        unwindowed = model_of(config_of("mistral", sliding_window=None), "maskattn")(
            input_ids=ids).logits
    assert (windowed[:, 4:] - unwindowed[:, 4:]).abs().max() > 1e-3


def test_bfloat16_error_is_at_most_twice_sdpa_error():
    config = config_of("llama")
    ids, attention_mask = padded_batch("left")
    real = attention_mask.bool()
    with torch.no_grad():
        reference = model_of(config, "sdpa")(input_ids=ids, attention_mask=attention_mask).logits
        errors = {}
        for implementation in ("maskattn", "sdpa"):
            logits = model_of(config, implementation, torch.bfloat16)(
                input_ids=ids, attention_mask=attention_mask).logits
            errors[implementation] = (logits.float() - reference)[real].abs().max().item()
    assert errors["maskattn"] <= 2 * errors["sdpa"] + 1e-6, errors


def test_output_attentions_match_eager_weights():
    config = config_of("llama")
    ids, attention_mask = padded_batch("left")
    with torch.no_grad():
        ours = model_of(config, "maskattn")(input_ids=ids, attention_mask=attention_mask,
                                            output_attentions=True).attentions
        eager = model_of(config, "eager")(input_ids=ids, attention_mask=attention_mask,
                                          output_attentions=True).attentions
    real_rows = attention_mask.bool()[:, None, :, None]
    for layer_ours, layer_eager in zip(ours, eager):
        torch.testing.assert_close(layer_ours * real_rows, layer_eager * real_rows,
                                   **LOGIT_TOLERANCE)


def test_a_four_dimensional_mask_from_the_caller_is_used_as_given():
    # transformers passes a caller's 4-D mask through untouched: bool → Mask.keep, float → bias.
    config = config_of("llama")
    ids, _ = padded_batch("left", length=6)
    generator = torch.Generator().manual_seed(2)
    allowed = torch.rand(3, 1, 6, 6, generator=generator) < 0.7
    allowed[..., 0] = True
    additive = torch.zeros(3, 1, 6, 6).masked_fill(~allowed, -torch.inf)
    for mask in (allowed, additive):
        with torch.no_grad():
            ours = model_of(config, "maskattn")(input_ids=ids, attention_mask=mask).logits
            sdpa = model_of(config, "sdpa")(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(ours, sdpa, **LOGIT_TOLERANCE)


def test_a_float_mask_that_requires_grad_gets_sdpa_gradients():
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=generator, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 1, 5, 5, generator=generator, requires_grad=True)
    module = torch.nn.Module()
    out, _ = mt.attention_forward(module, q, k, v, bias, scaling=0.3)
    out.square().sum().backward()
    got = [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    expected.transpose(1, 2).square().sum().backward()
    torch.testing.assert_close(out, expected.transpose(1, 2), **LOGIT_TOLERANCE)
    for grad, tensor in zip(got, (q, k, v, bias)):
        torch.testing.assert_close(grad, tensor.grad, **LOGIT_TOLERANCE)


@pytest.mark.parametrize("family", list(EAGER_FAMILIES))
def test_softcap_and_sinks_match_eager(family, no_dense_masks):
    config = config_of(family)
    ids, attention_mask = padded_batch("left")
    logits, tokens, grads = {}, {}, {}
    for implementation in ("maskattn", "eager"):
        model = model_of(config, implementation)
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, attention_mask=attention_mask).logits
            tokens[implementation] = model.generate(
                input_ids=ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False)
        grads[implementation] = _loss_and_gradients(model, ids, attention_mask)[1]
    real = attention_mask.bool()
    torch.testing.assert_close(logits["maskattn"][real], logits["eager"][real], **LOGIT_TOLERANCE)
    assert torch.equal(tokens["maskattn"], tokens["eager"])
    assert_gradients_match(grads["maskattn"], grads["eager"])
    if family == "gpt_oss":  # the sinks are parameters: their gradients came through maskattn
        assert any(name.endswith("sinks") for name in grads["maskattn"])


# --- errors (docs/errors.md, Python table, P40–P47) ----------------------------------------------

def _qkv(batch=2, heads=4, length=5, dim=8, **kwargs):
    return [torch.zeros(batch, heads, length, dim, **kwargs) for _ in range(3)]


def test_P40_a_tensor_not_on_the_cpu():
    q, k, v = _qkv()
    with pytest.raises(maskattn.Error, match=r"key \[2, 4, 5, 8\] is on device meta; maskattn "
                                             r"runs on the CPU"):
        mt.attention_forward(torch.nn.Module(), q, k.to("meta"), v, None)


def test_P42_a_dtype_maskattn_does_not_compute():
    model = model_of(config_of("llama"), "maskattn", torch.float64)
    ids, attention_mask = padded_batch("left")
    with pytest.raises(maskattn.Error, match=r"query \[3, 4, 10, 8\] has dtype torch.float64; "
                                             r"maskattn computes in float32, float16 or bfloat16"):
        model(input_ids=ids, attention_mask=attention_mask)


@pytest.mark.parametrize("mask, kind", [
    (torch.ones(2, 5, dtype=torch.bool), r"a 2-D torch.bool tensor \[2, 5\]"),
    (torch.ones(2, 1, 5, 5, dtype=torch.int64), r"a 4-D torch.int64 tensor \[2, 1, 5, 5\]"),
    ("causal", "a str"),
])
def test_P43_an_attention_mask_of_another_kind(mask, kind):
    q, k, v = _qkv()
    with pytest.raises(maskattn.Error, match=rf"attention_mask is {kind}; expected the maskattn "
                                             r"PreparedMask .* \(query \[2, 4, 5, 8\]"):
        mt.attention_forward(torch.nn.Module(), q, k, v, mask)


def test_P44_a_prepared_mask_for_other_sizes():
    q, k, v = _qkv()
    prepared = mt.prepare_mask(batch_size=2, q_length=5, kv_length=6)
    with pytest.raises(maskattn.Error, match=r"attention_mask was prepared for \[B, Lq, Lk\] = "
                                             r"\[2, 5, 6\] but query \[2, 4, 5, 8\] and key "
                                             r"\[2, 4, 5, 8\] need \[2, 5, 5\]"):
        mt.attention_forward(torch.nn.Module(), q, k, v, prepared)
    with pytest.raises(maskattn.Error, match=r"a maskattn PreparedMask for \[B, Lq, Lk\] = "
                                             r"\[2, 5, 6\] cannot serve a forward of \[2, 1, 6\]"):
        mt.prepare_mask(batch_size=2, q_length=1, kv_length=6, attention_mask=prepared)


@pytest.mark.parametrize("name", ["sdpa", "", "my_flash_attention", None])
def test_P45_register_under_a_name_transformers_reserves(name):
    with pytest.raises(maskattn.Error, match=r"register: name .* must be a non-empty string"):
        mt.register(name)


def test_P46_a_transformers_without_the_interfaces_the_backend_uses(monkeypatch):
    message = (r"register: transformers .* lacks the interface the maskattn backend uses "
               r"\(AttentionInterface, and AttentionMaskInterface functions taking q_length")
    monkeypatch.setattr(mt, "_hf_masks", None)  # before 4.53: no masking_utils at all
    with pytest.raises(maskattn.Error, match=message):
        mt.register()

    class OlderMaskingUtils:  # a masking_utils whose mask functions take cache_position
        AttentionMaskInterface = mu.AttentionMaskInterface

        @staticmethod
        def sdpa_mask(batch_size, cache_position, kv_length, kv_offset=0, **kwargs):
            raise AssertionError("not called")

    monkeypatch.setattr(mt, "_hf_masks", OlderMaskingUtils)
    with pytest.raises(maskattn.Error, match=message):
        mt.register()


def test_P47_query_key_or_value_not_a_4d_tensor():
    q, k, v = _qkv()
    with pytest.raises(maskattn.Error, match=r"value is \[2, 4, 5\]; expected a 4-D torch tensor"):
        mt.attention_forward(torch.nn.Module(), q, k, v[..., 0], None)
    with pytest.raises(maskattn.Error, match=r"query is ndarray; expected a 4-D torch tensor"):
        mt.attention_forward(torch.nn.Module(), q.numpy(), k, v, None)


# --- the examples stay working --------------------------------------------------------------------

EXAMPLE_OUTPUT = {
    # script: a line its output must contain
    "train_decoder_step.py": "largest |maskattn − SDPA| loss difference",
    "hf_generate.py": "same tokens: True",
    "packed_documents.py": "no token saw another document",
    "flex_catalogue.py": "every entry matches FlexAttention's definition",
    "train_decoder_ring_torchrun.py": "largest |ring − one process| loss difference",
    "train_gpt2_dropout.py": "the curves agree (within 4 standard errors): True",
}
# Scripts that run under a launcher (`torchrun --nproc-per-node 3 script`), not as `python script`.
EXAMPLE_LAUNCHER = {
    "train_decoder_ring_torchrun.py": ["-m", "torch.distributed.run", "--standalone",
                                       "--nproc-per-node", "3"],
}


@pytest.mark.parametrize("script", list(EXAMPLE_OUTPUT))
def test_example_runs(script):
    path = EXAMPLES / script
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout (an installed package)")
    package_root = pathlib.Path(maskattn.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(package_root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    command = [sys.executable, *EXAMPLE_LAUNCHER.get(script, []), str(path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert EXAMPLE_OUTPUT[script] in result.stdout, result.stdout
