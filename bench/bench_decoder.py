"""Fused M = 3 decoder vs the stock model vs 3 members run in sequence: prefill / decode tokens/s, KV cache memory.

CPU or GPU, fp32.

A random Llama-style causal LM of realistic shape but CPU size (default: d = 512, 8 layers, 8 query heads,
4 key/value heads (grouped-query attention), I = 1408, vocab 32,000; ``--family llama|qwen2|qwen3|mistral``
picks transformers' model class and its quirks: Qwen2's Q/K/V biases, Qwen3's per-head Q/K RMSNorm,
Mistral's sliding-window mask). M = 3 members each keep half of the query heads of every layer (a different
seeded random subset per member; ``--selection kv-groups`` keeps whole key/value groups instead), MLP
averaged (``--mlp-fusion per_member``: one MLP per member). Contenders, measured side by side in this
process (interleaved rounds, medians):

- Stock (1): the stock model with all heads (transformers' ``*ForCausalLM``, SDPA).
- Hydra fused (3): ``HydraEnsembleLlamaForCausalLM`` built by ``fuse_decoder`` from the stock weights:
  the 3 members in one forward pass per step, one cache holding each member's kept key/value heads.
- Sequential members (3): the same 3 members as 3 stock models (``unfuse_decoder``: full size, removed
  heads zero), run one after another with 3 caches: what a user without hydra_hf runs.

Every run is a greedy decode from a random prompt of P tokens (no padding): the prefill (one forward pass
over the prompt, logits of the last position only, as ``generate()`` computes them) and then N decode steps
of one token each with the cache. The two ensembles decode from the ensemble's predictive distribution (log
of the mean of the members' softmaxes; the sequential members compute it from their 3 logits every step, the
fused model returns it), the stock model from its own logits. Prefill tokens/s = B * P / prefill time;
decode tokens/s = B * N / time of the N decode steps. Cache memory: bytes of every cache layer's keys and
values after the prefill and the N steps.

Before timing, the bench checks (not timed) that it measures the computation it claims: a 1-member fused
model keeping every head generates (``generate()``, greedy) exactly the stock model's tokens, and the fused
M = 3 model's ``member_logits`` on the prompt equal the 3 sequential members' logits to 1e-4.

    python bench/bench_decoder.py [--family llama] [--batch-sizes 1 8] [--prompt-len 128] [--new-tokens 32]
        [--mlp-fusion average|per_member] [--selection random|kv-groups] [--json out.json] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_threads_argument, pin_bench_threads, random_kept_heads, table, write_results

from hydra_hf.convert.hf_llama import decoder_member_from_state_dict, fuse_decoder, unfuse_decoder
from hydra_hf.modeling import hydra_formulas
from hydra_hf.modeling.configuration_hydra_llama import HydraEnsembleLlamaConfig
from hydra_hf.modeling.modeling_hydra_llama import HydraEnsembleLlamaForCausalLM

logger = logging.getLogger("bench_decoder")

FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
NAMES = {"stock": "Stock (1)", "fused": "Hydra fused (3)", "sequential": "Sequential members (3)"}
COLUMNS = ["batch", "model", "prefill_ms", "prefill tok/s", "prefill x Stock", "prefill x Seq", "decode_ms",
           "decode tok/s", "decode x Stock", "decode x Seq", "cache_MB", "cache x Stock", "cache x Seq", "params_M"]
QUICK = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 160,
         "vocab_size": 1000, "prompt_len": 16, "new_tokens": 4, "rounds": 1, "warmup": 1}


# ------------------------------------------------------------------ models
def base_config(args: argparse.Namespace):
    """The stock config of ``args.family`` at the bench's shape (head_dim = d / H, untied embeddings)."""
    return FAMILIES[args.family](
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size, head_dim=args.hidden_size // args.num_heads,
        max_position_embeddings=max(2048, args.prompt_len + args.new_tokens + 8), tie_word_embeddings=False,
    )


def kv_group_heads(members: int, layers: int, heads: int, kv_heads: int, keep: int, seed: int) -> list:
    """``kept[m][l]``: the query heads of ``keep // group`` random whole key/value groups (seeded)."""
    group = heads // kv_heads
    if keep % group:
        raise ValueError(f"--selection kv-groups needs a multiple of the group size {group} query heads, got {keep}")
    g = torch.Generator().manual_seed(seed)
    return [
        [sorted(h for kv in torch.randperm(kv_heads, generator=g)[: keep // group].tolist()
                for h in range(kv * group, (kv + 1) * group)) for _ in range(layers)]
        for _ in range(members)
    ]


def fused_from_stock(stock, kept: list, mlp_fusion: str, attn: str) -> HydraEnsembleLlamaForCausalLM:
    """The Hydra model of the members ``kept`` of ``stock`` (one checkpoint for all members), via the converter."""
    config = stock.config.to_dict()
    member = decoder_member_from_state_dict(stock.state_dict(), config)
    state = fuse_decoder([member] * len(kept), kept, mlp_fusion)
    hydra_config = HydraEnsembleLlamaConfig(
        base_model_type=stock.config.model_type, base_config=config, kept_heads=kept, mlp_fusion=mlp_fusion,
        lm_head_fusion="shared",
    )
    fused = HydraEnsembleLlamaForCausalLM(hydra_config)
    fused.load_state_dict(state, strict=True)
    fused.set_attn_implementation(attn)
    return fused.eval()


def build(args: argparse.Namespace) -> tuple[dict, list]:
    """``{"stock", "fused", "sequential"}`` (the last a list of 3 stock models) and the kept heads."""
    cfg = base_config(args)
    torch.manual_seed(args.seed)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation=args.attn).eval()
    L, H, keep = args.num_layers, args.num_heads, args.num_heads // 2
    if args.selection == "kv-groups":
        kept = kv_group_heads(args.members, L, H, args.num_kv_heads, keep, args.seed)
    else:
        kept = random_kept_heads(args.members, L, H, keep, seed=args.seed)
    fused = fused_from_stock(stock, kept, args.mlp_fusion, args.attn)
    sequential = []
    for sd in unfuse_decoder(fused.state_dict(), fused.config):
        member = AutoModelForCausalLM.from_config(cfg, attn_implementation=args.attn)
        member.load_state_dict(sd, strict=True)
        sequential.append(member.eval())
    models = {"stock": stock, "fused": fused, "sequential": sequential}
    for group in models.values():
        for m in group if isinstance(group, list) else [group]:
            m.to(args.device)
    return models, kept


# ------------------------------------------------------------------ greedy decoding, timed per phase
def ensemble_log_probs(logits: list[torch.Tensor]) -> torch.Tensor:
    """Log of the mean of the members' softmaxes, from M logits ``(B, V)`` each, as the fused model computes it."""
    return hydra_formulas.ensemble_log_probs(torch.stack(logits, dim=1), dim=1)  # (B, M, V) -> (B, V)


def cache_bytes(cache) -> int:
    """Bytes of a transformers cache's keys and values, summed over its layers."""
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def greedy(group, ids: torch.Tensor, new_tokens: int, sync) -> dict:
    """Prefill ``ids (B, P)``, then ``new_tokens`` one-token steps with the cache; both phases timed.

    ``group``: a stock model, the fused model, or a list of stock models (the sequential ensemble: one cache
    each, every step runs them one after another and decodes from their ensemble distribution).
    Returns ``prefill_s``, ``decode_s``, ``tokens (B, new_tokens + 1)``, ``cache_bytes``.
    """
    models = group if isinstance(group, list) else [group]

    def step(inputs: torch.Tensor, caches: list) -> tuple[torch.Tensor, list]:
        logits, new_caches = [], []
        for model, cache in zip(models, caches):
            out = model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
            new_caches.append(out.cache)
            logits.append(out.logits[:, -1])  # the fused model's are already the ensemble's log-probabilities
        scores = logits[0] if len(logits) == 1 else ensemble_log_probs(logits)
        return scores.argmax(-1, keepdim=True), new_caches  # (B, 1)

    t0 = time.perf_counter()
    token, caches = step(ids, [None] * len(models))
    sync()
    t1 = time.perf_counter()
    tokens = [token]
    for _ in range(new_tokens):
        token, caches = step(token, caches)
        tokens.append(token)
    sync()
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat(tokens, dim=1),
            "cache_bytes": sum(cache_bytes(c) for c in caches)}


def measure(models: dict, batch: int, args: argparse.Namespace) -> dict:
    """Median prefill / decode seconds per contender (interleaved rounds), cache bytes and greedy tokens."""
    sync = (lambda: torch.cuda.synchronize()) if args.device.startswith("cuda") else (lambda: None)
    g = torch.Generator().manual_seed(args.seed + batch)
    ids = torch.randint(3, args.vocab_size, (batch, args.prompt_len), generator=g).to(args.device)  # (B, P)
    samples = {name: {"prefill_s": [], "decode_s": []} for name in models}
    last = {}
    with torch.inference_mode():
        for _ in range(args.warmup):
            for name, group in models.items():
                greedy(group, ids, args.new_tokens, sync)
        for _ in range(args.rounds):
            for name, group in models.items():
                run = greedy(group, ids, args.new_tokens, sync)
                samples[name]["prefill_s"].append(run["prefill_s"])
                samples[name]["decode_s"].append(run["decode_s"])
                last[name] = run
    return {name: {"prefill_s": statistics.median(s["prefill_s"]), "decode_s": statistics.median(s["decode_s"]),
                   "cache_bytes": last[name]["cache_bytes"], "tokens": last[name]["tokens"]}
            for name, s in samples.items()}


# ------------------------------------------------------------------ checks: the same computation
def check(models: dict, kept: list, args: argparse.Namespace) -> dict:
    """Assert (untimed) that the contenders compute what they claim; returns what was compared."""
    stock, fused, sequential = models["stock"], models["fused"], models["sequential"]
    g = torch.Generator().manual_seed(args.seed + 1000)
    ids = torch.randint(3, args.vocab_size, (2, args.prompt_len), generator=g).to(args.device)
    L, H = args.num_layers, args.num_heads
    one = fused_from_stock(stock, [[list(range(H))] * L], args.mlp_fusion, args.attn).to(args.device)
    gen = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False,
           "pad_token_id": 0, "attention_mask": torch.ones_like(ids)}
    with torch.inference_mode():
        want = stock.generate(ids, **gen)
        got = one.generate(ids, **gen)
        if not torch.equal(want, got):
            raise AssertionError(f"1-member fused greedy tokens differ from the stock model's:\n{got}\n{want}")
        member_logits = fused(input_ids=ids, use_cache=False).member_logits  # (B, M, P, V)
        diff = max((member_logits[:, m] - member(input_ids=ids, use_cache=False).logits).abs().max().item()
                   for m, member in enumerate(sequential))
    if diff > 1e-4:
        raise AssertionError(f"fused member logits differ from the sequential members' by {diff:.3g} (> 1e-4)")
    logger.info("check: 1-member fused generate() == stock generate() (%d tokens x 2 rows); fused M=%d member "
                "logits vs sequential members: max |diff| %.2g", args.new_tokens, len(kept), diff)
    return {"one_member_greedy_equal": True, "member_logits_max_abs_diff": diff}


# ------------------------------------------------------------------ report
def rows_for(batch: int, results: dict, models: dict, args: argparse.Namespace) -> list[dict]:
    ref_s, ref_q = results["stock"], results["sequential"]
    rows = []
    for name, r in results.items():
        group = models[name]
        params = sum(p.numel() for m in (group if isinstance(group, list) else [group]) for p in m.parameters())
        rows.append({
            "batch": batch, "model": NAMES[name],
            "prefill_ms": 1e3 * r["prefill_s"], "prefill tok/s": batch * args.prompt_len / r["prefill_s"],
            "prefill x Stock": r["prefill_s"] / ref_s["prefill_s"],
            "prefill x Seq": r["prefill_s"] / ref_q["prefill_s"],
            "decode_ms": 1e3 * r["decode_s"], "decode tok/s": batch * args.new_tokens / r["decode_s"],
            "decode x Stock": r["decode_s"] / ref_s["decode_s"], "decode x Seq": r["decode_s"] / ref_q["decode_s"],
            "cache_MB": r["cache_bytes"] / 2**20, "cache x Stock": r["cache_bytes"] / ref_s["cache_bytes"],
            "cache x Seq": r["cache_bytes"] / ref_q["cache_bytes"], "params_M": params / 1e6,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", default="llama", choices=sorted(FAMILIES))
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=8, help="query heads; every member keeps half of them")
    parser.add_argument("--num-kv-heads", type=int, default=4, help="key/value heads (grouped-query attention)")
    parser.add_argument("--intermediate-size", type=int, default=1408)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--mlp-fusion", default="average", choices=["average", "per_member"])
    parser.add_argument("--selection", default="random", choices=["random", "kv-groups"],
                        help="random: half of the query heads at random; kv-groups: half of the key/value groups")
    parser.add_argument("--prompt-len", type=int, default=128, help="P: prompt tokens (prefill)")
    parser.add_argument("--new-tokens", type=int, default=32, help="N: decode steps after the prefill")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--device", default="cpu")
    add_threads_argument(parser)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per contender (interleaved; median)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the config, checks and rows to this JSON file")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny shapes, 1 round (< 20 s on 2 cores)")
    args = parser.parse_args()
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    threads = pin_bench_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("family %s, d=%d, L=%d, H=%d, KV=%d, I=%d, V=%d, M=%d x %d/%d heads (%s), mlp %s, P=%d, N=%d; "
                "torch %s, %d threads, device %s, load %.2f", args.family, args.hidden_size, args.num_layers,
                args.num_heads, args.num_kv_heads, args.intermediate_size, args.vocab_size, args.members,
                args.num_heads // 2, args.num_heads, args.selection, args.mlp_fusion, args.prompt_len, args.new_tokens,
                torch.__version__, torch.get_num_threads(), args.device, os.getloadavg()[0])
    models, kept = build(args)
    checks = check(models, kept, args)
    rows, agreement = [], {}
    for batch in args.batch_sizes:
        results = measure(models, batch, args)
        rows += rows_for(batch, results, models, args)
        # the two ensembles decode from the same distribution: their greedy tokens should agree (not asserted:
        # a near-tie may flip at float rounding)
        agreement[batch] = (results["fused"]["tokens"] == results["sequential"]["tokens"]).float().mean().item()
    print(table(rows, COLUMNS))
    summary = []
    for batch in args.batch_sizes:
        r = {row["model"]: row for row in rows if row["batch"] == batch}
        f = r[NAMES["fused"]]
        summary.append(f"batch {batch}: Hydra/Sequential prefill {f['prefill x Seq']:.2f}, decode "
                       f"{f['decode x Seq']:.2f}, cache {f['cache x Seq']:.2f}; Hydra/Stock prefill "
                       f"{f['prefill x Stock']:.2f}, decode {f['decode x Stock']:.2f}, cache "
                       f"{f['cache x Stock']:.2f}; "
                       f"greedy tokens fused == sequential: {100 * agreement[batch]:.0f} %")
    print("\n".join(summary))
    if args.json:
        write_results(args.json, threads, args=vars(args), kept_heads=kept,
                      kept_kv_heads=models["fused"].config.kept_kv_heads, checks=checks,
                      greedy_agreement_fused_vs_sequential=agreement, columns=COLUMNS, rows=rows,
                      summary=summary)


if __name__ == "__main__":
    main()
