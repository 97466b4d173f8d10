"""The GPT model of ``maskattn gpt`` against the identical model in PyTorch 2.x.

A checkpoint is written here in the format ``maskattn gpt train`` writes (one ``.npy`` per
``state_dict`` name, ``vocabulary.npy``, ``config.txt``), with random weights; PyTorch loads the same
files into a nanoGPT-shaped module (written out below, in float64) and both compute the loss and
the gradients of one batch. maskattn computes in float32: the loss and every gradient tensor must
agree to 1e-5 relative (per tensor, against its largest element).
"""
from __future__ import annotations


import numpy as np
import pytest

import maskattn

torch = pytest.importorskip("torch")
F = torch.nn.functional

V, T, LAYERS, E, HEADS = 19, 12, 2, 16, 4


def write_checkpoint(directory, causal=True, seed=0):
    """A checkpoint with random (not tiny) weights, so that every tensor matters to the loss."""
    rng = np.random.default_rng(seed)
    shapes = {"transformer.wte.weight": (V, E), "transformer.wpe.weight": (T, E)}
    for layer in range(LAYERS):
        p = f"transformer.h.{layer}."
        shapes.update({p + "ln_1.weight": (E,), p + "ln_1.bias": (E,),
                       p + "attn.c_attn.weight": (3 * E, E), p + "attn.c_attn.bias": (3 * E,),
                       p + "attn.c_proj.weight": (E, E), p + "attn.c_proj.bias": (E,),
                       p + "ln_2.weight": (E,), p + "ln_2.bias": (E,),
                       p + "mlp.c_fc.weight": (4 * E, E), p + "mlp.c_fc.bias": (4 * E,),
                       p + "mlp.c_proj.weight": (E, 4 * E), p + "mlp.c_proj.bias": (E,)})
    shapes.update({"transformer.ln_f.weight": (E,), "transformer.ln_f.bias": (E,)})
    weights = {}
    for name, shape in shapes.items():
        values = rng.normal(0.0, 0.3, shape)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            values += 1.0
        weights[name] = values.astype(np.float32)
        np.save(directory / f"{name}.npy", weights[name])
    characters = [chr(ord("a") + n) for n in range(V - 7)]
    packed = np.zeros((len(characters), 5), np.int64)
    for row, character in enumerate(characters):
        data = character.encode()
        packed[row, 0] = len(data)
        packed[row, 1:1 + len(data)] = list(data)
    np.save(directory / "vocabulary.npy", packed)
    (directory / "config.txt").write_text(
        f"vocab {V}\ncontext {T}\nlayers {LAYERS}\nd_model {E}\nheads {HEADS}\nln_eps 1e-05\n"
        f"causal {int(causal)}\npadded_lines 0\nbatch 2\nsteps 1\nwarmup 0\nlr 0.001\n"
        f"min_lr 0.0001\nweight_decay 0.1\nclip 1\nseed 1\nstep 0\nsampler_state 1\n")
    return weights


class Gpt(torch.nn.Module):
    """nanoGPT's model (bias, exact GELU, tied head), with state_dict names to match."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        layers = [torch.nn.ModuleDict({
            "ln_1": torch.nn.LayerNorm(E), "ln_2": torch.nn.LayerNorm(E),
            "attn": torch.nn.ModuleDict({"c_attn": torch.nn.Linear(E, 3 * E),
                                         "c_proj": torch.nn.Linear(E, E)}),
            "mlp": torch.nn.ModuleDict({"c_fc": torch.nn.Linear(E, 4 * E),
                                        "c_proj": torch.nn.Linear(4 * E, E)})})
            for _ in range(LAYERS)]
        self.transformer = torch.nn.ModuleDict({
            "wte": torch.nn.Embedding(V, E), "wpe": torch.nn.Embedding(T, E),
            "h": torch.nn.ModuleList(layers), "ln_f": torch.nn.LayerNorm(E)})
        self.lm_head = torch.nn.Linear(E, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, tokens, targets, key_keep=None):
        batch, length = tokens.shape
        x = self.transformer.wte(tokens) + self.transformer.wpe(torch.arange(length))
        allowed = torch.ones(length, length, dtype=torch.bool)
        if self.causal:
            allowed = allowed.tril()
        allowed = allowed.expand(batch, 1, length, length)
        if key_keep is not None:
            allowed = allowed & key_keep[:, None, None, :]
        for block in self.transformer.h:
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(E, dim=2)
            heads = [t.view(batch, length, HEADS, E // HEADS).transpose(1, 2) for t in (q, k, v)]
            y = F.scaled_dot_product_attention(*heads, attn_mask=allowed)
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(batch, length, E))
            x = x + block.mlp.c_proj(F.gelu(block.mlp.c_fc(block.ln_2(x))))
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1)


def torch_loss_and_gradients(weights, tokens, targets, causal, key_keep=None):
    model = Gpt(causal).double()
    state = {name: torch.from_numpy(values).double() for name, values in weights.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    loss = model(torch.from_numpy(tokens), torch.from_numpy(targets),
                 None if key_keep is None else torch.from_numpy(key_keep))
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
    return loss.item(), grads


def assert_same(ours, theirs, relative=1e-5):
    loss, _, grads = ours
    their_loss, their_grads = theirs
    assert abs(loss - their_loss) <= relative * abs(their_loss)
    for name, grad in their_grads.items():
        scale = max(np.abs(grad).max(), 1e-12)
        error = np.abs(grads[name] - grad).max() / scale
        assert error <= relative, f"{name}: {error:.2e} relative"


@pytest.mark.parametrize("causal", [True, False])
def test_loss_and_gradients_match_pytorch(tmp_path, causal):
    weights = write_checkpoint(tmp_path, causal)
    rng = np.random.default_rng(1)
    tokens = rng.integers(7, V, (3, T)).astype(np.int64)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    ours = maskattn.gpt_loss_and_gradients(str(tmp_path), tokens, targets)
    assert ours[1] == 3 * (T - 1)
    assert_same(ours, torch_loss_and_gradients(weights, tokens, targets, causal))


def test_padded_batch_matches_pytorch_with_its_padding_mask(tmp_path):
    weights = write_checkpoint(tmp_path)
    tokens = np.full((2, T), 0, np.int64)  # <pad> = 0
    tokens[0, :] = np.arange(T) % (V - 7) + 7
    tokens[1, :5] = [9, 10, 11, 12, 13]
    targets = np.full((2, T), -1, np.int64)
    targets[0, :-1] = tokens[0, 1:]
    targets[1, :4] = tokens[1, 1:5]
    ours = maskattn.gpt_loss_and_gradients(str(tmp_path), tokens, targets, pad=0)
    theirs = torch_loss_and_gradients(weights, tokens, targets, True, key_keep=tokens != 0)
    assert_same(ours, theirs)


def test_P63_gpt_batch_arguments(tmp_path):
    write_checkpoint(tmp_path)
    tokens = np.zeros((1, 4), np.int64)
    with pytest.raises(maskattn.Error, match=r"^gpt_loss_and_gradients: targets has shape "
                                             r"\[2,4\]; expected \[B, L\] = \[1,4\]"):
        maskattn.gpt_loss_and_gradients(str(tmp_path), tokens, np.zeros((2, 4), np.int64))
    with pytest.raises(maskattn.Error, match=r"^gpt_loss_and_gradients: tokens has shape \[4\]"):
        maskattn.gpt_loss_and_gradients(str(tmp_path), tokens[0], tokens[0])
    with pytest.raises(maskattn.Error, match=r"mask is 'future'; use 'causal' or 'none'"):
        maskattn.gpt_loss_and_gradients(str(tmp_path), tokens, tokens, mask="future")
    # The checkpoint's own errors are the C++ catalogue's (E111).
    (tmp_path / "transformer.ln_f.bias.npy").unlink()
    with pytest.raises(maskattn.Error, match="has no transformer.ln_f.bias.npy"):
        maskattn.gpt_loss_and_gradients(str(tmp_path), tokens, tokens)
