"""Check a model folder as a Hub user who never installed hydra_hf would load it.

The one fresh-interpreter check of hydra_hf: ``hydra-hf push`` (``validate_staged``), the recipes and
the tests all run this file, through :func:`hydra_hf.hub.validate.fresh_check`, which copies the
folder into a private temporary directory and starts::

    python -I fresh_check.py FOLDER [--task load|text-probs|zero-shot-member-probs] [--inputs FILE.json]

``-I`` keeps the interpreter's site-packages (torch, transformers) but ignores ``PYTHONPATH``, the
user site and the script's folder; the caller also gives it an empty ``HOME``, offline Hub settings
and no token. ``import hydra_hf`` fails here (``sys.modules["hydra_hf"] = None``), and the check
fails if anything imported it anyway. The last line of stdout is the JSON result; a failure is a
non-zero exit whose last stderr line says why.

Tasks:
    load: config and model load with ``trust_remote_code=True`` (the auto class whose class the
        config's ``architectures`` names: a causal LM folder loads with ``AutoModelForCausalLM``), a
        forward pass on a dummy input gives finite member logits, and the shipped uncertainty pipeline
        of that auto class builds and runs when the folder has the tokenizer / image processor it needs
        (a causal LM: ``hydra-text-generation`` generates 3 tokens with their uncertainty); the folder's
        ``handler.py`` (Inference Endpoints' custom handler), loaded by path as the toolkit loads it, answers a
        request of two inputs in the task's shape. Prints a summary.
    text-probs: ``{"texts": [...]}`` through ``pipeline("text-classification", top_k=None)``;
        prints one ``{label: probability}`` per text.
    generate: ``{"input_ids": [[...]]}``: a causal LM's greedy ``generate()`` with the folder's own
        generation defaults (end token, lengths: its ``generation_config.json``); prints the token ids.
    zero-shot-member-probs: ``{"class_names": [...], "templates": [...]}`` and the tensor
        ``pixel_values`` in ``inputs.safetensors`` beside the JSON file; prints the members' zero-shot
        probabilities ``(B, M, C)``.

This file imports only the standard library, torch, transformers and safetensors.
"""

import sys

from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

if __name__ == "__main__":  # run as the check (importing this module changes nothing)
    sys.modules["hydra_hf"] = None  # a Hub user who never installed hydra_hf

import argparse
import base64
import importlib.util
import inspect
import io
import json
import os

import torch
import transformers
from transformers import AutoConfig, pipeline

AUTO_ORDER = ("AutoModelForSequenceClassification", "AutoModelForImageClassification",
              "AutoModelForZeroShotImageClassification", "AutoModel")


def check_load(folder: str) -> dict:
    """Load config, model and the shipped pipeline; run them on dummy inputs."""
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    auto_map = config.auto_map
    architectures = list(getattr(config, "architectures", None) or [])
    named = {
        name for name, ref in auto_map.items() if architectures and str(ref).rpartition(".")[2] == architectures[0]
    }
    auto_name = next((name for name in ("AutoModelForCausalLM", *AUTO_ORDER) if name in named),
                     next(name for name in AUTO_ORDER if name in auto_map))
    model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
    base = dict(config.base_config)
    text_cfg = base.get("text_config") or base
    vision_cfg = base.get("vision_config") or base
    params = inspect.signature(model.forward).parameters
    inputs = {}
    if "input_ids" in params and text_cfg.get("vocab_size"):
        inputs["input_ids"] = torch.randint(
            0, int(text_cfg["vocab_size"]), (2, 7), generator=torch.Generator().manual_seed(0)
        )
    if "pixel_values" in params and vision_cfg.get("image_size"):
        size, channels = int(vision_cfg["image_size"]), int(vision_cfg.get("num_channels", 3))
        inputs["pixel_values"] = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(**inputs)
    members = out.get("member_logits")
    if members is None:
        members = out.get("member_logits_per_image")
    if members is None:
        raise SystemExit("the model returned no member logits")
    if members.shape[0] != 2 or members.shape[1] != config.num_members:
        raise SystemExit(f"member logits have shape {tuple(members.shape)}, expected (2, {config.num_members}, ...)")
    if not torch.isfinite(members).all():
        raise SystemExit("non-finite member logits")
    summary = {"auto_class": auto_name, "module": type(model).__module__, "member_logits": list(members.shape),
               "pipeline": None}
    pipelines = getattr(config, "custom_pipelines", None) or {}
    tasks = list(pipelines)
    # a folder shipping several task heads (a decoder: classification and generation) checks the pipeline of the
    # head it was built as
    own = [task for task, spec in pipelines.items() if auto_name in (spec.get("pt") or [])]
    if len(tasks) > 1 and len(own) == 1:
        tasks = own

    def has(*names):
        return any(os.path.isfile(os.path.join(folder, n)) for n in names)

    text_ok = has("tokenizer_config.json", "tokenizer.json")
    image_ok = has("preprocessor_config.json", "processor_config.json")
    needed = {"hydra-text-classification": text_ok, "hydra-image-classification": image_ok,
              "hydra-zero-shot-image-classification": text_ok and image_ok, "hydra-text-generation": text_ok}
    if len(tasks) == 1 and needed.get(tasks[0], False):
        pipe = pipeline(tasks[0], model=folder, trust_remote_code=True)
        summary["pipeline"] = type(pipe).__name__
        result = None
        if tasks[0] == "hydra-text-generation":
            record = pipe("hello world", max_new_tokens=3, do_sample=False)[0]
            for key in (
                "token_entropy",
                "token_mutual_information",
                "sequence_mutual_information",
                "member_top_tokens",
            ):
                if key not in record:
                    raise SystemExit(f"the generation pipeline's result has no {key}: {sorted(record)}")
            if any(len(top) != config.num_members for top in record["member_top_tokens"]):
                raise SystemExit(
                    f"the generation pipeline's result has not {config.num_members} member tokens per step"
                )
            summary["pipeline_result"] = {k: record[k] for k in ("generated_text", "sequence_mutual_information")}
        elif tasks[0] == "hydra-text-classification":
            result = pipe("hello world")
        elif tasks[0] == "hydra-image-classification":
            result = pipe(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8))
        elif importlib.util.find_spec("PIL") is not None:  # the zero-shot pipeline opens images with PIL

            result = pipe(Image.new("RGB", (32, 32)), candidate_labels=["a", "b"])
        if result is not None:
            if not set(result["uncertainty"]) >= {"predictive_entropy", "expected_entropy", "mutual_information"}:
                raise SystemExit(f"the pipeline's result has no uncertainty: {result}")
            if len(result["member_scores"]) != config.num_members:
                raise SystemExit(f"the pipeline's result has {len(result['member_scores'])} member scores")
            summary["pipeline_result"] = result
        if os.path.isfile(os.path.join(folder, "handler.py")):
            summary["handler"] = check_handler(folder, tasks[0], config.num_members)
    return summary


def _png_base64() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (120, 30, 200)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def check_handler(folder: str, task: str, members: int) -> dict:
    """Load the folder's ``handler.py`` as Inference Endpoints does (a module named ``handler``, by path), build
    ``EndpointHandler(folder)`` and answer one request of two inputs; the answer must have the task's shape: per
    input a list of ``{label, score, ...}`` elements with the uncertainty and one score per member (classifiers),
    or text-generation records with the per-token uncertainty (causal LMs)."""
    spec = importlib.util.spec_from_file_location("handler", os.path.join(folder, "handler.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["handler"] = module
    spec.loader.exec_module(module)
    handler = module.EndpointHandler(folder)
    if task == "hydra-text-generation":
        answer = handler({"inputs": ["hello world", "a"], "parameters": {"max_new_tokens": 3, "do_sample": False}})
        records = [record for per_input in answer for record in per_input]
        if len(answer) != 2 or not all("generated_text" in r and "token_entropy" in r for r in records):
            raise SystemExit(f"the handler's answer is not two lists of generation records: {answer}")
        return {"task": task, "inputs": 2, "generated_text": records[0]["generated_text"]}
    image = _png_base64()
    request = {"hydra-text-classification": {"inputs": ["hello world", "a"]},
               "hydra-image-classification": {"inputs": [image, image]},
               "hydra-zero-shot-image-classification": {"inputs": [image, image],
                                                        "parameters": {"candidate_labels": ["a", "b"]}}}[task]
    answer = handler(request)
    for per_input in answer:
        scores = [element["score"] for element in per_input]
        if scores != sorted(scores, reverse=True) or not all(
            {"label", "score", "uncertainty", "member_scores"} <= set(element)
            and len(element["member_scores"]) == members for element in per_input
        ):
            raise SystemExit(f"the handler's answer is not a sorted list of {{label, score, uncertainty, "
                             f"member_scores}} per input: {per_input}")
    if len(answer) != 2:
        raise SystemExit(f"the handler answered {len(answer)} lists for 2 inputs")
    return {"task": task, "inputs": 2, "labels": [per_input[0]["label"] for per_input in answer]}


def text_probs(folder: str, inputs: dict) -> list:
    """``{label: probability}`` per text from the stock text-classification pipeline."""
    pipe = pipeline("text-classification", model=folder, trust_remote_code=True, top_k=None)
    out = pipe(list(inputs["texts"]))
    return [{d["label"]: d["score"] for d in row} for row in out]


def generate_ids(folder: str, inputs: dict) -> list:
    """Token ids of a causal LM's greedy ``generate()`` from ``inputs["input_ids"]``, with the folder's
    generation defaults (hydra_hf.hub.validate.generated_ids does the same in the pushing process)."""
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    input_ids = torch.tensor(inputs["input_ids"])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False)
    return out.tolist()


def zero_shot_member_probs(folder: str, inputs: dict, tensors: dict) -> list:
    """The members' zero-shot probabilities ``(B, M, C)`` with the folder's tokenizer, CLIP's prompt ensemble."""
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    names, templates = inputs["class_names"], inputs["templates"]
    prompts = [t.format(n) for n in names for t in templates]
    with torch.no_grad():
        enc = tokenizer(prompts, padding=True, truncation=True, return_tensors="pt")
        text = model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])  # (C*K, M, P)
        text = text / text.norm(dim=-1, keepdim=True)
        text = text.view(len(names), len(templates), *text.shape[1:]).mean(1)  # (C, M, P)
        text = text / text.norm(dim=-1, keepdim=True)
        image = model.get_image_features(pixel_values=tensors["pixel_values"])  # (B, M, P)
        image = image / image.norm(dim=-1, keepdim=True)
        member_logits = model.logit_scale.exp() * torch.einsum("bmp,cmp->bmc", image, text)  # (B, M, C)
    return torch.softmax(member_logits.double(), -1).tolist()


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--task", default="load", choices=["load", "text-probs", "generate", "zero-shot-member-probs"])
    parser.add_argument("--inputs", default=None, help="a JSON file (and inputs.safetensors beside it)")
    args = parser.parse_args(argv)
    inputs, tensors = {}, {}
    if args.inputs:
        with open(args.inputs, encoding="utf-8") as handle:
            inputs = json.load(handle)
        tensor_file = os.path.join(os.path.dirname(args.inputs), "inputs.safetensors")
        if os.path.isfile(tensor_file):
            tensors = load_file(tensor_file)
    if args.task == "load":
        result = check_load(args.folder)
    elif args.task == "text-probs":
        result = text_probs(args.folder, inputs)
    elif args.task == "generate":
        result = generate_ids(args.folder, inputs)
    else:
        result = zero_shot_member_probs(args.folder, inputs, tensors)
    if sys.modules.get("hydra_hf") is not None:
        raise SystemExit("hydra_hf was imported: the folder does not work without it")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
