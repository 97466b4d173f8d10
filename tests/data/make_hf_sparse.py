#!/usr/bin/python3
# Generates tests/data/hf_sparse: Hugging Face Longformer and BigBird self-attention on small random
# inputs — the projected Q, K, V and HF's outputs — for the correspondence tests of
# docs/semantics.md §14 (cli_test.cc, CliAttend.MatchesHuggingFaceLongformerAndBigBird).
# Run once with transformers installed (checked with transformers 5.24); the outputs are committed.
#
# Longformer: L = 12, attention_window = 4, global tokens 0 and 6, token 11 padding. The local rows
# are maskattn's window(2, 2) & global_tokens & key/query padding on the query/key/value
# projections; the global rows the same mask on the query_global/key_global/value_global ones.
# BigBird (eval mode): L = 64, block_size = 4, num_random_blocks = 2. HF draws no random block in
# eval mode: each random slot points at block 0, whose keys enter the softmax 1 + r times in query
# blocks 1 … n−2. maskattn: bigbird_layout(16, {3, 2, 0}) and ln(1 + r) added to those scores.
import os

import numpy as np
import torch
from transformers import BigBirdConfig, LongformerConfig
from transformers.models.big_bird.modeling_big_bird import (BigBirdBlockSparseAttention,
                                                            BigBirdModel)
from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_sparse")
os.makedirs(here, exist_ok=True)


def save(name, tensor):
    np.save(os.path.join(here, name + ".npy"), np.asarray(tensor, dtype=np.float32))


def longformer():
    length, width, window = 12, 8, 4
    torch.manual_seed(2026)
    config = LongformerConfig(hidden_size=width, num_attention_heads=1, attention_window=[window],
                              attention_probs_dropout_prob=0.0)
    layer = LongformerSelfAttention(config, layer_id=0).eval()
    x = torch.randn(1, length, width)
    is_global = torch.zeros(1, length, dtype=torch.long)
    is_global[0, [0, 6]] = 1
    real = torch.ones(1, length, dtype=torch.long)
    real[0, 11] = 0
    merged = real * (is_global + 1)  # HF's 0 = padding, 1 = local, 2 = global
    extended = torch.where(merged == 0, -10000.0, torch.where(merged == 2, 10000.0, 0.0))
    with torch.no_grad():
        out = layer(x, attention_mask=extended, is_index_masked=merged == 0,
                    is_index_global_attn=merged == 2, is_global_attn=True)[0][0]
        for name in ("query", "key", "value", "query_global", "key_global", "value_global"):
            save("longformer_" + name, getattr(layer, name)(x)[0])
    save("longformer_out", out)
    np.save(os.path.join(here, "longformer_global.npy"), is_global.numpy())
    np.save(os.path.join(here, "longformer_attention_mask.npy"), real.numpy())


def bigbird():
    length, block, random_blocks = 64, 4, 2
    torch.manual_seed(2026)
    config = BigBirdConfig(hidden_size=8, num_attention_heads=1, block_size=block,
                           num_random_blocks=random_blocks, attention_type="block_sparse",
                           max_position_embeddings=length)
    layer = BigBirdBlockSparseAttention(config, seed=0).eval()
    x = torch.randn(1, length, 8)
    with torch.no_grad():
        blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(
            torch.ones(1, length), block)
        out = layer(x, band_mask=band, from_mask=from_mask, to_mask=to_mask,
                    from_blocked_mask=blocked, to_blocked_mask=blocked)[0][0]
        for name in ("query", "key", "value"):
            save("bigbird_" + name, getattr(layer, name)(x)[0])
    save("bigbird_out", out)


longformer()
bigbird()
