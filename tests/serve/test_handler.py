"""The shipped Inference Endpoints handler (handler.py) of every folder kind, in-process as the toolkit's docs test
it: the task specifications' shapes, the pipelines' numbers from one padded forward pass, calibrated decisions,
bad requests as one line, a hostile folder refused at start; staging, the audit and the stock task-name warning."""

from __future__ import annotations

import base64
import io
import json
import shutil

import pytest
import torch
from _tiny_decoders import save_llama
from _tiny_decoders import write_masks as write_decoder_masks
from _tiny_models import tiny_hf_clip
from conftest import run_fresh_python, tiny_bert_config, write_tiny_tokenizer
from PIL import Image
from test_modeling_vit import UNEQUAL, hf_vit_dir  # noqa: F401  (hf_vit_dir: fixture)
from transformers import AutoTokenizer, BertForSequenceClassification, CLIPImageProcessor, pipeline

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import main as cli_main
from hydra_hf.errors import HydraInputError, HydraUnsafeError
from hydra_hf.hub.audit import audit_source
from hydra_hf.hub.staging import stage_into
from hydra_hf.masks import HeadMasks, load_masks
from hydra_hf.saving import HANDLER_FILE, MODELING_DIR
from hydra_hf.workflows.serve import ServeSpec, build_handler, handler_module, stream_tokens

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
TEXTS = ["the movie was very good", "a boring plot and awful actor", "i was not fun", "great fun", "bad"]
# a calibration as `hydra-hf calibrate` stores it (LAC sets, abstention on 1 - max p)
CALIBRATION = {"method": "lac", "q_hat": 0.62, "alpha": 0.1, "n": 200, "score": "msp", "threshold": None,
               "risk": 0.05, "delta": 0.1}


def _text_hydra(root):
    torch.manual_seed(0)
    base = BertForSequenceClassification(tiny_bert_config(
        id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})).eval()
    base.save_pretrained(root / "tiny")
    write_tiny_tokenizer(root / "tiny")
    convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / "tiny", output_dir=root / "hydra")
    return root / "hydra"


def _with_calibration(folder, out, calibration):
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    config["calibration"] = calibration
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    return _text_hydra(tmp_path_factory.mktemp("handler"))


def _handler(folder, **kwargs):
    """The folder's own handler.py, loaded by path (as Inference Endpoints loads it)."""
    return handler_module(folder).EndpointHandler(str(folder), **kwargs)


def _close(answer, expected):
    """One input's answer (elements, best first) against the pipeline's result dict for it."""
    assert [e["label"] for e in answer] == [s["label"] for s in expected["scores"]]
    for element in answer:
        assert element["score"] == pytest.approx(
            next(s["score"] for s in expected["scores"] if s["label"] == element["label"]), abs=1e-6)
        assert element["member_scores"] == pytest.approx(
            [m[element["label"]] for m in expected["member_scores"]], abs=1e-6)
        for name, value in expected["uncertainty"].items():
            assert element["uncertainty"][name] == pytest.approx(value, abs=1e-6)
        assert element["member_labels"] == expected["member_labels"]


def test_text_handler_answers_as_the_pipeline_in_one_forward(text_folder):
    """Per text a list of {label, score} sorted by score with the members' scores and the uncertainty (the spec's
    element plus extra fields), equal to the shipped pipeline's one-text results, from ONE forward pass for the
    whole list (the pipeline alone runs one per text)."""
    assert (text_folder / HANDLER_FILE).read_bytes() == (MODELING_DIR / HANDLER_FILE).read_bytes()
    handler = _handler(text_folder)
    pipe = pipeline("hydra-text-classification", model=str(text_folder), trust_remote_code=True)
    calls = []
    hook = handler.pipe.model.register_forward_hook(lambda *_: calls.append(1))
    answer = handler({"inputs": TEXTS})
    hook.remove()
    assert len(calls) == 1 and len(answer) == len(TEXTS)
    for text, per_text in zip(TEXTS, answer):
        assert [e["score"] for e in per_text] == sorted((e["score"] for e in per_text), reverse=True)
        _close(per_text, pipe(text))
    pipe_calls = []
    hook = pipe.model.register_forward_hook(lambda *_: pipe_calls.append(1))
    pipe(TEXTS)
    hook.remove()
    assert len(pipe_calls) == len(TEXTS)  # why the handler batches: the pipeline runs one forward per text
    single = handler({"inputs": TEXTS[0]})  # one text: a list holding its one list (the Inference API's shape)
    assert len(single) == 1 and [e["label"] for e in single[0]] == [e["label"] for e in answer[0]]
    top = handler({"inputs": TEXTS[:2], "parameters": {"top_k": 1, "function_to_apply": "softmax"}})
    assert [len(per_text) for per_text in top] == [1, 1] and top[0][0]["label"] == answer[0][0]["label"]
    pair = handler({"inputs": {"text": "good", "text_pair": "bad plot"}})[0]
    assert pair[0]["label"] == pipe({"text": "good", "text_pair": "bad plot"})["label"]
    # several requests (a server's batch): one forward per group of equal parameters, each its own answer
    requests = [handler.parse({"inputs": TEXTS[:2]}), handler.parse({"inputs": TEXTS[2]}),
                handler.parse({"inputs": TEXTS[3:], "parameters": {"top_k": 2}})]
    calls.clear()
    hook = handler.pipe.model.register_forward_hook(lambda *_: calls.append(1))
    answers = handler.predict(requests)
    hook.remove()
    assert len(calls) == 2 and [len(a) for a in answers] == [2, 1, 2] and len(answers[2][0]) == 2
    _close(answers[1][0], pipe(TEXTS[2]))


def test_calibrated_folder_adds_the_prediction_set_and_abstain(text_folder, tmp_path):
    unset = _with_calibration(text_folder, tmp_path / "unset", {**CALIBRATION, "threshold": None})
    values = sorted(_handler(unset)({"inputs": TEXTS})[i][0]["abstain_score"]["value"] for i in range(len(TEXTS)))
    # a threshold between the texts' scores, so that it decides something
    threshold = (values[1] + values[2]) / 2
    folder = _with_calibration(text_folder, tmp_path / "cal", {**CALIBRATION, "threshold": threshold})
    handler = _handler(folder)
    pipe = pipeline("hydra-text-classification", model=str(folder), trust_remote_code=True)
    answer = handler({"inputs": TEXTS})
    decided = [pipe(text) for text in TEXTS]
    assert [a[0]["prediction_set"] for a in answer] == [d["prediction_set"] for d in decided]
    assert [a[0]["abstain"] for a in answer] == [d["abstain"] for d in decided]
    assert {d["abstain"] for d in decided} == {True, False}  # the threshold really decides something here
    assert all(element["abstain"] == per_text[0]["abstain"] for per_text in answer for element in per_text)
    assert handler.describe()["calibrated"] is True


@pytest.mark.parametrize("data, words", [
    ("not an object", "must be a JSON object"),
    ({"input": "x"}, "unknown request field(s) ['input']"),
    ({"parameters": {}}, "has no 'inputs'"),
    ({"inputs": 3}, "must be a text (a JSON string), got int 3"),
    ({"inputs": ["ok", {"txt": "x"}]}, "inputs[1] must be a text or {'text', 'text_pair'}"),
    ({"inputs": []}, "'inputs' is an empty list"),
    ({"inputs": ["a"] * 10_000}, "holds 10000 inputs, more than the 256"),
    ({"inputs": "a" * 1_000_000}, "holds 1000000 characters, more than 100000"),
    ({"inputs": "a", "parameters": {"temperature": 0.5}}, "unknown parameter(s) ['temperature']"),
    ({"inputs": "a", "parameters": "top_k=2"}, "'parameters' must be an object"),
    ({"inputs": "a", "parameters": {"top_k": 0}}, "top_k must be a positive integer, got 0"),
    ({"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}}, "function_to_apply='sigmoid'"),
    ({"inputs": "a", "parameters": {"uncertainty_threshold": {"metric": "x", "value": 1}}}, "metric 'x' is unknown"),
    ({"inputs": "a", "stream": True}, "'stream' is for text generation"),
])
def test_bad_requests_are_one_line_errors(text_folder, data, words):
    handler = _handler(text_folder)
    module = handler_module(text_folder)
    with pytest.raises(module.RequestError) as info:
        handler(data)
    message = str(info.value)
    assert words in message and "\n" not in message
    assert handler({"inputs": "good"})[0][0]["label"] in {"neg", "neu", "pos"}  # the next request is answered


@pytest.mark.parametrize("calibration, words", [
    ({**CALIBRATION, "q_hat": "NaN"}, "q_hat 'NaN' must be a finite number"),
    ({**CALIBRATION, "threshold": 0.5, "score": "rm -rf"}, "score 'rm -rf' must be one of"),
    ({**CALIBRATION, "method": "__import__('os')"}, "method \"__import__('os')\" must be one of"),
])
def test_a_hostile_calibration_never_starts(text_folder, tmp_path, capsys, calibration, words):
    """Fitted values that cannot answer are refused when the handler starts (one line), never per request."""
    folder = _with_calibration(text_folder, tmp_path / "hostile", calibration)
    with pytest.raises(ValueError, match="calibra|score"):
        _handler(folder)
    with pytest.raises(HydraInputError) as info:
        build_handler(ServeSpec(str(folder)))
    assert words in str(info.value) and "\n" not in str(info.value)
    assert cli_main(["serve", str(folder), "--port", "8999"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and err[0].startswith("hydra-hf serve: error:") and words in err[0]  # no traceback


def _png(seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    buffer = io.BytesIO()
    Image.fromarray((torch.rand(20, 24, 3, generator=g) * 255).to(torch.uint8).numpy()).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_image_and_zero_shot_handlers(hf_vit_dir, tmp_path):  # noqa: F811
    """An image classifier and a zero-shot CLIP folder answer base64 images (and PIL images, what Inference
    Endpoints passes for an image body) as their pipelines do; URLs and file paths are never read."""
    vit = tmp_path / "vit-hydra"
    convert_checkpoint(HeadMasks(kept_heads=UNEQUAL, num_heads=4), base=hf_vit_dir, output_dir=vit)
    handler = _handler(vit)
    pipe = pipeline("hydra-image-classification", model=str(vit), trust_remote_code=True)
    images = [_png(1), _png(2)]
    answer = handler({"inputs": images})
    for image, per_image in zip(images, answer):
        _close(per_image, pipe(Image.open(io.BytesIO(base64.b64decode(image)))))
    assert handler({"inputs": Image.open(io.BytesIO(base64.b64decode(images[0])))})[0][0] == answer[0][0]
    module = handler_module(vit)
    for bad, words in (("https://example.com/cat.png", "is a URL"), (str(hf_vit_dir / "config.json"), "not an image"),
                       (7, "not an image")):
        with pytest.raises(module.RequestError, match=words):
            handler({"inputs": bad})

    heads = [[[0, 1], [2]], [[1, 2, 3], [0]], [[3], [1, 2]]]
    base = tmp_path / "clip"
    tiny_hf_clip().save_pretrained(base)
    write_tiny_tokenizer(base, vocab_size=40)
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(base)
    clip = tmp_path / "clip-hydra"
    towers = {"vision": HeadMasks(kept_heads=heads, num_heads=4), "text": HeadMasks(kept_heads=heads, num_heads=4)}
    convert_checkpoint(HeadMasks(towers=towers), base=base, output_dir=clip)
    handler = _handler(clip)
    pipe = pipeline("hydra-zero-shot-image-classification", model=str(clip), trust_remote_code=True)
    labels = ["cat", "dog", "bird"]
    answer = handler({"inputs": images, "parameters": {"candidate_labels": labels}})
    for image, per_image in zip(images, answer):
        _close(per_image, pipe(Image.open(io.BytesIO(base64.b64decode(image))), candidate_labels=labels))
    with pytest.raises(handler_module(clip).RequestError, match="candidate_labels must be a list of at least 2"):
        handler({"inputs": images[0]})


@pytest.fixture(scope="module")
def decoder_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder")
    save_llama(root / "llama", head="ForCausalLM")
    masks = load_masks(write_decoder_masks(root / "masks.json"))
    convert_checkpoint(masks, base=root / "llama", output_dir=root / "hydra")
    return root / "hydra"


def test_generation_handler_and_token_stream(decoder_folder):
    """A causal LM answers generated text with every token's uncertainty (prompts batched in one generate(),
    left-padded: the same tokens as one by one), and the server's token stream decodes the same tokens with the
    same per-token entropy and mutual information."""
    handler = _handler(decoder_folder)
    parameters = {"max_new_tokens": 5, "do_sample": False}
    prompts = ["the movie was", "a plot", "it was good fun and"]
    batched = handler({"inputs": prompts, "parameters": parameters})
    alone = [handler({"inputs": p, "parameters": parameters}) for p in prompts]
    assert [len(per_prompt) for per_prompt in batched] == [1, 1, 1]
    for per_prompt, one in zip(batched, alone):
        record = per_prompt[0]
        assert {"generated_text", "token_entropy", "token_mutual_information", "member_top_tokens",
                "sequence_mutual_information"} <= set(record)
        assert record["generated_token_ids"] == one[0]["generated_token_ids"]
        assert record["token_entropy"] == pytest.approx(one[0]["token_entropy"], abs=1e-5)
    events = list(stream_tokens(handler.pipe.model, handler.pipe.tokenizer, prompts[0], parameters))
    record = alone[0][0]
    assert [e["token"]["id"] for e in events] == record["generated_token_ids"]
    assert [e["token"]["entropy"] for e in events] == pytest.approx(record["token_entropy"], abs=1e-5)
    assert [e["token"]["mutual_information"] for e in events] == pytest.approx(
        record["token_mutual_information"], abs=1e-5)
    assert [e["token"]["member_top_tokens"] for e in events] == record["member_top_tokens"]
    assert events[-1]["details"]["generated_tokens"] == len(events) and events[-1]["generated_text"] is not None
    assert all(e["generated_text"] is None for e in events[:-1])
    module = handler_module(decoder_folder)
    with pytest.raises(module.RequestError, match="max_new_tokens must be an integer from 1 to 1024"):
        handler({"inputs": "a", "parameters": {"max_new_tokens": 10**6}})
    with pytest.raises(module.RequestError, match="more than the model's 64 positions"):
        handler({"inputs": "the " * 70, "parameters": {"max_new_tokens": 4}})


def test_the_onnx_backend_serves_an_export(text_folder, tmp_path):
    """`--backend onnx`: an export folder of `hydra-hf export` behind the same handler, equal to the PyTorch
    folder's answers within the export's own check (1e-4); each backend refuses the other's folder in one line."""
    pytest.importorskip("onnxruntime", reason="the onnx extra")
    from hydra_hf.onnx.export import export_onnx

    export = export_onnx(text_folder, tmp_path / "onnx")
    onnx_answer = build_handler(ServeSpec(str(export), backend="onnx"))({"inputs": TEXTS})
    torch_answer = build_handler(ServeSpec(str(text_folder)))({"inputs": TEXTS})
    for got, expected in zip(onnx_answer, torch_answer):
        assert [e["label"] for e in got] == [e["label"] for e in expected]
        assert [e["score"] for e in got] == pytest.approx([e["score"] for e in expected], abs=1e-4)
        assert got[0]["uncertainty"] == pytest.approx(expected[0]["uncertainty"], abs=1e-4)
    with pytest.raises(HydraInputError, match="is an ONNX export; serve it with --backend onnx"):
        build_handler(ServeSpec(str(export)))
    with pytest.raises(HydraInputError, match="is not an ONNX export; export it first"):
        build_handler(ServeSpec(str(text_folder), backend="onnx"))


def test_a_stock_classifier_is_served_as_one_member(text_folder):
    """The baseline behind the same server: a stock classifier folder, answered in the same shape (one member,
    mutual information 0), its scores the model's softmax."""
    stock = text_folder.parent / "tiny"
    answer = build_handler(ServeSpec(str(stock)))({"inputs": TEXTS[:2]})
    model = BertForSequenceClassification.from_pretrained(stock).eval()
    tokenizer = AutoTokenizer.from_pretrained(stock)
    with torch.no_grad():
        probs = model(**tokenizer(TEXTS[:2], padding=True, return_tensors="pt")).logits.softmax(-1)
    for row, per_text in zip(probs, answer):
        assert per_text[0]["score"] == pytest.approx(float(row.max()), abs=1e-6)
        assert len(per_text[0]["member_scores"]) == 1 and per_text[0]["uncertainty"]["mutual_information"] == 0


def test_push_stages_the_handler_and_refuses_a_foreign_one(text_folder, tmp_path):
    """A folder written before folders shipped handler.py gets hydra_hf's when it is staged; a changed one is
    refused (foreign code) with its first differing line."""
    old = tmp_path / "old"
    shutil.copytree(text_folder, old)
    (old / HANDLER_FILE).unlink()
    staged = tmp_path / "staged"
    staged.mkdir()
    stage_into(old, staged, repo_id="org/hydra-old")
    assert (staged / HANDLER_FILE).read_bytes() == (MODELING_DIR / HANDLER_FILE).read_bytes()
    (old / HANDLER_FILE).write_text((MODELING_DIR / HANDLER_FILE).read_text() + "\nEXTRA = 1\n")
    again = tmp_path / "staged-again"
    again.mkdir()
    with pytest.raises(HydraUnsafeError, match=r"handler\.py:\d+: differs from the handler\.py hydra_hf"):
        stage_into(old, again, repo_id="org/hydra-old")


def test_only_the_handler_may_pass_trust_remote_code():
    loads = "from transformers import pipeline\npipe = pipeline(model=path, trust_remote_code=True)\n"
    audit_source(loads, "handler.py", set())
    for source, name in ((loads, "modeling_hydra_bert.py"),
                         (loads.replace("=True", "=flag"), "handler.py"),
                         (loads.replace("=True", "=not False"), "handler.py")):
        with pytest.raises(HydraUnsafeError, match="passes trust_remote_code"):
            audit_source(source, name, set())


def test_the_stock_task_name_warns_once(text_folder):
    """`pipeline("text-classification", model=hydra_folder, trust_remote_code=True)` builds transformers' stock
    pipeline (no uncertainty): the folder's config logs one warning naming the Hydra task; the Hydra task and no
    task log none (as a Hub user without hydra_hf loads it)."""
    code = f"""
        import json, logging, sys
        from transformers import pipeline
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        logging.getLogger().addHandler(Keep())
        counts = {{}}
        for task in ("text-classification", "sentiment-analysis", "hydra-text-classification", None):
            records.clear()
            pipe = pipeline(task, model={str(text_folder)!r}, trust_remote_code=True)
            counts[str(task)] = [type(pipe).__name__, [r for r in records if "hydra-text-classification" in r]]
        print(json.dumps(counts))
    """
    counts = json.loads(run_fresh_python(code).splitlines()[-1])
    for task in ("text-classification", "sentiment-analysis"):
        name, warnings = counts[task]
        assert name == "TextClassificationPipeline" and len(warnings) == 1 and "\n" not in warnings[0]
        assert "without its uncertainty" in warnings[0]
    for task in ("hydra-text-classification", "None"):
        assert counts[task] == ["HydraTextClassificationPipeline", []]
