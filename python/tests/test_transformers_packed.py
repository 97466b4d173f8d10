"""Packed (padding-free) batches through the "maskattn" Hugging Face backend.

``DataCollatorWithFlattening`` concatenates documents into one row with restarting
``position_ids`` (and, with ``return_flash_attn_kwargs=True``, the ``cu_seq_lens_*`` /
``max_length_*`` kwargs flash attention uses). The backend then runs
``maskattn.torch.attention_varlen`` (checked with a spy), and the packed forward gives each
document's logits and gradients as that document run alone:

* float32 logits: ``assert_close(rtol=1e-5, atol=1e-5)`` (the attention rows are the same bits;
  what differs is the model's own matmuls over a longer row);
* bfloat16 logits: within 3e-2 of the document alone (a bf16 model's own rounding);
* the gradient of Σ w∘logits for every parameter: max |Δ| ≤ 1e-5 · max |g| in float32.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import maskattn  # noqa: E402
import maskattn.torch as mtorch  # noqa: E402
import maskattn.transformers as mt  # noqa: E402

COMMON = dict(vocab_size=100, max_position_embeddings=64, initializer_range=0.3,
              bos_token_id=None, eos_token_id=None, pad_token_id=0, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)
LENGTHS = (5, 9, 1, 7)


@pytest.fixture(autouse=True, scope="module")
def registered():
    mt.register()


@pytest.fixture
def varlen_calls(monkeypatch):
    """How many times the backend called attention_varlen."""
    calls = []
    real = mtorch.attention_varlen

    def spy(*args, **kwargs):
        calls.append(args[3])  # cu_seqlens_q
        return real(*args, **kwargs)
    monkeypatch.setattr(mtorch, "attention_varlen", spy)
    return calls


def model_of(family="LlamaConfig", dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    config = getattr(transformers, family)(**{**COMMON, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="maskattn")
    return model.to(dtype).eval()


def documents():
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(3, 100, (n,), generator=generator).tolist() for n in LENGTHS]


def packed_batch(flash_kwargs):
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collator([{"input_ids": ids} for ids in documents()])
    batch.pop("labels")
    return batch


@pytest.mark.parametrize("flash_kwargs", [False, True])
@pytest.mark.parametrize("family, overrides", [("LlamaConfig", {}),
                                               ("MistralConfig", {"sliding_window": 3})])
def test_packed_logits_are_each_document_alone(flash_kwargs, family, overrides, varlen_calls):
    model = model_of(family, **overrides)
    batch = packed_batch(flash_kwargs)
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                           for ids in documents()])
    assert len(varlen_calls) == 2  # one per layer, the packed forward only
    assert [int(x) for x in varlen_calls[0]] == [0, 5, 14, 15, 22]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


def test_packed_bfloat16_logits_are_each_document_alone(varlen_calls):
    model = model_of(dtype=torch.bfloat16)
    with torch.no_grad():
        packed = model(**packed_batch(True), use_cache=False).logits[0].float()
        alone = torch.cat([model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                           for ids in documents()]).float()
    assert varlen_calls
    assert (packed - alone).abs().max() <= 3e-2 * alone.abs().max()


def test_packed_gradients_are_the_documents_gradients(varlen_calls):
    weights = torch.randn(sum(LENGTHS), COMMON["vocab_size"],
                          generator=torch.Generator().manual_seed(4))
    model = model_of()
    model.train()
    (model(**packed_batch(True), use_cache=False).logits[0] * weights).sum().backward()
    packed = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    first = 0
    for ids in documents():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        (logits * weights[first:first + len(ids)]).sum().backward()
        first += len(ids)
    assert varlen_calls
    for name, p in model.named_parameters():
        error = (packed[name] - p.grad).abs().max().item()
        assert error <= 1e-5 * p.grad.abs().max().item() + 1e-12, (name, error)


def test_padded_batches_keep_the_masked_call(varlen_calls):
    model = model_of()
    ids = torch.tensor([documents()[1], documents()[1]])
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    assert not varlen_calls


def test_P86_packed_batch_kwargs_given_in_part():
    model = model_of()
    batch = packed_batch(True)
    del batch["cu_seq_lens_k"]
    with pytest.raises(maskattn.Error, match=r"packed-batch kwargs .* are given without "
                                             r"\['cu_seq_lens_k'\]"):
        model(**batch, use_cache=False)
