"""A Hugging Face model generating with attn_implementation="maskattn", compared with "sdpa".

A tiny randomly initialised Llama-style model (no download) gets a left-padded batch of three
prompts. The script shows what the model's attention layers receive as their mask — a
maskattn.Mask built from transformers' own mask description, not an L×L tensor — then runs
greedy generate() with the KV cache under "maskattn" and under "sdpa", and compares the tokens
and the prompt logits.

Run: python examples/hf_generate.py
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask

import maskattn.transformers

NEW_TOKENS = 12


def tiny_llama_config():
    return LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=128, initializer_range=0.3,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )


def left_padded_prompts():
    prompts = [[5, 17, 42, 8, 99, 23, 61], [7, 3, 88, 14], [120, 9]]
    length = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (length - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    return ids, attention_mask


def model_with(implementation):
    torch.manual_seed(0)  # the same random weights for both implementations
    return AutoModelForCausalLM.from_config(
        tiny_llama_config(), attn_implementation=implementation).eval()


def show_masks(model, ids, attention_mask):
    """What the attention layers receive: at the prefill, then at the first decoding step."""
    embeds = model.get_input_embeddings()(ids)
    cache = DynamicCache(config=model.config)
    prefill = create_causal_mask(config=model.config, inputs_embeds=embeds,
                                 attention_mask=attention_mask, cache=cache)
    print(f"prefill mask:  {prefill}")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attention_mask, cache=cache, use_cache=True)
    step_mask = torch.cat([attention_mask, torch.ones(len(ids), 1, dtype=torch.long)], dim=1)
    decode = create_causal_mask(config=model.config, inputs_embeds=embeds[:, :1],
                                attention_mask=step_mask, cache=cache)
    print(f"decoding mask: {decode}")


def main():
    torch.set_num_threads(2)
    maskattn.transformers.register()
    ids, attention_mask = left_padded_prompts()
    print(f"prompts (left-padded with 0): {ids.tolist()}")
    models = {name: model_with(name) for name in ("maskattn", "sdpa")}
    show_masks(models["maskattn"], ids, attention_mask)

    tokens, logits = {}, {}
    for name, model in models.items():
        with torch.no_grad():
            logits[name] = model(input_ids=ids, attention_mask=attention_mask).logits
            out = model.generate(input_ids=ids, attention_mask=attention_mask,
                                 max_new_tokens=NEW_TOKENS, do_sample=False)
        tokens[name] = out[:, ids.shape[1]:]
        print(f"{name:>8s} generated: {tokens[name].tolist()}")
    real = attention_mask.bool()
    difference = (logits["maskattn"] - logits["sdpa"]).abs()[real].max().item()
    same = torch.equal(tokens["maskattn"], tokens["sdpa"])
    print(f"same tokens: {same}; largest prompt-logit difference at real tokens: "
          f"{difference:.2e}")
    if not same or difference > 1e-4:
        raise SystemExit("unexpected: maskattn and sdpa disagree")


if __name__ == "__main__":
    main()
