"""Hostile folders and careless flags: `hydra-hf push --dry-run`.

Every refused case asserts exit code 2, a one-line message, that no file outside the staging folder
changed (a digest of the whole sandbox before and after, symlinks not followed), that no staging
folder is left behind, and -- for shipped code -- that the code never ran (a canary file it would
write). Issue 13 rows 1, 5, 6, 9 (SameFileError), 14.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _hostile import assert_one_line_error, run_cli, tree_digest
from conftest import tiny_bert_config, write_tiny_tokenizer

from hydra_hf.hub import stage_repository
from hydra_hf.outputs import MARKER

KEPT = [[[0, 1], [2], []], [[0, 1, 2, 3], [1], [3]]]
FOREIGN = ["--trust-foreign-code"]
CANARY = "CANARY_SHIPPED_CODE_RAN"
SECRET = "root:x:0:0:root:/root:/bin/bash\n"


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A converted tiny Hydra folder and an evaluation report folder (real PNG figures)."""
    from transformers import BertForSequenceClassification

    from hydra_hf import metrics
    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.evaluation import plots, report
    from hydra_hf.masks import HeadMasks

    root = tmp_path_factory.mktemp("hostile-push")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).save_pretrained(root / "base")
    write_tiny_tokenizer(root / "base")
    convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / "base", output_dir=root / "hydra")
    g = torch.Generator().manual_seed(0)
    probs, labels = torch.softmax(torch.randn(30, 3, generator=g), -1), torch.randint(0, 3, (30,), generator=g)
    plots.reliability_diagram({"Hydra": (probs, labels)}, root / "report" / "reliability.png")
    report.write_report({"rows": [{"method": "Hydra", **metrics.calibration_report(probs, labels)}],
                         "settings": {"id_data": "rotten_tomatoes:test"},
                         "figures": {"Reliability diagram": "reliability.png"}}, root / "report")
    return root


@pytest.fixture
def sandbox(world, tmp_path) -> Path:
    """A private copy per test: ``model/``, ``report/`` and ``outside/`` (files no push may read)."""
    root = tmp_path / "sb"
    root.mkdir()
    shutil.copytree(world / "hydra", root / "model")
    shutil.copytree(world / "report", root / "report")
    outside = root / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(SECRET)
    (outside / "export.py").write_text("class Foo:\n    pass\n")
    shutil.copyfile(world / "report" / "reliability.png", outside / "stolen.png")
    return root


def _push(sb: Path, *extra: str, model: str = "model", staging: str = "staging") -> tuple[int, str, str]:
    return run_cli(["push", str(sb / model), "--repo-id", "org/hydra-tiny", "--dry-run",
                    "--staging", str(sb / staging), *extra])


# ---------------------------------------------------------------------------------- hostile inputs
def _edit_json(path: Path, change: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _symlink(name: str, target: str) -> Callable[[Path], None]:
    def damage(sb: Path) -> None:
        link = sb / "model" / name
        if link.exists():
            link.unlink()
        link.symlink_to(sb / target)
    return damage


def _auto_map(entry: Callable[[Path], str], key: str = "AutoModelForSequenceClassification") -> Callable[[Path], None]:
    return lambda sb: _edit_json(sb / "model" / "config.json", lambda c: c["auto_map"].__setitem__(key, entry(sb)))


def _shipped(payload: str, file: str = "modeling_hydra_bert.py") -> Callable[[Path], None]:
    """Append ``payload`` (``{canary}`` = the canary path) to a shipped file of the model folder."""
    def damage(sb: Path) -> None:
        path = sb / "model" / file
        text = path.read_text() if path.exists() else ""
        path.write_text(text + "\n" + payload.format(canary=str(sb / CANARY)) + "\n")
    return damage


def _report(change: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda sb: _edit_json(sb / "report" / "report.json", change)


def _fake_weights(sb: Path) -> None:
    (sb / "model" / "leak.safetensors").write_text(SECRET)


def _truncated_weights(sb: Path) -> None:
    path = sb / "model" / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _shard_index(sb: Path) -> None:
    (sb / "outside" / "model.safetensors").write_bytes((sb / "model" / "model.safetensors").read_bytes())
    (sb / "model" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"classifier.bias": "../outside/model.safetensors"}}))


def _sibling_helper(sb: Path) -> None:
    (sb / "model" / "helper.py").write_text(f"import os\nos.system('touch {sb / CANARY}')\n")
    _shipped("from .helper import value")(sb)


def _report_symlink(sb: Path) -> None:
    (sb / "report" / "extra.png").symlink_to(sb / "outside" / "stolen.png")


def _not_a_png(sb: Path) -> None:
    (sb / "report" / "fake.png").write_text(SECRET)


def _tokenizer_code(sb: Path) -> None:
    _edit_json(sb / "model" / "tokenizer_config.json",
               lambda c: c.__setitem__("auto_map", {"AutoTokenizer": ["tok.EvilTokenizer", None]}))


HOSTILE: dict[str, tuple[Callable[[Path], None], list[str], str]] = {
    # name: (damage, extra flags, words in the message)
    # --- row 1: symlinks leaving the folder, files that are not what their name says
    "symlinked vocab.txt to a file outside": (_symlink("vocab.txt", "outside/passwd"), [], "is a symlink to"),
    "symlinked leak.safetensors to a file outside": (
        _symlink("leak.safetensors", "outside/passwd"),
        [],
        "is a symlink to",
    ),
    "symlinked config.json to a file outside": (_symlink("config.json", "outside/passwd"), [], "outside"),
    "symlinked shipped module to a file outside": (
        _symlink("modeling_hydra_bert.py", "outside/export.py"),
        [],
        "is a symlink to",
    ),
    "symlinked folder inside the model folder": (_symlink("sub", "outside"), [], "symlink"),
    "a text file named .safetensors": (_fake_weights, [], "leak.safetensors is not a valid safetensors file"),
    "truncated model.safetensors": (_truncated_weights, [], "model.safetensors is not a valid safetensors file"),
    "shard index pointing outside": (_shard_index, [], "leads outside"),
    "tokenizer_config.json naming its own code": (_tokenizer_code, [], "names loader code of its own"),
    # --- row 5 and row 9: paths in auto_map / custom_pipelines
    "auto_map ../export.Foo": (_auto_map(lambda sb: "../export.Foo"), [], "is not 'module.Class'"),
    "auto_map absolute path": (_auto_map(lambda sb: f"{sb / 'outside' / 'export'}.Foo"), [], "is not 'module.Class'"),
    "auto_map code of another repository": (_auto_map(lambda sb: "evil/repo--modeling.Foo"), [], "another repository"),
    "auto_map not a string": (_auto_map(lambda sb: 5), [], "auto_map must map"),
    "custom_pipelines impl ../pipe.X": (
        lambda sb: _edit_json(
            sb / "model" / "config.json",
            lambda c: c["custom_pipelines"]["hydra-text-classification"].__setitem__("impl", "../outside/pipe.X"),
        ),
        [],
        "is not 'module.Class'",
    ),
    # --- row 6: the AST audit, the second line: reached only for code the user vouches for (the payload
    # would write the canary if it ever ran; without the flag the content allow-list refuses it first)
    "import os as _o": (_shipped("import os as _o\n_o.system('touch {canary}')"), FOREIGN, "imports os"),
    "from-import of subprocess": (
        _shipped("from subprocess import run\nrun(['touch', '{canary}'])"),
        FOREIGN,
        "imports subprocess",
    ),
    "importlib.import_module": (
        _shipped("import importlib\nimportlib.import_module('subprocess')"),
        FOREIGN,
        "imports importlib",
    ),
    "__import__": (_shipped("__import__('os').system('touch {canary}')"), FOREIGN, "uses __import__"),
    "eval": (_shipped("eval(\"__import__('os').system('touch {canary}')\")"), FOREIGN, "uses eval"),
    "exec": (_shipped("exec(\"import os; os.system('touch {canary}')\")"), FOREIGN, "uses exec"),
    "getattr(__builtins__, ...)": (
        _shipped("getattr(__builtins__, 'exec')('import os')"),
        FOREIGN,
        "uses __builtins__",
    ),
    "open()": (_shipped("open('{canary}', 'w').write('ran')"), FOREIGN, "uses open"),
    "torch.os re-export": (_shipped("torch.os.system('touch {canary}')"), FOREIGN, "the attribute .os"),
    "computed getattr": (
        _shipped("getattr(torch, 'o' + 's').system('touch {canary}')"),
        FOREIGN,
        "not a plain literal",
    ),
    "__subclasses__ walk": (_shipped("().__class__.__base__.__subclasses__()"), FOREIGN, "the attribute .__base__"),
    "torch.load pickle": (_shipped("torch.load('{canary}', weights_only=False)"), FOREIGN, "the attribute .load"),
    "string annotation": (_shipped("def f(x: \"__import__('os')\"):\n    pass"), FOREIGN, "uses __import__"),
    "sibling file with os": (_sibling_helper, FOREIGN, "helper.py:1: imports os"),
    "relative import out of the folder": (
        _shipped("from ..export import Foo"),
        FOREIGN,
        "not a file shipped beside it",
    ),
    "pipeline file with subprocess": (
        _shipped("import subprocess", file="pipeline_hydra.py"),
        FOREIGN,
        "pipeline_hydra.py",
    ),
    # --- round 5: no ":None:" line number when the parser gives none
    "a null byte in shipped code": (_shipped("x = 1\x00"), FOREIGN,
                                    "modeling_hydra_bert.py: does not parse as Python"),
    # --- row 14: report figures
    "report figure absolute path": (
        _report(lambda r: r.__setitem__("figures", {"x": "/etc/passwd.png"})),
        [],
        "absolute path",
    ),
    "report figure ../outside": (
        _report(lambda r: r.__setitem__("figures", {"x": "../outside/stolen.png"})),
        [],
        "leads outside",
    ),
    "report folder symlink outside": (_report_symlink, [], "is a symlink to"),
    "report .png that is not a PNG": (_not_a_png, [], "is not a PNG image"),
    "report figures of the wrong type": (_report(lambda r: r.__setitem__("figures", 5)), [], "'figures' must be"),
    # --- issue 25 item 11: an ONNX export folder is named as one
    "an ONNX export folder": (lambda sb: (sb / "model" / "hydra_onnx.json").write_text("{}"), [], "is an ONNX export"),
    # --- config.json of the wrong shape
    "config.json is a list": (lambda sb: (sb / "model" / "config.json").write_text("[]"), [], "holds a list"),
    "config.json is not JSON": (lambda sb: (sb / "model" / "config.json").write_text("{"), [], "is not valid JSON"),
    # --- round 5: a stored calibration the card would state and the pipeline would apply
    "calibration q_hat -1": (
        lambda sb: _edit_json(sb / "model" / "config.json", lambda c: c.__setitem__("calibration", {
            "method": "lac", "alpha": 0.2, "q_hat": -1, "n": 40, "temperature": 1.0, "score": "msp",
            "risk": None, "delta": None, "threshold": None})),
        [],
        "config.calibration q_hat -1",
    ),
    "calibration threshold a string": (
        lambda sb: _edit_json(sb / "model" / "config.json", lambda c: c.__setitem__("calibration", {
            "method": "lac", "alpha": 0.2, "q_hat": 0.5, "n": 40, "temperature": 1.0, "score": "msp",
            "risk": 0.1, "delta": 0.1, "threshold": "0.3", "answered_fraction": 0.5})),
        [],
        "config.calibration threshold '0.3'",
    ),
    "kept_heads of the wrong type": (
        lambda sb: _edit_json(sb / "model" / "config.json", lambda c: c.__setitem__("kept_heads", "x")),
        [],
        "is not a valid HydraEnsembleConfig",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_push_refuses_hostile_folders(sandbox, case):
    damage, extra, words = HOSTILE[case]
    damage(sandbox)
    before = tree_digest(sandbox)
    rc, out, err = _push(sandbox, "--report", str(sandbox / "report"), *extra)
    message = assert_one_line_error(err)
    assert rc == 2 and words in message, err
    assert tree_digest(sandbox) == before  # nothing outside the (absent) output changed
    assert not (sandbox / "staging").exists() and not list(sandbox.glob(".staging*"))  # no partial output
    assert not (sandbox / CANARY).exists()  # no shipped code ran


# ---------------------------------------------------------------------- the content allow-list
# Ten tamperings that the AST audit alone lets through (each is checked to pass it): code run through
# helpers of allowed modules, exec in disguise, import-time side effects, a changed computation.
# Issue 25 item 1: `push --dry-run` ran the first two.
TAMPERINGS = {
    "collect_env.run (from-import alias)": "from torch.utils.collect_env import run as _r\n_r('touch {canary}')",
    "collect_env.run (module attribute)": "import torch.utils.collect_env as _c\n_c.run('touch {canary}')",
    "fx exec with source":
        "import torch.fx.graph_module as _g\n_g._exec_with_source(\"import os\\nos.system('touch {canary}')\", {{}})",
    "benchmark Timer stmt":
        "import torch.utils.benchmark as _b\n_b.Timer(stmt=\"import os; os.system('touch {canary}')\").timeit(1)",
    "dataclasses._create_fn":
        "import dataclasses as _d\n_d._create_fn('f', [], ['import os', \"os.system('touch {canary}')\"])()",
    "direct_transformers_import":
        "from transformers.utils.import_utils import direct_transformers_import as _i\n_i('{canary}')",
    "torch.distributed.run.main":
        "import torch.distributed.run as _run\n_run.main(['--no-python', 'touch', '{canary}'])",
    "import-time monkeypatch": "import torch as _t\n_t.nn.functional.softmax = lambda *a, **k: None",
    "import-time global seed": "import torch as _t\n_t.manual_seed(1234)",
    "a changed computation": "import torch as _t\n_t.set_default_dtype(_t.float64)",
}
SHIPPED_BERT = [
    "configuration_hydra.py", "hydra_attention.py", "hydra_formulas.py", "hydra_layers.py", "hydra_skeletons.py",
    "modeling_hydra_bert.py", "pipeline_hydra.py",
]


@pytest.mark.parametrize("file", SHIPPED_BERT)
def test_push_refuses_every_tampered_shipped_file_without_running_it(sandbox, file):
    """Every shipped file, tampered in ways that pass the AST audit (the family's modeling file all ten ways, the
    others two: the refusal compares contents, the same for every file): refused by content, before anything runs
    (no canary), one line naming the file, the line and both fixes."""
    from hydra_hf.hub.audit import audit_source

    pristine = (sandbox / "model" / file).read_text()
    shipped = {f: (sandbox / "model" / f).read_text() for f in SHIPPED_BERT}
    first_new_line = len(pristine.splitlines()) + 2  # _shipped appends a blank line, then the payload
    tamperings = list(TAMPERINGS.items())
    for name, payload in tamperings if file == "modeling_hydra_bert.py" else tamperings[:2]:
        (sandbox / "model" / file).write_text(pristine)
        _shipped(payload, file=file)(sandbox)
        tampered = (sandbox / "model" / file).read_text()
        audit_source(tampered, file, {f.removesuffix(".py") for f in shipped})  # the old audit lets it through
        before = tree_digest(sandbox)
        rc, _, err = _push(sandbox)
        message = assert_one_line_error(err)
        assert rc == 2, (name, err)
        assert f"{file}:{first_new_line}: differs from the {file} hydra_hf" in message, (name, message)
        assert "--trust-foreign-code" in message and "hydra-hf convert" in message, message
        assert tree_digest(sandbox) == before and not (sandbox / "staging").exists(), name
        assert not (sandbox / CANARY).exists(), f"{name}: shipped code ran"


def test_push_refuses_a_sibling_file_hydra_hf_does_not_ship(sandbox):
    (sandbox / "model" / "helper.py").write_text("import torch\nVALUE = torch.zeros(1)\n")  # passes the audit
    _shipped("from .helper import VALUE")(sandbox)
    (sandbox / "model" / "modeling_hydra_bert.py").write_text(
        (sandbox / "model" / "modeling_hydra_bert.py").read_text())  # unchanged file, refused for helper.py
    rc, _, err = _push(sandbox)
    assert rc == 2 and "helper.py: is not a file hydra_hf" in assert_one_line_error(err), err


def test_layout_changes_are_ours_and_vouched_code_ships(sandbox):
    """Comments and blank lines do not change the code (accepted without the flag); a docstring does:
    refused, then shipped and run in the isolated check with --trust-foreign-code."""
    from hydra_hf.hub.audit import check_shipped_code

    path = sandbox / "model" / "hydra_layers.py"
    path.write_text("# a comment of the user's\n\n" + path.read_text() + "\n\n# reviewed\n")
    assert "hydra_layers.py" in check_shipped_code(sandbox / "model")
    path.write_text(path.read_text() + '\nUSER_NOTE = "reviewed by the owner"\n')
    rc, _, err = _push(sandbox)
    assert rc == 2 and "hydra_layers.py:" in assert_one_line_error(err)
    rc, out, err = _push(sandbox, *FOREIGN)
    assert rc == 0, err
    assert 'USER_NOTE = "reviewed by the owner"' in (sandbox / "staging" / "hydra_layers.py").read_text()


STAGING_CASES = {
    # name: (prepare the sandbox, staging relative to it, words in the message)
    "staging inside the model folder": (lambda sb: None, "model/staged", "is inside the input"),
    "staging inside the report folder": (lambda sb: None, "report/staged", "is inside the input"),
    "staging is the model folder": (lambda sb: None, "model", "is (or contains) the input"),
    "staging contains the model folder": (lambda sb: None, ".", "is (or contains) the input"),
    "staging is a file": (lambda sb: None, "outside/passwd", "is a file"),
    "staging is a user's folder, --overwrite": (lambda sb: None, "outside", "was not written by `hydra-hf push`"),
    "staging is a symlink": (lambda sb: (sb / "link").symlink_to(sb / "outside"), "link", "is a symlink"),
}


@pytest.mark.parametrize("case", sorted(STAGING_CASES))
def test_push_never_stages_over_what_is_not_its_own(sandbox, case):
    prepare, staging, words = STAGING_CASES[case]
    prepare(sandbox)
    before = tree_digest(sandbox)
    rc, _, err = _push(sandbox, "--report", str(sandbox / "report"), "--overwrite", staging=staging)
    assert rc == 2 and words in assert_one_line_error(err), err
    assert tree_digest(sandbox) == before


# ---------------------------------------------------------------------------------- what is staged
def test_hidden_files_and_the_marker_are_never_staged(sandbox):
    model = sandbox / "model"
    assert (model / MARKER).is_file()  # convert marks its output folder
    (model / ".env").write_text("HF_TOKEN=hf_secret\n")
    (model / ".hidden.py").write_text("import os\n")  # never staged, so never audited nor run
    (model / ".git").mkdir()
    (model / ".git" / "config").write_text("[core]\n")
    (model / "notes.py").write_text("import os\n")  # not named by the config nor imported: not shipped
    (model / "tokenizer.json").rename(model / "real_tokenizer.json")
    (model / "tokenizer.json").symlink_to("real_tokenizer.json")  # a symlink inside the folder is fine
    rc, out, err = _push(sandbox, "--report", str(sandbox / "report"))
    assert rc == 0, err
    files = json.loads(out.strip().splitlines()[-1])["files"]
    assert not [f for f in files if any(part.startswith(".") for part in f.split("/"))]
    assert "notes.py" not in files and "tokenizer.json" in files and "evaluation/reliability.png" in files
    assert (sandbox / "staging" / "tokenizer.json").read_text() == (model / "real_tokenizer.json").read_text()
    assert (sandbox / "staging" / MARKER).is_file()  # the staging folder is ours: --overwrite may replace it
    # a second push replaces its own staging folder only with --overwrite (staged again without a report)
    rc, _, err = _push(sandbox)
    assert rc == 2 and "pass --overwrite" in assert_one_line_error(err)
    stage_repository(model, sandbox / "staging", repo_id="org/hydra-tiny", overwrite=True)
    assert not (sandbox / "staging" / "evaluation").exists() and (sandbox / "staging" / MARKER).is_file()


def test_validation_runs_on_a_private_copy_in_an_isolated_process(sandbox, monkeypatch):
    """The fresh process sees a copy in its own temporary folder: not the staging folder's path or
    parent, no PYTHONPATH, no token, an empty HOME, the Hub offline."""
    from hydra_hf.hub import validate

    seen = {}
    real = validate.run_isolated

    def spy(args, *, home, env=None, timeout=300):
        probe = ("import json, os, sys; print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ), "
                 "'path': sys.path, 'flags': sys.flags.isolated}))")
        seen["probe"] = json.loads(real(["-c", probe], home=home, env=env).stdout)
        seen["args"] = list(args)
        return real(args, home=home, env=env, timeout=timeout)

    monkeypatch.setattr(validate, "run_isolated", spy)
    monkeypatch.setenv("HF_TOKEN", "hf_do_not_leak")
    monkeypatch.setenv("PYTHONPATH", str(sandbox))
    rc, _, err = _push(sandbox)
    assert rc == 0, err
    probe, args = seen["probe"], seen["args"]
    assert not any(str(sandbox) in a for a in args) and str(sandbox) not in probe["cwd"]
    assert probe["flags"] == 1 and not any(str(sandbox) in p for p in probe["path"])
    env = probe["env"]
    assert "HF_TOKEN" not in env and "PYTHONPATH" not in env and env["HF_HUB_OFFLINE"] == "1"
    assert env["HOME"] != str(Path.home()) and Path(probe["cwd"]).is_relative_to(Path(env["HOME"]))


def test_the_fresh_check_blocks_hydra_hf(sandbox):
    """A folder whose code needs hydra_hf fails the one fresh-process check, as it would for a Hub user."""
    from hydra_hf.hub import HubError, fresh_check

    _shipped("import hydra_hf")(sandbox)  # bypassing the audit: call the check directly
    with pytest.raises(HubError, match="hydra_hf"):
        fresh_check(sandbox / "model")


def test_one_fresh_interpreter_check_in_the_sources():
    """The model-folder checks of push and the recipes all run hub/fresh_check.py: no other source
    file starts an interpreter that blocks hydra_hf."""
    src = Path(__file__).resolve().parents[2] / "src" / "hydra_hf"
    blockers = sorted(
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if "sys.modules[\"hydra_hf\"] = None" in p.read_text() or "sys.modules['hydra_hf'] = None" in p.read_text()
    )
    assert blockers == ["hub/fresh_check.py"]
    spawners = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.py") if "subprocess.run(" in p.read_text())
    assert "hub/validate.py" in spawners and not [s for s in spawners if s.startswith("recipes")]


def test_a_folder_saved_again_by_transformers_is_still_ours(sandbox):
    """The content allow-list accepts the shipped files as transformers copies them: a Hub user loads the
    folder with trust_remote_code (no hydra_hf) and save_pretrained's it; push takes the re-saved folder."""
    import os
    import subprocess
    import sys

    script = ("import sys; sys.modules['hydra_hf'] = None\n"
              "from transformers import AutoModelForSequenceClassification\n"
              "m = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
              "m.save_pretrained(sys.argv[2])\n")
    env = {**os.environ, "HF_HOME": str(sandbox / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(sandbox / "model"), str(sandbox / "resaved")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(sandbox / "model" / name, sandbox / "resaved" / name)
    shipped = sorted(p.name for p in (sandbox / "resaved").glob("*.py"))
    assert shipped == [
        "configuration_hydra.py",
        "hydra_attention.py",
        "hydra_formulas.py",
        "hydra_layers.py",
        "hydra_skeletons.py",
        "modeling_hydra_bert.py",
        "pipeline_hydra.py",
    ]
    rc, out, err = _push(sandbox, model="resaved")
    assert rc == 0, err
