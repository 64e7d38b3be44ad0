"""Does the fused model compute the same thing on a GPU? (A device check, run where a GPU is lent.)

The test suite runs on CPU only. This script builds, for every family whose packages are importable, the
test suite's tiny stock model, three members perturbed differently (per-member MLPs) that keep unequal
numbers of heads with a 0-head layer, converts them, and compares on CUDA against the same model on CPU:

- fp32 forward, SDPA and eager attention: max |logits_cuda - logits_cpu| (TF32 off);
- fp32 backward of the ensemble loss: max |grad_cuda - grad_cpu| over all parameters, relative to the
  largest gradient;
- bf16 forward on CUDA: max |p_bf16 - p_fp32| of the ensemble probabilities (bf16 keeps ~3 digits);
- decoders (llama, gpt2 causal LMs): greedy ``generate()`` with the KV cache on CUDA == on CPU, token for
  token, and the cached logits == one uncached pass.

    python bench/check_cuda.py [--json FILE]

Exit status 1 when an fp32 difference exceeds ``--atol`` (default 1e-4) or generated tokens differ.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from _family_specs import SPECS, inputs, perturbed  # noqa: E402

from hydra_hf.assemble import convert_checkpoint  # noqa: E402
from hydra_hf.masks import HeadMasks  # noqa: E402
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads  # noqa: E402

logger = logging.getLogger("check_cuda")
H = 4
DEVICE = "cuda"
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _forward_backward(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().float().cpu(), grads


def check_encoder(spec, tmp: Path) -> dict:
    base = spec.stock()
    folders = []
    for i, seed in enumerate((1, 2, 3)):
        perturbed(base, seed).save_pretrained(tmp / f"{spec.name}{i}")
        folders.append(tmp / f"{spec.name}{i}")
    cpu = convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=H), members=folders, mlp_fusion="per_member")
    batch = {**inputs(spec, base), "labels": torch.tensor([0, 1, 2])}
    row: dict = {"family": spec.name}
    for attn in ("sdpa", "eager"):
        cpu.set_attn_implementation(attn)
        gpu = copy.deepcopy(cpu).to(DEVICE)
        gpu.set_attn_implementation(attn)
        with torch.no_grad():
            ref = cpu(**batch).logits
            got = gpu(**_to(batch, DEVICE)).logits.float().cpu()
        row[f"fp32 {attn} max|d logits|"] = (got - ref).abs().max().item()
    cpu.set_attn_implementation("sdpa")
    cpu.train(False)
    gpu = copy.deepcopy(cpu).to(DEVICE)
    _, g_cpu = _forward_backward(cpu, batch)
    _, g_gpu = _forward_backward(gpu, _to(batch, DEVICE))
    scale = max(g.abs().max().item() for g in g_cpu.values())
    row["fp32 max|d grad| / max|grad|"] = max((g_gpu[n] - g).abs().max().item() for n, g in g_cpu.items()) / scale
    row["grad tensors"] = f"{len(g_gpu)}/{len(g_cpu)}"
    bf = copy.deepcopy(cpu).to(DEVICE, torch.bfloat16).eval()
    b = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in _to(batch, DEVICE).items()}
    with torch.no_grad():
        p_bf = bf(**b).logits.float().exp().cpu()
        p_32 = cpu(**batch).logits.exp()
    row["bf16 max|d probs|"] = (p_bf - p_32).abs().max().item()
    return row


def check_clip(tmp: Path) -> dict:
    from transformers import CLIPConfig, CLIPModel

    eos = 49
    cfg = CLIPConfig(
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=H,
            intermediate_size=64,
            vocab_size=50,
            max_position_embeddings=12,
            eos_token_id=eos,
            bos_token_id=48,
            pad_token_id=eos,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=H,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        ),
        projection_dim=24,
    )
    torch.manual_seed(0)
    CLIPModel(cfg).eval().save_pretrained(tmp / "clip")
    masks = HeadMasks(
        towers={
            "vision": HeadMasks(
                kept_heads=[[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]], num_heads=H
            ),
            "text": HeadMasks(kept_heads=[[[0, 1], []], [[3], [0, 1]], [[0, 2], [1, 2, 3]]], num_heads=H),
        }
    )
    cpu = convert_checkpoint(masks, base=tmp / "clip")
    ids = torch.full((2, 12), eos)
    ids[0, :5] = torch.tensor([48, 5, 6, 7, eos])
    ids[1, :3] = torch.tensor([48, 9, eos])
    mask = (torch.arange(12)[None] < torch.tensor([[5], [3]])).long()
    batch = {"input_ids": ids, "attention_mask": mask,
             "pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    gpu = copy.deepcopy(cpu).to(DEVICE)
    with torch.no_grad():
        ref, got = cpu(**batch), gpu(**_to(batch, DEVICE))
    diffs = [(getattr(got, k).float().cpu() - getattr(ref, k)).abs().max().item()
             for k in ("logits_per_image", "logits_per_text") if getattr(ref, k, None) is not None]
    return {"family": "clip", "fp32 sdpa max|d logits|": max(diffs)}


def check_decoder(name: str, tmp: Path) -> dict:
    from _tiny_decoders import save_gpt2, save_llama, write_masks

    folder = tmp / f"{name}-lm"
    if name == "llama":
        save_llama(folder, head="ForCausalLM")
    else:
        save_gpt2(folder, head="LMHeadModel")
    kept = [[[0, 1], [1, 2, 3]], [[2, 3], []], [[0, 1, 2, 3], [0]]]
    cpu = convert_checkpoint(write_masks(tmp / f"{name}-masks.json", kept=kept), base=folder).eval()
    gpu = copy.deepcopy(cpu).to(DEVICE)
    ids = torch.randint(2, 14, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = cpu(input_ids=ids).logits
        got = gpu(input_ids=ids.to(DEVICE)).logits.float().cpu()
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=1, attention_mask=torch.ones_like(ids))
    t_cpu = cpu.generate(ids, **kw)
    kw_gpu = {**kw, "attention_mask": kw["attention_mask"].to(DEVICE)}
    t_gpu = gpu.generate(ids.to(DEVICE), **kw_gpu).cpu()
    # the cached path: the logits of the generated tokens, scored in one uncached pass, == the cached step logits
    out = gpu.generate(ids.to(DEVICE), **kw_gpu, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        full = gpu(input_ids=out.sequences).logits[:, ids.shape[1] - 1 : -1].float()
    cached = torch.stack(out.logits, 1).float()
    return {"family": f"{name} (causal LM)", "fp32 sdpa max|d logits|": (got - ref).abs().max().item(),
            "generate cuda == cpu": bool(torch.equal(t_cpu, t_gpu)),
            "cached == uncached max|d logits|": (cached - full).abs().max().item()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only smoke-tests this script")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = pin_threads(args.threads)  # before CUDA starts: deterministic cuBLAS reads its workspace setting then
    print(describe_threads(threads))
    global DEVICE
    DEVICE = args.device
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    transformers.utils.logging.disable_progress_bar()
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("check_cuda.py: torch sees no CUDA device here; run it on a machine with a GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu"
    logger.info("torch %s, %s", torch.__version__, name)
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(s.name, lambda s=s: check_encoder(s, Path(tmp))) for s in SPECS]
        jobs += [("clip", lambda: check_clip(Path(tmp)))]
        jobs += [(n, lambda n=n: check_decoder(n, Path(tmp))) for n in ("llama", "gpt2")]
        for name, job in jobs:
            try:
                row = job()
            except Exception as err:  # a family that breaks on CUDA is a finding, not the end of the check
                logger.exception("%s failed", name)
                row = {"family": name, "error": f"{type(err).__name__}: {err}"}
            rows.append(row)
            logger.info("%s", row)
            bad = "error" in row or row.get("generate cuda == cpu") is False or any(
                v > args.atol for k, v in row.items() if k.startswith(("fp32", "cached")) and isinstance(v, float))
            if bad:
                failed.append(name)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "threads": threads,
                                               "rows": rows, "failed": failed}, indent=1))
    logger.info("%d families checked; failed: %s", len(rows), failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
