#!/usr/bin/python3
# Generates tests/data/pytorch_mha: nn.MultiheadAttention layers saved under their state_dict()
# names, inputs, masks and PyTorch's outputs, for the `maskattn mha` port tests (cli_test.cc).
# Run once with PyTorch installed (Debian: python3-torch); the outputs are committed.
import os

import numpy as np
import torch

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_mha")
torch.manual_seed(2026)
E, H, B, L, S = 16, 4, 2, 6, 9


def save_layer(layer, directory):
    os.makedirs(directory, exist_ok=True)
    for name, value in layer.state_dict().items():
        np.save(os.path.join(directory, name + ".npy"), value.numpy())


def run(layer, *args, **kwargs):
    with torch.no_grad():
        return layer(*args, need_weights=False, **kwargs)[0].numpy()


# Packed in_proj_weight, biases made non-zero (PyTorch initialises them to 0).
packed = torch.nn.MultiheadAttention(E, H, batch_first=True)
with torch.no_grad():
    packed.in_proj_bias.uniform_(-0.5, 0.5)
    packed.out_proj.bias.uniform_(-0.5, 0.5)
save_layer(packed, os.path.join(here, "packed"))
x = torch.randn(B, L, E)
memory = torch.randn(B, S, E)
key_padding = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
memory_padding = torch.zeros(B, S, dtype=torch.bool)
memory_padding[0, 7:] = True
causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
np.save(os.path.join(here, "x.npy"), x.numpy())
np.save(os.path.join(here, "memory.npy"), memory.numpy())
np.save(os.path.join(here, "key_padding.npy"), key_padding.numpy())
np.save(os.path.join(here, "memory_padding.npy"), memory_padding.numpy())
np.save(os.path.join(here, "self_causal_padded.npy"),
        run(packed, x, x, x, attn_mask=causal, key_padding_mask=key_padding))
np.save(os.path.join(here, "self_causal.npy"), run(packed, x, x, x, attn_mask=causal))
np.save(os.path.join(here, "cross.npy"),
        run(packed, x, memory, memory, key_padding_mask=memory_padding))

# kdim/vdim differ from E: separate q/k/v_proj_weight files, no bias.
separate = torch.nn.MultiheadAttention(E, H, kdim=10, vdim=12, bias=False, batch_first=True)
save_layer(separate, os.path.join(here, "separate"))
keys, values = torch.randn(B, S, 10), torch.randn(B, S, 12)
np.save(os.path.join(here, "keys10.npy"), keys.numpy())
np.save(os.path.join(here, "values12.npy"), values.numpy())
np.save(os.path.join(here, "cross_separate.npy"), run(separate, x, keys, values))
