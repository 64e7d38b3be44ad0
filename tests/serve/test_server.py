"""`hydra-hf serve` behind a real Ray Serve on loopback (one Ray for the module): the handler's JSON over HTTP,
InferenceClient's parsers, dynamic batching under 32 concurrent clients with every answer equal to a direct call,
bad requests, Prometheus metrics, a replica killed under load, a streamed decoder, and a graceful shutdown."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import pytest
import requests
import torch
from _tiny_decoders import save_llama
from _tiny_decoders import write_masks as write_decoder_masks
from conftest import free_port
from test_handler import CALIBRATION, _text_hydra, _with_calibration

from hydra_hf.assemble import convert_checkpoint
from hydra_hf.errors import HydraInputError, HydraTypeError
from hydra_hf.masks import load_masks
from hydra_hf.workflows.serve import ServeSpec, build_app, handler_module, serve, stream_tokens

ray = pytest.importorskip("ray", reason="the serve extra (pip install 'hydra-hf[serve]')")

WORDS = "the a movie film good bad great awful plot actor fun boring i it was is and not very".split()


def _texts(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(k),), generator=g))
            for k in torch.randint(1, 12, (n,), generator=g)]


@pytest.fixture(scope="module")
def cluster():
    """One Ray for the whole module: the classifier's 2 replicas and the decoder's 1 (one reserved CPU each)."""
    metrics_port = free_port()
    ray.init(num_cpus=3, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False,
             _metrics_export_port=metrics_port)
    yield metrics_port
    ray.shutdown()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    text = _text_hydra(root)
    calibrated = _with_calibration(text, root / "calibrated", {**CALIBRATION, "threshold": 0.5})
    save_llama(root / "llama", head="ForCausalLM")
    convert_checkpoint(load_masks(write_decoder_masks(root / "masks.json")), base=root / "llama",
                       output_dir=root / "decoder")
    return {"classifier": calibrated, "decoder": root / "decoder"}


@pytest.fixture(scope="module")
def classifier(cluster, folders):
    """The calibrated classifier on 2 replicas, batches of up to 8 inputs; its direct (in-process) handler."""
    spec = ServeSpec(str(folders["classifier"]), port=free_port(), replicas=2, max_batch_size=8, batch_wait_ms=20)
    handle = serve(spec, block=False)
    direct = handler_module(folders["classifier"]).EndpointHandler(str(folders["classifier"]))
    yield handle, direct
    handle.shutdown()


def _same(answer, expected, tol: float = 1e-6) -> bool:
    """Two answers of one input agree: labels in the same order, every number within ``tol``."""
    if len(answer) != len(expected):
        return False
    for a, e in zip(answer, expected):
        if a["label"] != e["label"] or abs(a["score"] - e["score"]) > tol or a["member_labels"] != e["member_labels"]:
            return False
        if any(abs(x - y) > tol for x, y in zip(a["member_scores"], e["member_scores"])):
            return False
        if any(abs(a["uncertainty"][k] - e["uncertainty"][k]) > tol for k in e["uncertainty"]):
            return False
        if a.get("prediction_set") != e.get("prediction_set") or a.get("abstain") != e.get("abstain"):
            return False
    return True


def test_build_app_takes_serve_run_arguments(folders):
    """`serve run hydra_hf.workflows.serve:build_app model=DIR replicas=2 ...` (and a KubeRay serveConfigV2) pass
    strings: they become ServeSpec's types; an unknown or malformed argument is one line."""
    from ray.serve import Application

    app = build_app({"model": str(folders["classifier"]), "replicas": "2", "max_batch_size": "16",
                     "batch_wait_ms": "2.5", "trust_foreign_code": "false"})
    assert isinstance(app, Application)
    with pytest.raises(HydraInputError, match="unexpected keyword argument 'replica'"):
        build_app({"model": str(folders["classifier"]), "replica": "2"})
    with pytest.raises(HydraTypeError, match="replicas must be an integer, got 'two'"):
        build_app({"model": str(folders["classifier"]), "replicas": "two"})
    for field, value, problem in (("name", "a b", "letters, digits"), ("route_prefix", "hydra", "must start with"),
                                  ("route_prefix", "/hydra/", "not end with one")):
        with pytest.raises(HydraInputError, match=f"{field}={value!r}.*{problem}"):
            build_app({"model": str(folders["classifier"]), field: value})
    spec = ServeSpec(str(folders["classifier"]), host="0.0.0.0", port=9, route_prefix="/hydra")
    assert spec.url == "http://127.0.0.1:9/hydra" and ServeSpec(str(folders["classifier"]), port=9).url.endswith(":9")


def test_health_and_inference_client(classifier, monkeypatch):
    """InferenceClient(base_url=...).text_classification parses the answer and keeps every extra field."""
    handle, direct = classifier
    health = requests.get(f"{handle.url}/health", timeout=30).json()
    assert health["task"] == "hydra-text-classification" and health["members"] == 3 and health["calibrated"]
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the client talks to loopback only
    client = InferenceClient(base_url=handle.url)
    for text in _texts(3, seed=1):
        out = client.text_classification(text)
        expected = direct({"inputs": text})[0]
        assert [e.label for e in out] == [e["label"] for e in expected]
        assert out[0].score == pytest.approx(expected[0]["score"], abs=1e-6)
        for name in ("uncertainty", "member_scores"):
            assert out[0][name] == pytest.approx(expected[0][name], abs=1e-6), name
        for name in ("member_labels", "prediction_set", "abstain"):
            assert out[0][name] == expected[0][name], name
        assert out[0]["abstain_score"]["value"] == pytest.approx(expected[0]["abstain_score"]["value"], abs=1e-6)
    top = client.text_classification("a great film", top_k=1)
    assert len(top) == 1


def test_32_concurrent_clients_get_their_own_answers(classifier):
    """32 clients at once, 4 requests each (1 to 3 texts): every answer equals a direct call of the folder
    (<= 1e-6), 0 errors, and the replicas really batched (fewer forward passes than requests)."""
    handle, direct = classifier
    before = _batched(handle)
    jobs = [_texts(1 + (i % 3), seed=100 + i) for i in range(128)]
    answers: dict[int, object] = {}

    def client(first: int) -> None:
        with requests.Session() as session:
            for j in range(first, len(jobs), 32):
                r = session.post(f"{handle.url}/predict", json={"inputs": jobs[j]}, timeout=120)
                answers[j] = r.json() if r.status_code == 200 else r.status_code

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == len(jobs) and not [a for a in answers.values() if isinstance(a, int)]
    wrong = [j for j, texts in enumerate(jobs)
             if not all(_same(a, e) for a, e in zip(answers[j], direct({"inputs": texts})))]
    assert wrong == []
    after = _batched(handle)
    batches, inputs = after[0] - before[0], after[1] - before[1]
    assert inputs == sum(len(j) for j in jobs) and batches < len(jobs)


def _replica_health(handle, rounds: int = 20) -> dict[int, dict]:
    """/health of every replica (by process id): up to ``rounds`` times 8 requests at once, so that the router
    spreads them, until every replica answered."""
    seen: dict[int, dict] = {}

    def ask() -> None:
        health = requests.get(f"{handle.url}/health", timeout=30).json()
        seen.setdefault(health["pid"], health)

    for _ in range(rounds):
        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(seen) >= handle.spec.replicas:
            break
    return seen


def _batched(handle) -> tuple[int, int]:
    """(batches, inputs) summed over the replicas."""
    seen = _replica_health(handle)
    assert len(seen) == handle.spec.replicas, seen
    return sum(h["batches"] for h in seen.values()), sum(h["inputs_answered"] for h in seen.values())


def test_bad_requests_get_4xx_and_the_next_request_is_answered(classifier):
    handle, direct = classifier
    url = f"{handle.url}/"
    cases = [
        (b"{not json", 400, "is not valid JSON"),
        (b"", 400, "the body is empty"),
        (b'{"parameters": {}}', 400, "has no 'inputs'"),
        (b'{"inputs": {"text": 3}}', 400, "must be a text"),
        (b'{"inputs": 5}', 400, "must be a text (a JSON string), got int 5"),
        (b'{"inputs": []}', 400, "empty list"),
        (json.dumps({"inputs": ["good"] * 10_000}).encode(), 400, "holds 10000 inputs"),
        (json.dumps({"inputs": "good " * 200_000}).encode(), 400, "characters, more than 100000"),
        (b'{"inputs": "good", "parameters": {"beam": 4}}', 400, "unknown parameter(s) ['beam']"),
        (b'{"inputs": "good", "parameters": {"top_k": "all"}}', 400, "top_k must be a positive integer"),
        (b"\xff\xfe not utf-8", 400, "not UTF-8"),
        (b"x" * (33 * 2**20), 413, "more than"),
    ]
    for body, status, words in cases:
        r = requests.post(url, data=body, headers={"content-type": "application/json"}, timeout=60)
        error = r.json()["error"]
        assert (r.status_code, words in error, "\n" in error) == (status, True, False), (body[:40], r.text)
        ok = requests.post(url, json={"inputs": "a good film"}, timeout=60)
        assert ok.status_code == 200 and _same(ok.json()[0], direct({"inputs": "a good film"})[0])
    image = requests.post(url, data=b"\x89PNG....", headers={"content-type": "image/png"}, timeout=60)
    assert image.status_code == 415 and "text-classification" in image.json()["error"]
    assert requests.get(f"{handle.url}/nowhere", timeout=30).status_code == 404
    assert requests.get(url, timeout=30).status_code == 405


def test_a_request_larger_than_a_batch_is_split(classifier):
    handle, direct = classifier
    texts = _texts(21, seed=7)  # batches hold 8 inputs
    r = requests.post(f"{handle.url}/predict", json={"inputs": texts, "parameters": {"top_k": 2}}, timeout=120)
    assert r.status_code == 200 and len(r.json()) == 21
    expected = direct({"inputs": texts, "parameters": {"top_k": 2}})
    assert all(_same(a, e) for a, e in zip(r.json(), expected))


def test_prometheus_metrics(classifier, cluster):
    """Ray's metrics port exports Ray Serve's request counter and the replicas' hydra_batch_inputs histogram."""
    handle, _ = classifier
    for _ in range(3):
        requests.post(f"{handle.url}/", json={"inputs": ["good", "bad"]}, timeout=60)
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        text = requests.get(f"http://127.0.0.1:{cluster}/metrics", timeout=10).text
        if "ray_hydra_batch_inputs_bucket" in text and "ray_serve_num_http_requests" in text:
            break
        time.sleep(2)
    assert "ray_hydra_batch_inputs_bucket" in text and "ray_serve_num_http_requests" in text


def test_a_replica_killed_under_load_is_replaced(classifier):
    """SIGKILL one of two replicas while 8 clients send requests (from 2 s before to 6 s after): the failed
    requests are counted (not answered wrongly: every 200 equals a direct call), and Ray Serve starts a
    replacement (waited for without the load, which would only slow its start on a small machine)."""
    handle, direct = classifier
    pids = set(_replica_health(handle))
    assert len(pids) == 2
    victim = min(pids)
    texts = _texts(2, seed=3)
    expected = direct({"inputs": texts})
    outcomes: list[object] = []
    stop = threading.Event()

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    r = session.post(f"{handle.url}/", json={"inputs": texts}, timeout=60)
                    outcomes.append("ok" if r.status_code == 200 and all(
                        _same(a, e) for a, e in zip(r.json(), expected)) else
                        ("wrong" if r.status_code == 200 else r.status_code))
                except requests.RequestException:
                    outcomes.append("connection")

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(2)
    os.kill(victim, signal.SIGKILL)
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 120
    replaced = False
    while time.monotonic() < deadline and not replaced:
        time.sleep(1)
        replaced = len(set(_replica_health(handle, rounds=2)) - pids) > 0
    counts = Counter(outcomes)
    assert replaced and counts["wrong"] == 0 and counts["ok"] > 0, counts
    failed = sum(n for k, n in counts.items() if k != "ok")
    assert failed < len(outcomes) / 2, counts  # the surviving replica kept answering


def test_a_decoder_streams_tokens_with_their_uncertainty(cluster, folders, classifier, monkeypatch):
    """A causal LM's server: JSON answers, and "stream": true as server-sent events that
    InferenceClient.text_generation(stream=True, details=True) reads, each token with its uncertainty, the same
    tokens as the direct stream; then a shutdown under load answers every request it accepted. The decoder is a
    second application beside the classifier, on the same Serve under its own route, and its shutdown leaves the
    classifier answering."""
    handle, _ = classifier
    spec = ServeSpec(str(folders["decoder"]), port=handle.spec.port, max_batch_size=4, name="decoder",
                     route_prefix="/decoder")
    decoder = serve(spec, block=False)
    assert decoder.url == f"{handle.url}/decoder"
    assert requests.get(f"{decoder.url}/health", timeout=30).json()["task"] == "hydra-text-generation"
    direct = handler_module(folders["decoder"]).EndpointHandler(str(folders["decoder"]))
    parameters = {"max_new_tokens": 6, "do_sample": False}
    r = requests.post(f"{decoder.url}/", json={"inputs": "the movie was", "parameters": parameters}, timeout=60)
    assert r.status_code == 200
    assert r.json()[0]["generated_token_ids"] == direct({"inputs": "the movie was", "parameters": parameters})[0][
        "generated_token_ids"]
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=decoder.url)  # held: the stream reads through the client's session
    events = list(client.text_generation("the movie was", max_new_tokens=6, stream=True, details=True))
    local = list(stream_tokens(direct.pipe.model, direct.pipe.tokenizer, "the movie was", parameters))
    assert [e.token.id for e in events] == [e["token"]["id"] for e in local]
    assert [e.token["mutual_information"] for e in events] == pytest.approx(
        [e["token"]["mutual_information"] for e in local], abs=1e-6)
    assert events[-1].generated_text == local[-1]["generated_text"]

    outcomes: list[tuple[float, object]] = []
    started = threading.Event()

    def client(i: int) -> None:
        for _ in range(6):
            sent = time.monotonic()
            started.set()
            try:
                r = requests.post(f"{decoder.url}/", json={"inputs": ["the plot", "a film"][i % 2],
                                                           "parameters": {"max_new_tokens": 8}}, timeout=120)
                outcomes.append((sent, r.status_code))
            except requests.RequestException as exc:
                outcomes.append((sent, type(exc).__name__))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.5)
    decoder.shutdown()
    for t in threads:
        t.join()
    codes = Counter(code for _, code in outcomes)
    # every request either answered (200) or refused cleanly once the application was gone (404), none cut off
    assert set(codes) <= {200, 404} and codes[200] > 0, codes
    assert requests.post(f"{handle.url}/predict", json={"inputs": "a good film"}, timeout=60).status_code == 200
