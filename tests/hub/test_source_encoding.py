"""Shipped code read as the interpreter reads it: a coding declaration cannot smuggle code past push.

Python decodes a source file with the encoding its ``# -*- coding: X -*-`` line names. Under
``raw_unicode_escape`` the six characters ``\\u000a`` are a newline, under ``utf-7`` ``+AAo-`` is: a line
that is a comment to a reader that assumes UTF-8 is code to the interpreter. For EVERY shipped file of
EVERY registered family and both codecs, a folder whose file carries such a line (its UTF-8 reading is
hydra_hf's file plus comments, which the content allow-list accepts) is refused by ``push --dry-run``
in one line, and the payload -- which writes a canary file -- never runs. Files that are ours are staged
as hydra_hf's own bytes, and code vouched for with ``--trust-foreign-code`` obeys the same decoding rule.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _hostile import assert_one_line_error, run_cli, tree_digest
from test_shipped_skeletons import CHECKPOINTS

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.errors import HydraUnsafeError
from hydra_hf.families import families, get_family
from hydra_hf.families.base import COMMON_SHIPPED
from hydra_hf.hub import stage_repository
from hydra_hf.hub.audit import check_shipped_code, normalised_source, packaged_code, python_source
from hydra_hf.saving import MODELING_DIR, PIPELINE_FILE

CANARY = "CANARY_COOKIE_CODE_RAN"
# codec -> the bytes that codec decodes to a newline (ASCII, so a UTF-8 reader sees a comment)
CODECS = {"raw_unicode_escape": b"\\u000a", "utf-7": b"+AAo-"}


def cookie_attack(pristine: bytes, codec: str, canary: Path) -> bytes:
    """``pristine`` under a ``coding: CODEC`` line, plus a comment line that CODEC turns into a call writing
    ``canary``."""
    payload = f"import pathlib; pathlib.Path({str(canary)!r}).write_text('ran')".encode()
    return b"# -*- coding: " + codec.encode() + b" -*-\n" + pristine + b"\n# " + CODECS[codec] + payload + b"\n"


def shipped_files(family_name: str) -> list[str]:
    return sorted({*get_family(family_name).shipped_files, PIPELINE_FILE})


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """family -> a tiny Hydra folder written by ``convert`` (families whose optional package is missing aside)."""
    root = tmp_path_factory.mktemp("cookie")
    out = {}
    for family in families():
        try:
            base, masks = CHECKPOINTS[family.name](root / f"stock-{family.name}")
        except pytest.skip.Exception:  # timm / open_clip not installed
            continue
        convert_checkpoint(masks, base=base, output_dir=root / family.name)
        out[family.name] = root / family.name
    return out


def _push(model: Path, staging: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["push", str(model), "--repo-id", "org/hydra-tiny", "--dry-run", "--staging", str(staging), *extra])


def test_the_payload_is_code_to_python_and_a_comment_to_a_utf8_reader(tmp_path):
    """The attack is real: for each codec, the UTF-8 reading of a tampered shipped file is hydra_hf's file
    (the old allow-list's view), Python's reading holds the payload, and a script carrying it writes the canary."""
    for codec in CODECS:
        name = "configuration_hydra_llama.py"
        data = cookie_attack((MODELING_DIR / name).read_bytes(), codec, tmp_path / CANARY)
        assert normalised_source(data.decode("utf-8"), name) == packaged_code()[name][1]
        assert "write_text" in ast.dump(ast.parse(data)), codec  # the interpreter decodes with the cookie
        script = tmp_path / f"script_{codec.replace('-', '_')}.py"
        script.write_bytes(cookie_attack(b"X = 1\n", codec, tmp_path / f"{CANARY}_{codec}"))
        subprocess.run([sys.executable, "-I", str(script)], check=True, timeout=60)
        assert (tmp_path / f"{CANARY}_{codec}").read_text() == "ran"


def test_every_family_is_covered(folders):
    missing = {f.name for f in families()} - set(folders)
    assert missing <= {"timm_vit", "open_clip"}, missing  # only the families of optional packages may be absent


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("family_name", sorted(CHECKPOINTS))
def test_push_refuses_a_coding_cookie_in_every_shipped_file(folders, family_name, codec, tmp_path):
    if family_name not in folders:
        pytest.skip(f"{family_name} needs an optional package")
    model = tmp_path / "model"
    shutil.copytree(folders[family_name], model)
    files = shipped_files(family_name)
    assert set(files) <= {p.name for p in model.glob("*.py")}
    if family_name != min(folders):  # the files every family ships are the same bytes: tampered in one family's folder
        files = [name for name in files if name not in COMMON_SHIPPED]
    canary = tmp_path / CANARY
    for name in files:
        pristine = (folders[family_name] / name).read_bytes()
        (model / name).write_bytes(cookie_attack(pristine, codec, canary))
        before = tree_digest(tmp_path)
        rc, _, err = _push(model, tmp_path / "staging")
        message = assert_one_line_error(err)
        assert rc == 2 and f"{name}: declares the source encoding '{codec}'" in message, (name, err)
        assert not canary.exists(), f"{name}: the cookie's payload ran"
        assert tree_digest(tmp_path) == before and not (tmp_path / "staging").exists(), name
        # the vouched-for path (push --trust-foreign-code) reads the file the same way
        with pytest.raises(HydraUnsafeError, match=f"{name}: declares the source encoding"):
            stage_repository(model, tmp_path / "staging", repo_id="org/hydra-tiny", allow_foreign_code=True)
        assert not canary.exists() and not (tmp_path / "staging").exists(), name
        (model / name).write_bytes(pristine)


ENCODINGS = {
    # name: (bytes put before hydra_layers.py, words in the message)
    "latin-1 cookie": (b"# -*- coding: latin-1 -*-\n", "declares the source encoding 'iso-8859-1'"),
    "cookie on the second line": (b"#!/usr/bin/env python\n# vim: set fileencoding=utf-7 :\n", "'utf-7'"),
    "a BOM and a latin-1 cookie": (b"\xef\xbb\xbf# coding: latin-1\n", "cannot read its source encoding"),
    "an unknown encoding": (b"# coding: no-such-codec\n", "cannot read its source encoding"),
    "bytes that are not UTF-8": (b"# caf\xe9\n", "cannot read its source encoding"),
}


@pytest.mark.parametrize("case", sorted(ENCODINGS))
def test_other_encodings_are_refused_in_one_line(folders, case, tmp_path):
    prefix, words = ENCODINGS[case]
    model = tmp_path / "model"
    shutil.copytree(folders["bert"], model)
    path = model / "hydra_layers.py"
    path.write_bytes(prefix + path.read_bytes())
    for extra in ([], ["--trust-foreign-code"]):
        rc, _, err = _push(model, tmp_path / "staging", *extra)
        assert rc == 2 and words in assert_one_line_error(err), (extra, err)


def test_our_files_are_staged_as_hydra_hf_bytes(folders, tmp_path):
    """A UTF-8 BOM, a utf-8 cookie, comments and CRLF line ends leave the file ours: push stages hydra_hf's bytes."""
    model = tmp_path / "model"
    shutil.copytree(folders["llama"], model)
    layers = model / "hydra_layers.py"
    layers.write_bytes(
        b"\xef\xbb\xbf# -*- coding: utf-8 -*-\n# reviewed\n" + layers.read_bytes().replace(b"\n", b"\r\n")
    )
    assert python_source(layers.read_bytes(), layers.name) != (MODELING_DIR / layers.name).read_text()
    assert "hydra_layers.py" in check_shipped_code(model)
    rc, out, err = _push(model, tmp_path / "staging")
    assert rc == 0, err
    staged = json.loads(out.strip().splitlines()[-1])["files"]
    for name in (n for n in staged if n.endswith(".py")):
        assert (tmp_path / "staging" / name).read_bytes() == (MODELING_DIR / name).read_bytes(), name


def test_vouched_code_keeps_its_bytes_and_must_be_utf8(folders, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(folders["bert"], model)
    path = model / "hydra_layers.py"
    path.write_text(path.read_text() + '\nUSER_NOTE = "reviewed by the owner"\n', encoding="utf-8")
    rc, _, err = _push(model, tmp_path / "staging", "--trust-foreign-code")
    assert rc == 0, err
    assert (tmp_path / "staging" / "hydra_layers.py").read_bytes() == path.read_bytes()
    path.write_bytes(b"# coding: raw_unicode_escape\n" + path.read_bytes())
    rc, _, err = _push(model, tmp_path / "staging2", "--trust-foreign-code")
    assert rc == 2 and "declares the source encoding 'raw_unicode_escape'" in assert_one_line_error(err), err


def _json_edit(name: str, text: str) -> Callable[[Path], None]:
    """Put ``text`` right after the first ``{`` of ``name`` (written as ``{"x": 1}`` when missing)."""
    def damage(model: Path) -> None:
        path = model / name
        old = path.read_text() if path.exists() else '{"x": 1}'
        path.write_text(old.replace("{", "{" + text, 1))
    return damage


# JSON that Python's reader takes one way and other readers (or a later check) another, or that crashes it
JSON_CASES = {
    # name: (damage, words in the message)
    "tokenizer_config.json naming loader code, then auto_map again": (
        _json_edit("tokenizer_config.json", '"auto_map": {"AutoTokenizer": ["tok.Evil", null]}, "auto_map": null, '),
        "'auto_map' appears twice",
    ),
    "config.json with a key twice": (_json_edit("config.json", '"num_members": 7, '), "'num_members' appears twice"),
    "config.json with NaN": (_json_edit("config.json", '"user_value": NaN, '), "NaN is not JSON"),
    "config.json with a 5000-digit integer": (
        _json_edit("config.json", '"user_value": ' + "9" * 5000 + ", "),
        "not valid JSON",
    ),
    "model.safetensors.index.json with a key twice": (
        lambda model: (model / "model.safetensors.index.json").write_text(
            '{"weight_map": {"x": "../outside.safetensors"}, "weight_map": {"x": "model.safetensors"}}'
        ),
        "'weight_map' appears twice",
    ),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_push_reads_json_as_strictly_as_any_reader(folders, case, tmp_path):
    damage, words = JSON_CASES[case]
    model = tmp_path / "model"
    shutil.copytree(folders["bert"], model)
    damage(model)
    rc, _, err = _push(model, tmp_path / "staging")
    message = assert_one_line_error(err)
    assert rc == 2 and words in message, err
    assert not (tmp_path / "staging").exists()
