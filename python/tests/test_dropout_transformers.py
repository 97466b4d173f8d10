"""Attention dropout in the Hugging Face backend: a GPT-2 trains with ``attn_pdrop`` through
maskattn as it does through eager attention.

transformers passes ``dropout=config.attn_pdrop`` to the attention function in training mode
(0.0 in eval mode); the backend drops pairs with maskattn's dropout, one seed per call drawn
from PyTorch's generator. maskattn's dropped pairs are not eager's (another generator), so the
losses cannot be compared step by step; the test compares their distributions instead:

* the model: ``GPT2Config(n_layer=2, n_embd=64, n_head=4)`` with its default dropouts
  (``attn_pdrop = resid_pdrop = embd_pdrop = 0.1``), vocabulary 64, the same initial weights for
  every run, memorising a fixed batch of 8 random sequences of 32 tokens with AdamW (lr 3e-3)
  for 50 steps (the loss falls from 4.2 to about 0.3);
* SEEDS = 12 runs per implementation, each from its own ``torch.manual_seed`` (which then
  decides every dropout of the run, attention and others);
* the statistic: each run's mean loss over a window of 10 steps, per window; Welch's t between
  maskattn's runs and eager's must stay within 4 in every window (under the hypothesis that the
  two train alike, |t| > 4 has probability ~5e-4 per window with 22 degrees of freedom, so the
  test does not fail by chance on a machine whose rounding sends the runs elsewhere). Measured,
  seeds 100–111: t = 0.0, 0.6, 1.2, 1.9, 0.7; three other blocks of 12 seeds: |t| ≤ 0.9;
* power: the same comparison between eager and maskattn *without* attention dropout
  (``attn_pdrop = 0``) must exceed 4 in some window — a backend that ignored the dropout fails
  the test. Measured: t = 0.1, −3.5, −6.7, −8.5, −9.6;
* reproducibility: the same seed gives the same losses, bit for bit.
Torch runs one thread here: its threads and maskattn's spinning over two busy cores made each
step ten times slower (measured on a loaded 2-core machine).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import maskattn  # noqa: E402
import maskattn.transformers as mtr  # noqa: E402

VOCAB, LENGTH, BATCH, STEPS, WINDOW, SEEDS = 64, 32, 8, 50, 10, 12
LIMIT = 4.0  # |Welch t|


@pytest.fixture(autouse=True, scope="module")
def registered():
    mtr.register()


@pytest.fixture
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpt2(implementation, attn_pdrop=0.1):
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=LENGTH, attn_pdrop=attn_pdrop,
                                     bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)  # the same initial weights for every run
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=implementation)
    return model.train()


def training_losses(implementation, seed, attn_pdrop=0.1):
    """The 50 training losses of one run: its dropout all drawn after torch.manual_seed(seed)."""
    model = gpt2(implementation, attn_pdrop)
    data = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=data, labels=data).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


def window_means(runs):
    """[runs, windows]: each run's mean loss over each window of WINDOW steps."""
    return np.stack(runs).reshape(len(runs), STEPS // WINDOW, WINDOW).mean(axis=2)


def welch_t(a, b):
    """Welch's t of two samples along axis 0 (one value per window)."""
    standard_error = np.sqrt(a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b))
    return (a.mean(axis=0) - b.mean(axis=0)) / standard_error


def test_gpt2_trains_with_attention_dropout_as_with_eager(one_torch_thread):
    seeds = range(100, 100 + SEEDS)
    maskattn_runs = [training_losses("maskattn", seed) for seed in seeds]
    eager_runs = [training_losses("eager", seed) for seed in seeds]
    control_runs = [training_losses("maskattn", seed, attn_pdrop=0.0) for seed in seeds]
    assert all(run[-1] < 1.0 < run[0] for run in maskattn_runs), "the model learns"
    t = welch_t(window_means(maskattn_runs), window_means(eager_runs))
    assert np.all(np.abs(t) <= LIMIT), f"maskattn vs eager, Welch t per window: {t}"
    control = welch_t(window_means(control_runs), window_means(eager_runs))
    assert np.any(np.abs(control) > LIMIT), f"no attention dropout vs eager: {control}"
    np.testing.assert_array_equal(training_losses("maskattn", seeds[0]), maskattn_runs[0])


def test_output_attentions_are_the_weights_the_output_used():
    """With dropout and output_attentions, the backend returns the dropped, rescaled weights
    (as eager returns its dropped weights), and they are what multiplied the values."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=generator) for _ in range(3))
    torch.manual_seed(3)
    out, weights = mtr.attention_forward(torch.nn.Module(), q, k, v, None, dropout=0.5,
                                         output_attentions=True)
    assert out.shape == (2, 9, 4, 8) and weights.shape == (2, 4, 9, 9)
    kept = weights[torch.tril(torch.ones(9, 9, dtype=torch.bool)).expand(2, 4, 9, 9)]
    assert 0.3 < float((kept == 0).float().mean()) < 0.7  # about half the pairs dropped
    torch.testing.assert_close(out, (weights @ v).transpose(1, 2), rtol=0, atol=2e-6)
    torch.manual_seed(3)
    again, _ = mtr.attention_forward(torch.nn.Module(), q, k, v, None, dropout=0.5)
    assert torch.equal(again, out)


def test_eval_mode_passes_no_dropout(one_torch_thread):
    model = gpt2("maskattn").eval()
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first, second = (model(input_ids=ids).logits for _ in range(2))
    assert torch.equal(first, second)


def test_P80_dropout_must_be_a_probability():
    q = torch.zeros(1, 2, 3, 8)
    with pytest.raises(maskattn.Error, match=r"maskattn attention backend: dropout must be a real "
                                             r"number in \[0, 1\] .*got 1.5"):
        mtr.attention_forward(torch.nn.Module(), q, q, q, None, dropout=1.5)
