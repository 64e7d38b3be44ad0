#!/usr/bin/env python
"""The route map at the top of every family modeling file: which file and function ``forward`` runs, in order.

A family's modeling file holds only what is its own; its ``forward`` runs through the shared skeletons, layers,
attention and formulas of its sibling files. The route map, a comment block at the top of the file, lists them
as ``file: function`` lines, each call indented under its caller, in the order they first run. It is not written
by hand: this tool runs the family's task model (a tiny random one: 2 layers, 4 heads, 2 members of unequal
widths, eval mode, no gradients) under a profiler and renders what ran::

    .venv/bin/python tools/route_maps.py            # check every map (exit 1 naming the first stale one)
    .venv/bin/python tools/route_maps.py --write    # rewrite the maps

What a line is: a function of the shipped files (``hydra_*.py``, ``modeling_*.py``, ...), or a ``forward`` /
``create_*`` function of transformers that one of them calls (embeddings, attention functions, mask builders;
transformers' own callees are not followed). Any other frame is not a line, and what it calls attaches to its
caller: ``nn.Module.__call__`` and gradient checkpointing's ``__call__`` (the call goes straight to ``forward``),
decorators, properties, comprehensions, dunder lookups.
A function called again (the next layer) adds the callees it had not called yet. ``tests/modeling/test_route_maps.py``
runs the check.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the shared tiny-model specs of the test suite

from _family_specs import SPECS, inputs  # noqa: E402

import hydra_hf  # noqa: E402  (registers the families)
from hydra_hf.assemble import convert_checkpoint  # noqa: E402
from hydra_hf.families import families  # noqa: E402
from hydra_hf.masks import HeadMasks  # noqa: E402

MODELING = Path(hydra_hf.__file__).resolve().parent / "modeling"
TRANSFORMERS = Path(transformers.__file__).resolve().parent
BEGIN = "# Route of forward"
END = "# (end of the route map)"
KEPT = [[[0, 1], [2]], [[1, 2, 3], [0]]]  # 2 members of unequal widths (3 and 1 heads in layer 1)
H = 4


# ------------------------------------------------------------------------------------------- models
def _two_tower(name: str, folder: Path) -> tuple[HeadMasks, dict[str, torch.Tensor]]:
    towers = dict(
        text_config=dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                         intermediate_size=64, max_position_embeddings=12),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=64,
                           image_size=16, patch_size=8),
    )
    torch.manual_seed(0)
    if name == "clip":
        transformers.CLIPModel(transformers.CLIPConfig(**towers, projection_dim=24)).save_pretrained(folder)
    else:
        transformers.SiglipModel(transformers.SiglipConfig(**towers)).save_pretrained(folder)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1, 58, (3, 7), generator=g), "pixel_values": torch.randn(2, 3, 16, 16,
                                                                                                 generator=g)}
    return HeadMasks(towers={t: HeadMasks(kept_heads=KEPT, num_heads=H) for t in ("vision", "text")}), batch


def _decoder(name: str, folder: Path) -> tuple[HeadMasks, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                                          num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
    else:
        config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=H, n_positions=64)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    ids = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding, as generate() pads
    return HeadMasks(kept_heads=KEPT, num_heads=H), {"input_ids": ids, "attention_mask": mask}


def task_model(modeling_file: str, folder: Path) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny Hydra task model of the family that ships ``modeling_file``, and inputs for it."""
    family = next(f for f in families() if f.modeling_file == modeling_file and f.name != "timm_vit")
    spec = next((s for s in SPECS if s.name == family.name), None)
    if spec is not None:
        stock = spec.stock()
        stock.save_pretrained(folder)
        masks, batch = HeadMasks(kept_heads=KEPT, num_heads=H), inputs(spec, stock)
    elif family.name in ("clip", "siglip"):
        masks, batch = _two_tower(family.name, folder)
    else:
        masks, batch = _decoder(family.name, folder)
    return convert_checkpoint(masks, base=folder).eval(), batch


# ------------------------------------------------------------------------------------------- trace
@dataclass
class Node:
    name: str  # "file.py: qualname"
    children: dict[str, Node] = field(default_factory=dict)

    def lines(self, depth: int = 0) -> list[str]:
        out = [f"#   {'  ' * depth}{self.name}"]
        for child in self.children.values():
            out += child.lines(depth + 1)
        return out


def _line(frame, path: Path, parent_ours: bool) -> str | None:
    """The map's line for a frame, or None when it is not on the map."""
    code = frame.f_code
    name, qualname = code.co_name, code.co_qualname
    if name.startswith("<") or (name.startswith("__") and name not in ("__init__", "__call__")):
        return None
    this = frame.f_locals.get("self")
    if this is not None and isinstance(inspect.getattr_static(type(this), name, None), property):
        return None
    if path.is_relative_to(MODELING):
        return f"{path.name}: {qualname}"
    if path.is_relative_to(TRANSFORMERS) and parent_ours and (name.endswith("forward") or name.startswith("create_")):
        return f"transformers: {qualname}"
    return None


def route(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Node:
    """What ``model(**batch)`` runs, as a tree of map lines (the root: the forward called)."""
    root = Node("")
    stack: list[tuple[Node, bool]] = [(root, True)]  # (the node callees attach to, whether it is ours)

    def profile(frame, event, arg):
        if event == "return":
            if len(stack) > 1:
                stack.pop()
            return
        if event != "call":
            return
        path = Path(os.path.realpath(frame.f_code.co_filename))
        parent, parent_ours = stack[-1]
        line = _line(frame, path, parent_ours)
        if line is None:  # not a line (the module call machinery, a decorator, a property): its callees attach above
            stack.append((parent, parent_ours))
            return
        node = parent.children.setdefault(line, Node(line))
        stack.append((node, not line.startswith("transformers: ")))

    sys.setprofile(profile)
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        sys.setprofile(None)
    (top,) = root.children.values()
    return top


def rendered(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> str:
    """The comment block of the map."""
    head = [
        f"{BEGIN}: what {type(model).__name__}(...) runs, file: function,",
        "# each call under its caller, in the order they first run (members of unequal widths; written by",
        "# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).",
    ]
    return "\n".join(head + route(model, batch).lines() + [END]) + "\n"


# ------------------------------------------------------------------------------------------- files
def modeling_files() -> list[str]:
    return sorted({f.modeling_file for f in families()})


def committed(path: Path) -> str | None:
    """The map block in ``path`` (None when it has none)."""
    text = path.read_text(encoding="utf-8")
    start = text.find(BEGIN)
    if start < 0:
        return None
    end = text.index(END, start) + len(END) + 1
    return text[start:end]


def write(path: Path, block: str) -> None:
    """Put ``block`` where the file's map is, or after its module docstring."""
    text = path.read_text(encoding="utf-8")
    old = committed(path)
    if old is not None:
        text = text.replace(old, block)
    else:
        close = text.index('"""', text.index('"""') + 3) + 3
        text = text[:close] + "\n\n" + block.rstrip("\n") + text[close:]
    path.write_text(text, encoding="utf-8")


def expected_maps() -> dict[str, str]:
    """Every family modeling file -> its map as this tree's code runs it."""
    out = {}
    for name in modeling_files():
        with tempfile.TemporaryDirectory() as folder:
            model, batch = task_model(name, Path(folder))
            out[name] = rendered(model, batch)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the maps instead of checking them")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    stale = []
    for name, block in expected_maps().items():
        path = MODELING / name
        if committed(path) == block:
            continue
        if args.write:
            write(path, block)
            print(f"wrote the route map of {name}")
        else:
            stale.append(name)
    for name in stale:
        print(f"{name}: its route map is not what forward runs; run python tools/route_maps.py --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
