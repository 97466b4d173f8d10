#!/usr/bin/env python3
"""transformers' continuous batching (generate_batch) with maskattn against its built-ins, CPU.

A randomly initialised Llama (from_config, float32; --hidden 512, 8 heads of 64, 4 kv heads,
--layers 4, vocabulary 2000) generates --new greedy tokens for --prompts prompts of random
lengths in [--min-prompt, --max-prompt] through transformers' continuous batching, once per
implementation and round, the implementations alternating inside each round:

  sdpa           transformers' CB with sdpa: packed requests, a [T_q, T_cache + T_q] float mask
                 built every step, every layer gathers each request's cache (index_select) and
                 runs dense attention over all packed pairs;
  eager          the same with paged|eager (explicit matmul + softmax);
  maskattn       maskattn.transformers.generate_batch: prefill per request on the packed rows
                 (no mask tensor), decode steps through attention_with_kvcache on transformers'
                 page tensors in place (block tables);
  maskattn-gather  maskattn with decode_fast_path=False: every step gathered as transformers
                 does, attention per request.

Prints per implementation the median wall time of generate_batch over the rounds, tokens/s, the
speedup over sdpa, the median time spent inside the attention functions (transformers' own
sdpa / paged|eager entries and maskattn's, wrapped with a timer; what happens around them, the
mask building and the cache gathering, is in the wall time only), and whether every
implementation produced sdpa's tokens. Threads: torch
and maskattn both use --threads (default 2, all this machine's cores). Run with the OpenBLAS
variables unset as the other benches do, e.g.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/transformers_cb.py
"""

import argparse
import statistics
import time

import torch
import transformers
from transformers import ContinuousBatchingConfig, GenerationConfig

import maskattn.transformers as mt

IMPLEMENTATIONS = ("sdpa", "eager", "maskattn", "maskattn-gather")


ATTENTION_SECONDS = [0.0]


def time_attention_functions():
    """Wraps the three attention entries with a timer (this benchmark's process only)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    for name in ("sdpa", "paged|eager", "maskattn"):
        function = ALL_ATTENTION_FUNCTIONS[name]

        def timed(*args, _function=function, **kwargs):
            start = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                ATTENTION_SECONDS[0] += time.perf_counter() - start

        AttentionInterface.register(name, timed)


def model_of(args):
    torch.manual_seed(0)
    heads = args.hidden // 64
    config = transformers.LlamaConfig(
        vocab_size=2000, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa",
                                                      dtype=torch.float32).eval()


def prompts_of(args):
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.prompts,),
                            generator=generator)
    return [torch.randint(3, 2000, (int(n),), generator=generator).tolist() for n in lengths]


def cb_config(args, prompts):
    tokens = sum(len(p) for p in prompts) + args.prompts * args.new
    blocks = tokens // args.page + 2 * args.prompts + 8
    return ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=args.batch_tokens,
                                    page_size=args.page)


def run(model, name, prompts, generation, args):
    """(seconds, attention seconds, tokens per request) of one generate_batch."""
    config = cb_config(args, prompts)
    ATTENTION_SECONDS[0] = 0.0
    start = time.perf_counter()
    if name in ("sdpa", "eager"):
        model.set_attn_implementation("sdpa" if name == "sdpa" else "paged|eager")
        results = model.generate_batch(prompts, generation_config=generation,
                                       continuous_batching_config=config, progress_bar=False)
    else:
        model.set_attn_implementation("maskattn")
        results = mt.generate_batch(model, prompts, generation, config,
                                    decode_fast_path=name == "maskattn")
    seconds = time.perf_counter() - start
    return seconds, ATTENTION_SECONDS[0], [r.generated_tokens for r in results.values()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--page", type=int, default=32)
    parser.add_argument("--batch-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(IMPLEMENTATIONS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    mt.register()
    time_attention_functions()
    model = model_of(args)
    prompts = prompts_of(args)
    generation = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1,
                                  pad_token_id=0)
    run(model, "sdpa", prompts[:2], generation, args)  # warm-up: allocator, first-call paths
    times = {name: [] for name in args.only}
    attention = {name: [] for name in args.only}
    outputs = {}
    for _ in range(args.rounds):
        for name in args.only:
            seconds, inside, tokens = run(model, name, prompts, generation, args)
            times[name].append(seconds)
            attention[name].append(inside)
            outputs[name] = tokens
    generated = args.prompts * args.new
    base = statistics.median(times["sdpa"]) if "sdpa" in times else None
    print(f"Llama hidden {args.hidden}, {args.layers} layers, {args.prompts} prompts of "
          f"{args.min_prompt}-{args.max_prompt} tokens (total {sum(map(len, prompts))}), "
          f"{args.new} new tokens each, page {args.page}, {args.threads} threads, "
          f"{args.rounds} rounds, torch {torch.__version__}, transformers "
          f"{transformers.__version__}")
    for name in args.only:
        median = statistics.median(times[name])
        same = outputs[name] == outputs.get("sdpa", outputs[name])
        speed = f"{base / median:.2f}x sdpa" if base else ""
        print(f"{name:16s} median {median:7.3f} s  (min {min(times[name]):.3f}, max "
              f"{max(times[name]):.3f})  {generated / median:7.1f} tok/s  {speed:>10s}  "
              f"attention {statistics.median(attention[name]):6.3f} s  "
              f"tokens {'= sdpa' if same else 'DIFFER from sdpa'}")


if __name__ == "__main__":
    main()
