"""The shipped skeletons (``hydra_skeletons.py``): every registered family's folder loads as remote code.

The family modeling files declare only what is their own and subclass the encoder / classifier / tower
skeletons in ``hydra_skeletons.py`` (built from the layers in ``hydra_layers.py``), which every folder
ships. For EVERY registered family (the test fails when a new family has no tiny checkpoint here), a
folder written by this tree is loaded with ``trust_remote_code=True`` in a fresh process where hydra_hf
cannot be imported: the class comes from the folder's own files, its outputs equal the local model's
(fp32, atol 1e-5), and re-saving the remote model writes exactly the family's shipped files (the layers
and skeletons come along as sibling imports).

Folders written before the skeletons existed (their weights and config are byte-identical to today's,
so such a folder is today's folder with the shipped ``.py`` files of the commit before the change, read
from git, and without the files shipped only since) load with this tree's classes and, as remote code,
with their own files, and give the same numbers. That check is skipped where the git history is not available.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import transformers
from _family_specs import SPECS
from conftest import REPO, run_fresh_python
from test_modeling_clip import save_open_clip, tiny_clip_config, tiny_open_clip, two_tower_masks
from test_modeling_deit_beit_dinov2_siglip import masks_for, save_stock, stock
from test_modeling_vit import UNEQUAL as VIT_UNEQUAL
from test_modeling_vit import save_timm, tiny_timm_vit
from transformers import CLIPModel

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.families import families, get_family
from hydra_hf.masks import HeadMasks

ATOL = 1e-5
H = 4
# 3 members, unequal widths, member 1 keeps no head in layer 1 (2-layer text and image stocks)
UNEQUAL = [[[0, 1], [2, 3]], [[1, 2, 3], []], [[0], [0, 1, 2, 3]]]
# folders written by older trees, as (the commit whose shipped files they ship, the shipped files added since,
# the families whose folders that commit wrote)
OLD_TREES = {
    # the last commit whose modeling files had no shared skeletons (llama and gpt2 came later)
    "before-skeletons": ("e7b2abf", {"hydra_attention.py", "hydra_skeletons.py"}, None),
    # the last commit whose decoders had an attention of their own, beside the encoders'
    "before-shared-attention": ("9b61be9", {"hydra_attention.py"}, {"llama", "gpt2"}),
}
FAMILIES_SINCE = {"llama", "gpt2"}
OUTPUT_KEYS = ("member_logits", "logits", "member_logits_per_image", "logits_per_image", "logits_per_text")


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def _spec_checkpoint(name: str):
    spec = next(s for s in SPECS if s.name == name)

    def make(folder: Path) -> tuple[Path, HeadMasks]:
        _perturbed(spec.stock()).save_pretrained(folder)
        return folder, HeadMasks(kept_heads=UNEQUAL, num_heads=H)

    return make


def _clip(folder: Path) -> tuple[Path, HeadMasks]:
    torch.manual_seed(0)
    _perturbed(CLIPModel(tiny_clip_config())).save_pretrained(folder)
    return folder, two_tower_masks()


def _open_clip(folder: Path) -> tuple[Path, HeadMasks]:
    pytest.importorskip("open_clip")
    return save_open_clip(tiny_open_clip(), folder), two_tower_masks()


def _timm_vit(folder: Path) -> tuple[Path, HeadMasks]:
    pytest.importorskip("timm")
    return save_timm(tiny_timm_vit(), folder), HeadMasks(kept_heads=VIT_UNEQUAL, num_heads=H)


def _siglip(folder: Path) -> tuple[Path, HeadMasks]:
    return save_stock(stock("siglip"), folder, "siglip"), masks_for("siglip", UNEQUAL)


def _llama(folder: Path) -> tuple[Path, HeadMasks]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=99,
        pad_token_id=0,
        num_labels=3,
    )
    _perturbed(transformers.LlamaForSequenceClassification(config)).save_pretrained(folder)
    return folder, HeadMasks(kept_heads=UNEQUAL, num_heads=H)


def _gpt2(folder: Path) -> tuple[Path, HeadMasks]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, num_labels=3)
    _perturbed(transformers.GPT2ForSequenceClassification(config)).save_pretrained(folder)
    return folder, HeadMasks(kept_heads=UNEQUAL, num_heads=H)


# family -> writes a tiny stock checkpoint into a folder and returns it with the masks to convert it with
CHECKPOINTS = {
    **{spec.name: _spec_checkpoint(spec.name) for spec in SPECS},
    "clip": _clip,
    "open_clip": _open_clip,
    "timm_vit": _timm_vit,
    "siglip": _siglip,
    "llama": _llama,
    "gpt2": _gpt2,
}


def _inputs(family_name: str, config) -> dict[str, torch.Tensor]:
    """A padded text batch, images, or both (two towers), sized from the folder's base config."""
    modality = get_family(family_name).modality
    g = torch.Generator().manual_seed(7)
    out = {}
    if modality in ("text", "image-text"):
        ids = torch.randint(5, 58, (3, 9), generator=g)
        mask = torch.ones(3, 9, dtype=torch.long)
        mask[1, 6:] = 0
        mask[2, 3:] = 0
        pad = config.base_config.get("pad_token_id") or 0
        out.update(input_ids=ids * mask + pad * (1 - mask), attention_mask=mask)
    if modality in ("image", "image-text"):
        size = config.base_config.get("vision_config", config.base_config)["image_size"]
        size = size if isinstance(size, int) else size[0]
        out["pixel_values"] = torch.randn(2, 3, size, size, generator=g)
    return out


def _outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**batch)
    return {k: getattr(out, k) for k in OUTPUT_KEYS if getattr(out, k, None) is not None}


def test_every_family_is_covered():
    assert {f.name for f in families()} <= set(CHECKPOINTS), "add a tiny checkpoint for the new family to CHECKPOINTS"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """family -> (folder written by this tree, inputs, the local model's outputs)."""
    root = tmp_path_factory.mktemp("skeletons")
    out = {}
    for family in families():
        try:
            base, masks = CHECKPOINTS[family.name](root / f"stock-{family.name}")
        except pytest.skip.Exception:  # an optional package (timm, open_clip) is missing
            continue
        torch.manual_seed(0)
        folder = root / f"new-{family.name}"
        model = convert_checkpoint(masks, base=base, output_dir=folder, mlp_fusion="per_member").eval()
        batch = _inputs(family.name, model.config)
        out[family.name] = (folder, batch, _outputs(model, batch))
        torch.save(batch, folder.parent / f"inputs-{family.name}.pt")
    return out


_REMOTE = """
    import json, sys, torch, transformers
    result = {}
    for key, (folder, auto, inputs, resave) in json.loads(%r).items():
        model = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            out = model(**torch.load(inputs))
        module = sys.modules[type(model).__module__]
        result[key] = {
            "module": module.__name__, "source": open(module.__file__).read(),
            "outputs": {k: getattr(out, k).tolist() for k in %r if getattr(out, k, None) is not None},
        }
        if resave:
            model.save_pretrained(resave)
    assert sys.modules.get("hydra_hf") is None
    print(json.dumps(result))
"""


def _load_remotely(cases: dict[str, tuple[str, str, str, str | None]], tmp_path: Path) -> dict:
    code = _REMOTE % (json.dumps(cases), OUTPUT_KEYS)
    stdout = run_fresh_python(code, env={"HF_MODULES_CACHE": str(tmp_path / "modules")}, timeout=600)
    return json.loads(stdout.strip().splitlines()[-1])


def _assert_outputs(got: dict, expected: dict[str, torch.Tensor], what: str) -> None:
    assert set(got) == set(expected), what
    for key, value in expected.items():
        torch.testing.assert_close(torch.tensor(got[key]), value, atol=ATOL, rtol=0, msg=f"{what}: {key}")


def test_every_family_loads_as_remote_code_without_hydra_hf(written, tmp_path):
    cases = {}
    for name, (folder, _, _) in written.items():
        family = get_family(name)
        assert sorted(p.name for p in folder.glob("*.py")) == sorted(family.shipped_files), name
        # travel along
        for shared in {"hydra_attention.py", "hydra_layers.py", "hydra_skeletons.py"} & set(family.shipped_files):
            assert (folder / shared).read_text() == (REPO / "src" / "hydra_hf" / "modeling" / shared).read_text()
        inputs = str(folder.parent / f"inputs-{name}.pt")
        cases[name] = (str(folder), family.task_auto_class, inputs, str(tmp_path / f"resaved-{name}"))
    result = _load_remotely(cases, tmp_path)
    for name, (folder, _, expected) in written.items():
        family = get_family(name)
        got = result[name]
        assert got["module"].startswith("transformers_modules") and got["module"].endswith(family.modeling_file[:-3])
        _assert_outputs(got["outputs"], expected, name)
        # re-saved as remote code: the modeling file and its sibling imports, i.e. the family's shipped files
        assert sorted(p.name for p in (tmp_path / f"resaved-{name}").glob("*.py")) == sorted(
            set(family.shipped_files) - {"handler.py"})  # push adds handler.py, the servers' entry point


def _git_show(commit: str, path: str) -> str | None:
    try:
        proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


@pytest.mark.parametrize("tree", list(OLD_TREES))
def test_folders_written_by_older_trees_load_and_agree(written, tmp_path, tree):
    """A folder written by an older tree (today's weights and config with its shipped files) loads with this
    tree's classes, and as remote code with its own old files, and gives the same numbers."""
    commit, shipped_since, families = OLD_TREES[tree]
    if _git_show(commit, "src/hydra_hf/modeling/hydra_layers.py") is None:
        pytest.skip(f"the git history with commit {commit} is not available")
    cases, old_sources = {}, {}
    written = {name: w for name, w in written.items() if name in families} if families else {
        name: w for name, w in written.items() if name not in FAMILIES_SINCE}
    for name, (folder, batch, expected) in written.items():
        family = get_family(name)
        old = tmp_path / f"old-{name}"
        shutil.copytree(folder, old)
        for file in family.shipped_files:
            source = _git_show(commit, f"src/hydra_hf/modeling/{file}")
            if file in shipped_since or source is None:  # a file that tree did not ship
                (old / file).unlink()
            else:
                (old / file).write_text(source)
        config = json.loads((old / "config.json").read_text())
        module, cls = config["auto_map"]["AutoConfig"].split(".")
        if not (old / f"{module}.py").is_file():  # that tree kept every family's config in configuration_hydra.py
            config["auto_map"]["AutoConfig"] = f"configuration_hydra.{cls}"
            (old / "config.json").write_text(json.dumps(config))
        old_sources[name] = (old / family.modeling_file).read_text()
        assert "hydra_layers import" in old_sources[name]
        local = family.model_class().from_pretrained(old).eval()  # this tree's classes, the old folder
        _assert_outputs({k: v.tolist() for k, v in _outputs(local, batch).items()}, expected, f"{name} (local)")
        inputs = str(folder.parent / f"inputs-{name}.pt")
        cases[name] = (str(old), family.task_auto_class, inputs, None)
    result = _load_remotely(cases, tmp_path)
    for name, (_, _, expected) in written.items():
        assert result[name]["source"] == old_sources[name], f"{name}: the old folder ran other code"
        _assert_outputs(result[name]["outputs"], expected, f"{name} (remote, old files)")
