"""A causal-LM Hydra pushed to the Hub generates what the local folder generates: push stages
``generation_config.json`` (the end token and length defaults), and its fresh-process check compares the
staged folder's greedy ``generate()`` with the local folder's."""

from __future__ import annotations

import json
import shutil

import pytest
from _hostile import assert_one_line_error, run_cli
from _tiny_decoders import save_llama

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.hub import HubError, stage_repository
from hydra_hf.hub.validate import check_generation
from hydra_hf.masks import HeadMasks

NEW_TOKENS = 3  # the local folder's generation default; transformers' own default length is 20 tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("push-generation")
    base = save_llama(root / "stock", head="ForCausalLM")
    convert_checkpoint(HeadMasks(kept_heads=[[[0, 1], [2, 3]], [[1], [0, 2]]], num_heads=4), base=base,
                       output_dir=root / "hydra")
    path = root / "hydra" / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(max_new_tokens=NEW_TOKENS, eos_token_id=None)  # a default that changes what generate() returns
    path.write_text(json.dumps(config))
    return root / "hydra"


def test_push_stages_generation_config_and_compares_generation(folder, tmp_path):
    rc, out, err = run_cli(["push", str(folder), "--repo-id", "org/hydra-lm", "--dry-run", "--staging",
                            str(tmp_path / "staging")])
    assert rc == 0, err
    assert "generation_config.json" in json.loads(out.strip().splitlines()[-1])["files"]
    staged = json.loads((tmp_path / "staging" / "generation_config.json").read_text())
    assert staged["max_new_tokens"] == NEW_TOKENS
    result = check_generation(tmp_path / "staging", folder)
    assert len(result["generated"][0]) == len(result["input_ids"][0]) + NEW_TOKENS


def test_a_repository_that_generates_otherwise_is_refused(folder, tmp_path):
    stage_repository(folder, tmp_path / "staging", repo_id="org/hydra-lm")
    (tmp_path / "staging" / "generation_config.json").unlink()  # as push staged it before
    with pytest.raises(HubError, match=f"generates 20 token.* generates {NEW_TOKENS} ") as info:
        check_generation(tmp_path / "staging", folder)
    assert "\n" not in str(info.value), str(info.value)


def test_a_broken_generation_config_is_one_line(folder, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(folder, model)
    (model / "generation_config.json").write_text('{"max_new_tokens": NaN}')
    rc, _, err = run_cli(["push", str(model), "--repo-id", "org/hydra-lm", "--dry-run"])
    assert rc == 2 and "generation_config.json" in assert_one_line_error(err), err
