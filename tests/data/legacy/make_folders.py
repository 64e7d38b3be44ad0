"""Write ``folders.tar.xz``: tiny Hydra folders as hydra_hf 0.1.0 before its shipped formulas were one module
(``hydra_formulas.py``) wrote them, with the inputs and the outputs that version computed on them
(``expected.safetensors`` in each folder: ``input.*`` and ``output.*`` tensors; ``expected.json``: the
versions). ``tests/modeling/test_legacy_folders.py`` loads them with the current hydra_hf and as remote code
and compares.

Run it with THAT version's source first on the path (the archive records what it wrote; a run with the current
tree would record the current tree's files)::

    git archive fed1e5a src | tar -x -C /tmp/hydra-0.1.0
    PYTHONPATH=/tmp/hydra-0.1.0/src python tests/data/legacy/make_folders.py tests/data/legacy/folders.tar.xz
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

import hydra_hf
from hydra_hf import HeadMasks, convert_checkpoint

H = 4
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]  # member 1 keeps no head in layer 1
TWO = [[[0, 1], [1, 2]], [[2, 3], [0, 3]]]


def bert(folder: Path) -> tuple[HeadMasks, dict]:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                                     intermediate_size=16, max_position_embeddings=16, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return HeadMasks(kept_heads=UNEQUAL, num_heads=H), {"mlp_fusion": "per_member"}


def llama(folder: Path) -> tuple[HeadMasks, dict]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                                      num_key_value_heads=2, intermediate_size=16, max_position_embeddings=16,
                                      initializer_range=0.1, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return HeadMasks(kept_heads=UNEQUAL, num_heads=H), {"mlp_fusion": "per_member"}


def siglip(folder: Path) -> tuple[HeadMasks, dict]:
    torch.manual_seed(0)
    config = transformers.SiglipConfig(
        text_config=dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=H,
                         intermediate_size=16, max_position_embeddings=12),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=16,
                           image_size=16, patch_size=8),
    )
    transformers.SiglipModel(config).save_pretrained(folder)
    return HeadMasks(towers={t: HeadMasks(kept_heads=TWO, num_heads=H) for t in ("vision", "text")}), {}


FAMILIES = {"bert": bert, "llama": llama, "siglip": siglip}


def inputs(family: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if family == "siglip":
        return {"input_ids": torch.randint(1, 60, (3, 7), generator=g),
                "pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    ids = torch.randint(1, 50, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding in row 1
    return {"input_ids": ids, "attention_mask": mask}


def outputs(model: torch.nn.Module, family: str, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**batch)
    if family == "siglip":
        return {"logits_per_image": out.logits_per_image, "member_logits_per_image": out.member_logits_per_image}
    return {"logits": out.logits, "member_logits": out.member_logits}


def main(archive: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for family, build in FAMILIES.items():
            stock = root / "stock" / family
            masks, kwargs = build(stock)
            folder = root / "folders" / family
            model = convert_checkpoint(masks, base=stock, output_dir=folder, **kwargs).eval()
            given = inputs(family)
            tensors = {**{f"input.{k}": v for k, v in given.items()},
                       **{f"output.{k}": v.contiguous() for k, v in outputs(model, family, given).items()}}
            save_file(tensors, str(folder / "expected.safetensors"))
            versions = {"hydra_hf": hydra_hf.__version__, "transformers": transformers.__version__}
            (folder / "expected.json").write_text(json.dumps(versions))
        with tarfile.open(archive, "w:xz") as tar:
            for folder in sorted((root / "folders").iterdir()):
                tar.add(folder, arcname=folder.name)


if __name__ == "__main__":
    main(sys.argv[1])
