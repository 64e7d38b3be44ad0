"""The masks file format is unchanged by the one-type ``HeadMasks``: files written by the two-type
code (``HeadMasks`` + ``TowerHeadMasks``, fixtures in ``tests/data/masks/``, generated with that code)
load, and saving them again gives the same bytes; masks built in code write the same bytes too."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydra_hf.masks import ANY_TOWER, HeadMasks, load_masks

DATA = Path(__file__).parent / "data" / "masks"
FILES = ["masks_v1_one_tower.json", "masks_v1_two_towers.json", "masks_v1_vision_only.json"]


@pytest.mark.parametrize("name", FILES)
def test_old_files_round_trip_byte_for_byte(name, tmp_path):
    original = (DATA / name).read_bytes()
    for loader in (HeadMasks.load, load_masks):
        masks = loader(DATA / name)
        masks.save(tmp_path / name)
        assert (tmp_path / name).read_bytes() == original
        assert HeadMasks.load(tmp_path / name) == masks


def test_one_tower_file_reads_as_one_unnamed_tower():
    masks = HeadMasks.load(DATA / "masks_v1_one_tower.json")
    assert not masks.named and masks.tower_names == [ANY_TOWER]
    assert (masks.num_members, masks.num_layers, masks.num_heads) == (2, 3, 4)
    assert masks.kept_heads[1] == [[0, 1, 2, 3], [0, 3], [2]]
    assert masks.member_metadata[0]["scores"] == [[None, 0.5, 0.25, None]]
    assert masks.metadata["budget"] == {"heads_per_layer": None, "remove": 6}
    # unnamed masks fit any one-tower model, whatever its tower is called
    assert masks.kept_heads_by_tower({"text": (3, 4)}) == {"text": masks.kept_heads}
    with pytest.raises(ValueError, match="two-tower masks file"):
        masks.check_towers(("vision", "text"), model="a clip checkpoint")


def test_two_tower_file_reads_as_named_towers():
    masks = HeadMasks.load(DATA / "masks_v1_two_towers.json")
    assert masks.named and masks.tower_names == ["vision", "text"]
    assert masks.tower("text").kept_heads == [[[1]], [[0, 1]]] and masks.tower("vision").num_heads == 4
    assert masks.member_metadata[1]["ranking"] == [["text", 0, 0], ["vision", 1, 2]]
    with pytest.raises(ValueError, match="pick one with masks.tower"):
        masks.kept_heads  # noqa: B018  (several towers: no single-tower view)
    with pytest.raises(ValueError, match="single-tower masks file"):
        masks.check_towers(("text",), model="a bert checkpoint")
    # a tower the file leaves out keeps all its heads
    vision_only = HeadMasks.load(DATA / "masks_v1_vision_only.json")
    kept = vision_only.kept_heads_by_tower({"vision": (2, 4), "text": (1, 2)})
    assert kept == {"vision": [[[0, 1], [3]]], "text": [[[0, 1]]]}
    assert vision_only.num_heads == 4  # one named tower: the single-tower view works


def test_built_in_code_writes_the_same_bytes(tmp_path):
    one = HeadMasks.load(DATA / "masks_v1_one_tower.json")
    rebuilt = HeadMasks(
        kept_heads=one.kept_heads, num_heads=4, member_metadata=one.member_metadata, metadata=one.metadata
    )
    rebuilt.save(tmp_path / "one.json")
    assert (tmp_path / "one.json").read_bytes() == (DATA / "masks_v1_one_tower.json").read_bytes()
    two = HeadMasks.load(DATA / "masks_v1_two_towers.json")
    rebuilt = HeadMasks.for_model(
        ("vision", "text"),
        {t: two.tower(t).kept_heads for t in ("vision", "text")},
        {"vision": 4, "text": 2},
        member_metadata=two.member_metadata,
        metadata=two.metadata,
    )
    rebuilt.save(tmp_path / "two.json")
    assert (tmp_path / "two.json").read_bytes() == (DATA / "masks_v1_two_towers.json").read_bytes()
    member = two.select_members([1])
    assert member.tower("vision").kept_heads == [[[2], [0, 1, 2]]] and member.member_metadata[0]["seed"] == 4
