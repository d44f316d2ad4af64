"""transformers on torch, the PyTorch peer of `hubrt bench`: the same case
(batch of pseudo-random prompts, greedy decode, eos ignored) on the same
checkpoint, thread count and dtype.

    python bench/bench_transformers.py MODEL_DIR --mode eager|compile \
        [--prompt-len P] [--gen G] [--batch B] [--threads T]

eager:   the model as `from_pretrained` gives it (sdpa attention, dynamic cache).
compile: static KV cache, decode step through torch.compile(fullgraph=True),
         prefill eager as transformers' generate() does it. compile_s is the
         first compiled call (dynamo + inductor + one step) less one steady step.

The last stdout line is one JSON object with the keys of `hubrt bench`
(load_s, prefill_tok_s, decode_tok_s, peak_rss_mb, ...). Decode tok/s counts
the gen-1 tokens produced after the prefill, as hubrt does."""
import argparse
import json
import os
import resource
import sys
import time
import traceback


def prompt_ids(batch, plen, vocab):
    """The xorshift64 prompt `hubrt bench` draws, so every engine reads the same ids."""
    x, out, mask = 0x9E3779B97F4A7C15, [], (1 << 64) - 1
    for _ in range(batch * plen):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out.append(x % vocab)
    return [out[i * plen:(i + 1) * plen] for i in range(batch)]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run(args, torch, model, cache_factory, step):
    """Prefill then gen-1 greedy decode steps; returns (prefill_s, decode_s, first_step_s)."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.tensor(prompt_ids(args.batch, args.prompt_len, vocab), dtype=torch.long)
    cache = cache_factory()
    t0 = time.perf_counter()
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1,
                cache_position=torch.arange(args.prompt_len))
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    t1 = time.perf_counter()
    first = None
    for i in range(args.gen - 1):
        ts = time.perf_counter()
        logits = step(nxt, cache, torch.tensor([args.prompt_len + i]))
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        if first is None:
            first = time.perf_counter() - ts
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache, StaticCache

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    res = {"engine": f"transformers-{args.mode}", "torch": torch.__version__,
           "transformers": transformers.__version__, "threads": torch.get_num_threads(),
           "batch": args.batch, "prompt_len": args.prompt_len, "gen": args.gen, "dtype": "bf16"}
    try:
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
        model.eval()
        res["load_s"] = round(time.perf_counter() - t0, 4)
        res["attn_implementation"] = model.config._attn_implementation
        max_len = args.prompt_len + args.gen
        with torch.inference_mode():
            if args.mode == "eager":
                def step(tok, cache, pos):
                    return model(input_ids=tok, cache=cache, use_cache=True, cache_position=pos).logits

                def cache_factory():
                    return DynamicCache(config=model.config)

                # warm-up like hubrt bench: a short generation (thread pools, first-touch of weights)
                wa = argparse.Namespace(batch=1, prompt_len=4, gen=2)
                run(wa, torch, model, cache_factory, step)
            else:
                fwd = torch.compile(model.forward, fullgraph=True, dynamic=False)

                def step(tok, cache, pos):
                    return fwd(input_ids=tok, cache=cache, use_cache=True, cache_position=pos).logits

                static = StaticCache(config=model.config, max_cache_len=max_len)

                def cache_factory():
                    # one cache object, zeroed per run: a new object could fail dynamo's guards
                    static.reset()
                    return static

                # Compile pass: same shapes as the timed run, so the timed run hits the compiled graph.
                warm = argparse.Namespace(batch=args.batch, prompt_len=args.prompt_len, gen=min(args.gen, 4))
                _, wdec, first = run(warm, torch, model, cache_factory, step)
                steady = (wdec - first) / max(1, warm.gen - 2)
                res["compile_s"] = round(first - steady, 3)
                # a warm inductor cache (an earlier run) makes compile_s smaller: say which it was
                from torch._dynamo.utils import counters
                res["inductor_fxgraph_cache"] = {k: v for k, v in counters["inductor"].items()
                                                 if k.startswith("fxgraph_cache")}
            pre_s, dec_s, _ = run(args, torch, model, cache_factory, step)
        res["prefill_s"] = round(pre_s, 4)
        res["decode_s"] = round(dec_s, 4)
        res["prefill_tok_s"] = round(args.batch * args.prompt_len / pre_s, 2)
        res["decode_tok_s"] = round(args.batch * (args.gen - 1) / dec_s, 2) if args.gen > 1 else None
    except Exception as e:  # the table records the error in place of the figure
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    res["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print(json.dumps(res))
    sys.stdout.flush()
    return 0 if "error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
