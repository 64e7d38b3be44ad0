"""``hydra-hf serve``: a model folder behind Ray Serve, answered by the folder's own ``handler.py``.

The handler (:mod:`hydra_hf.modeling.handler`, shipped in every folder: Inference Endpoints runs the same file)
parses a request and answers it in the task specification's shape, with the uncertainty. This module puts it
behind HTTP on Ray Serve:

- ``POST /`` and ``POST /predict``: the handler's JSON (``{"inputs": ..., "parameters": {...}}``), or an image's
  bytes (``Content-Type: image/...``) for an image classifier; ``GET /health``: what is served.
- **Dynamic batching**: concurrent requests are gathered (``@serve.batch``, up to ``max_batch_size`` inputs or
  ``batch_wait_ms``) and the inputs of a batch go through the model in ONE padded forward pass
  (:meth:`EndpointHandler.predict`); a request of more inputs than a batch is split. ``max_ongoing_requests`` is
  twice the batch size: Ray Serve's default (5) would cap every batch at 5 requests.
- **Streaming**: a causal LM answers ``"stream": true`` with server-sent events in the text-generation
  inference format (``InferenceClient.text_generation(..., stream=True)`` reads them), each token with its
  entropy, the members' mutual information and every member's top token.
- **Backends**: ``torch`` (the folder's PyTorch weights) or ``onnx`` (an export folder of ``hydra-hf export``,
  its int8 graph when it has one, on ONNX Runtime); a stock transformers text or image classifier is served too,
  as a one-member ensemble (the same answer shape, mutual information 0): a baseline behind the same server.
- **Bad requests** get status 400 (413: a body over :data:`MAX_BODY_BYTES`; 404 / 405: another path or method)
  with ``{"error": one line}``; the replica answers the next request. A folder that cannot answer (a hostile
  stored calibration, a foreign ``handler.py``) never starts: :func:`serve` raises one
  :class:`~hydra_hf.errors.HydraError` line before Ray starts.
- **Metrics**: Ray's Prometheus endpoint (``metrics_port``) with Ray Serve's request counters and latency
  histograms, plus ``hydra_batch_inputs`` (inputs per forward pass) and ``hydra_inputs`` (inputs answered).
- **Past one machine**: ``address`` joins a running Ray cluster (``ray start --head`` on one node, ``ray start
  --address HEAD:6379`` on the others; docs/serve.md has a KubeRay ``RayService``); replicas spread over it.

Ray is an optional extra (``pip install hydra-hf[serve]``), imported on first use.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import importlib.util
import io
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..errors import HydraError, HydraInputError, HydraTypeError, one_line
from ..hub.audit import FOREIGN_CODE_FLAG, check_packaged, is_packaged, read_python_source
from ..modeling import pipeline_hydra
from ..modeling.handler import MAX_INPUTS
from ..modeling.hydra_formulas import log_prob_uncertainty
from ..onnx.runtime import is_onnx_export
from ..onnx.runtime import pipeline as onnx_pipeline
from ..outputs import read_model_config
from ..saving import HANDLER_FILE, MODELING_DIR

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx")
APP_NAME = "hydra"
PREDICT_PATHS = ("/", "/predict")
MAX_BODY_BYTES = 32 * 2**20
SERVE_FIX = "install the serve extra: pip install 'hydra-hf[serve]' (Ray Serve)"
RAY_TOKEN_FILE = Path.home() / ".ray" / "auth_token"  # where `ray start --head` keeps the cluster's token


@dataclass
class ServeSpec:
    """What :func:`serve` serves and how.

    Attributes:
        model: a Hydra folder (``convert`` / ``finetune`` / ``calibrate``), an ONNX export folder (``backend="onnx"``)
            or a stock transformers text / image classifier folder.
        host, port: where the HTTP server listens (default loopback only: ``0.0.0.0`` opens it to the network).
        replicas: model replicas (each a process holding the model).
        max_batch_size: inputs per forward pass at most.
        batch_wait_ms: how long a batch waits for more requests after its first.
        backend: ``torch`` or ``onnx``.
        threads: torch (or ONNX Runtime) threads per replica, and the CPUs Ray reserves for it.
        max_inputs: inputs one request may hold.
        address: a running Ray cluster to join (``ray start --head`` prints it); None starts Ray on this machine.
        metrics_port: the port of Ray's Prometheus metrics (None: Ray picks one; ray.init logs it).
        trust_foreign_code: serve a folder whose ``handler.py`` is not the file hydra_hf ships.
        name, route_prefix: the Ray Serve application and the path it answers under (several folders can be
            served by one Serve at once, each under its own prefix: ``/a/predict``, ``/b/predict``; they share the
            host and port of the first, which started Serve).
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    max_batch_size: int = 32
    batch_wait_ms: float = 5.0
    backend: str = "torch"
    threads: int = 1
    max_inputs: int = MAX_INPUTS
    address: str | None = None
    metrics_port: int | None = None
    trust_foreign_code: bool = False
    name: str = APP_NAME
    route_prefix: str = "/"

    def __post_init__(self) -> None:
        self.model = str(self.model)
        for name, low, high in (("port", 1, 65535), ("replicas", 1, None), ("max_batch_size", 1, 4096),
                                ("threads", 1, None), ("max_inputs", 1, None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise HydraTypeError(f"{name} must be an integer, got {value!r}")
            if value < low or (high is not None and value > high):
                raise HydraInputError(f"{name}={value} is out of range; give {low} or more"
                                      + (f", at most {high}" if high is not None else ""))
        if self.metrics_port is not None and (isinstance(self.metrics_port, bool) or not isinstance(
                self.metrics_port, int) or not 1 <= self.metrics_port <= 65535):
            raise HydraInputError(f"metrics_port={self.metrics_port!r} is not a port (1 to 65535)")
        wait = self.batch_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise HydraInputError(f"batch_wait_ms={wait!r} must be a finite number of milliseconds >= 0")
        if self.backend not in BACKENDS:
            raise HydraInputError(f"backend={self.backend!r} is unknown; use one of {list(BACKENDS)}")
        if not isinstance(self.host, str) or not self.host:
            raise HydraInputError(f"host={self.host!r} is not a host name or address")
        if not isinstance(self.name, str) or not self.name.replace("-", "").replace("_", "").isalnum():
            raise HydraInputError(f"name={self.name!r}: an application name is letters, digits, '-' and '_'")
        prefix = self.route_prefix
        if not isinstance(prefix, str) or not prefix.startswith("/") or (len(prefix) > 1 and prefix.endswith("/")):
            raise HydraInputError(f"route_prefix={prefix!r} must start with '/' and not end with one (e.g. /hydra)")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}{self.route_prefix.rstrip('/')}"


# ----------------------------------------------------------------------------------- the handler
def folder_kind(spec: ServeSpec) -> str:
    """``"hydra"``, ``"onnx"`` (an export folder) or ``"stock"`` (a transformers text / image classifier), checked
    against the backend; raises one :class:`HydraInputError` line otherwise."""
    folder = Path(spec.model)
    if not (folder / "config.json").is_file():
        raise HydraInputError(f"{spec.model!r} is not a model folder (no config.json); give a folder written by "
                              "hydra-hf convert / finetune / calibrate / export, or a stock classifier's")
    if is_onnx_export(folder):
        if spec.backend != "onnx":
            raise HydraInputError(f"{spec.model!r} is an ONNX export; serve it with --backend onnx")
        return "onnx"
    if spec.backend == "onnx":
        raise HydraInputError(f"{spec.model!r} is not an ONNX export; export it first (hydra-hf export "
                              f"{spec.model} --format onnx --quantize int8 --output OUT ...) and serve OUT")
    config = read_model_config(folder / "config.json")
    if "num_members" in config and any(key in config for key in ("kept_heads", "vision_kept_heads")):
        return "hydra"
    architectures = config.get("architectures") or [""]
    if str(architectures[0]).endswith(("ForSequenceClassification", "ForImageClassification")):
        return "stock"
    raise HydraInputError(f"{spec.model!r} holds neither a Hydra Ensemble nor a stock text / image classifier "
                          f"(architectures {architectures}); serve a folder of hydra-hf convert")


def handler_module(folder: Path | None, *, trust_foreign_code: bool = False) -> ModuleType:
    """The ``handler`` module a folder ships (loaded by path, as Inference Endpoints loads it), or hydra_hf's own
    copy for a folder without one (written before folders shipped it; an export or a stock folder).

    A folder's ``handler.py`` must be the file hydra_hf ships (the audit of ``hydra-hf push``) unless
    ``trust_foreign_code``."""
    file = folder / HANDLER_FILE if folder is not None else None
    if file is None or not file.is_file():
        file = MODELING_DIR / HANDLER_FILE
    source = read_python_source(file)
    if file.parent != MODELING_DIR and not is_packaged(HANDLER_FILE, source):
        if not trust_foreign_code:
            check_packaged(HANDLER_FILE, source)  # raises the audit's one line (and names FOREIGN_CODE_FLAG)
        logger.warning("%s is not the handler.py hydra_hf ships; running it because you vouch for it (%s)", file,
                       FOREIGN_CODE_FLAG)
    name = "hydra_handler_" + hashlib.sha256(f"{file.resolve()}\n{source}".encode()).hexdigest()[:16]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def stock_pipeline(folder: Path) -> Any:
    """A stock text or image classifier in the Hydra uncertainty pipeline, as a one-member ensemble."""
    config = read_model_config(folder / "config.json")
    cpu = torch.device("cpu")
    if str(config["architectures"][0]).endswith("ForSequenceClassification"):
        model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        return pipeline_hydra.HydraTextClassificationPipeline(
            model=model, tokenizer=AutoTokenizer.from_pretrained(folder), task="hydra-text-classification", device=cpu)
    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    return pipeline_hydra.HydraImageClassificationPipeline(
        model=model, image_processor=AutoImageProcessor.from_pretrained(folder), task="hydra-image-classification",
        device=cpu)


def build_handler(spec: ServeSpec) -> Any:
    """The ``EndpointHandler`` of ``spec.model`` on its backend, warmed up (one prediction: a folder that cannot
    answer fails here, with one :class:`HydraInputError` line)."""
    kind = folder_kind(spec)
    folder = Path(spec.model)
    module = handler_module(folder if kind == "hydra" else None, trust_foreign_code=spec.trust_foreign_code)
    torch.set_num_threads(spec.threads)
    try:
        if kind == "hydra":
            return module.EndpointHandler(str(folder), max_inputs=spec.max_inputs)
        pipe = (onnx_pipeline(folder, intra_op_num_threads=spec.threads) if kind == "onnx"
                else stock_pipeline(folder))
        return module.EndpointHandler(pipe=pipe, max_inputs=spec.max_inputs)
    except HydraError:
        raise
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise HydraInputError(f"{spec.model!r} cannot be served: {one_line(exc)}") from exc


# -------------------------------------------------------------------------------------- streaming
def _logits_processors(parameters: dict[str, Any]) -> LogitsProcessorList:
    processors = LogitsProcessorList()
    if parameters.get("repetition_penalty") not in (None, 1.0):
        processors.append(RepetitionPenaltyLogitsProcessor(float(parameters["repetition_penalty"])))
    if parameters.get("do_sample"):
        if parameters.get("temperature") not in (None, 1.0):
            processors.append(TemperatureLogitsWarper(float(parameters["temperature"])))
        if parameters.get("top_k"):
            processors.append(TopKLogitsWarper(int(parameters["top_k"])))
        if parameters.get("top_p") not in (None, 1.0):
            processors.append(TopPLogitsWarper(float(parameters["top_p"])))
    return processors


def stream_tokens(model: Any, tokenizer: Any, prompt: str, parameters: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Decode ``prompt`` one token at a time from the members' mean next-token distribution (one key/value
    cache for every member), yielding each token with its uncertainty as the text-generation inference stream
    does: ``{"token": {"id", "text", "logprob", "special", "entropy", "mutual_information", "member_top_tokens"},
    "generated_text", "details"}``; the last event holds the whole ``generated_text`` and the sequence's mean
    entropy and mutual information. Greedy unless ``do_sample`` (then temperature, top_k, top_p); the token's
    uncertainty is that of the distribution before the sampling warpers, as the pipeline's."""
    generation = getattr(model, "generation_config", None)
    max_new = int(parameters.get("max_new_tokens") or getattr(generation, "max_new_tokens", None) or 20)
    eos = getattr(generation, "eos_token_id", None)
    eos = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    processors = _logits_processors(parameters)
    encoded = tokenizer(prompt, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]  # (1, P)
    generated: list[int] = []
    entropies, informations = [], []
    text = ""
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        for step in range(max_new):
            member_log_probs = F.log_softmax(out.member_logits[:, :, -1].float(), dim=-1)  # (1, M, V)
            next_token = log_prob_uncertainty(member_log_probs)
            log_probs = next_token["log_probs"]  # (1, V)
            entropy = float(next_token["predictive_entropy"][0])
            information = float(next_token["mutual_information"][0])
            scores = processors(ids, log_probs) if len(processors) else log_probs
            if parameters.get("do_sample"):
                token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1)[0, 0])
            else:
                token = int(scores.argmax(dim=-1)[0])
            generated.append(token)
            entropies.append(entropy)
            informations.append(information)
            full = tokenizer.decode(generated, skip_special_tokens=True)
            piece, text = full[len(text):], full
            last = token in eos or step == max_new - 1
            event = {
                "token": {"id": token, "text": piece, "logprob": float(log_probs[0, token]),
                          "special": token in tokenizer.all_special_ids, "entropy": entropy,
                          "mutual_information": information,
                          "member_top_tokens": member_log_probs[0].argmax(dim=-1).tolist()},
                "generated_text": None, "details": None,
            }
            if last:
                event["generated_text"] = text
                event["details"] = {"finish_reason": "eos_token" if token in eos else "length",
                                    "generated_tokens": len(generated),
                                    "sequence_entropy": sum(entropies) / len(entropies),
                                    "sequence_mutual_information": sum(informations) / len(informations)}
            yield event
            if last:
                return
            next_ids = torch.tensor([[token]])
            ids = torch.cat([ids, next_ids], dim=1)
            mask = torch.cat([mask, torch.ones_like(next_ids)], dim=1)
            out = model(input_ids=next_ids, attention_mask=mask, cache=out.cache, use_cache=True)


# ---------------------------------------------------------------------------------- the HTTP side
def count_inputs(requests: list[Any]) -> int:
    """A batch's size for ``@serve.batch``: its inputs, not its requests."""
    return sum(len(request.inputs) for request in requests)


def split_request(request: Any, size: int) -> list[Any]:
    """``request`` as requests of at most ``size`` inputs (a batch never holds more)."""
    if len(request.inputs) <= size:
        return [request]
    return [type(request)(request.inputs[i:i + size], dict(request.parameters), False, False)
            for i in range(0, len(request.inputs), size)]


class ServerCore:
    """What a replica does with an HTTP request (Ray Serve's deployment calls :meth:`respond`)."""

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec
        self.handler = build_handler(spec)
        self.metrics = _replica_metrics()
        self.batches = 0  # batches this replica ran (one forward pass per group of equal parameters)
        self.inputs = 0  # inputs it answered in them

    def predict(self, requests: list[Any]) -> list[Any]:
        """One batch: the handler's one forward pass per group of equal parameters."""
        size = count_inputs(requests)
        self.batches += 1
        self.inputs += size
        if self.metrics is not None:
            self.metrics["batch_inputs"].observe(size)
            self.metrics["inputs"].inc(size)
        return self.handler.predict(requests)

    def health(self) -> dict[str, Any]:
        """``GET /health``: what is served, by which replica (its process id), and how much it batched."""
        return {"status": "ok", **self.handler.describe(), "backend": self.spec.backend,
                "max_batch_size": self.spec.max_batch_size, "pid": os.getpid(), "batches": self.batches,
                "inputs_answered": self.inputs}

    def read_body(self, body: bytes, content_type: str) -> Any:
        """The request data: JSON, or an image's bytes for an image task."""
        if len(body) > MAX_BODY_BYTES:
            raise _HTTPError(413, f"the body holds {len(body)} bytes, more than {MAX_BODY_BYTES}; send fewer or "
                                  "smaller inputs per request")
        kind = content_type.split(";")[0].strip().lower()
        if kind.startswith("image/") or kind == "application/octet-stream":
            if self.handler.task not in ("hydra-image-classification",):
                raise _HTTPError(415, f"a {kind} body is for an image classifier; this folder serves "
                                      f"{self.handler.task}: send JSON")
            try:
                return {"inputs": Image.open(io.BytesIO(body)).convert("RGB")}
            except OSError:
                raise _HTTPError(400, f"the {kind} body is not an image PIL can read") from None
        if not body.strip():
            raise _HTTPError(400, "the body is empty; send {\"inputs\": ..., \"parameters\": {...}}")
        try:
            return json.loads(body.decode("utf-8"))  # JSON is UTF-8 (json.loads would guess UTF-16 from a BOM)
        except UnicodeDecodeError:
            raise _HTTPError(400, "the body is not UTF-8 JSON") from None
        except ValueError as exc:
            raise _HTTPError(400, f"the body is not valid JSON ({one_line(exc)})") from None

    async def respond(self, request: Any, predict_batch: Any) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse  # the serve extra (Ray Serve's HTTP)

        path = request.url.path
        root = request.scope.get("root_path") or ""  # the application's route prefix
        if root and path.startswith(root):
            path = path[len(root):]
        path = path.rstrip("/") or "/"
        try:
            if path == "/health":
                if request.method != "GET":
                    raise _HTTPError(405, f"{request.method} /health: use GET")
                return JSONResponse(self.health())
            if path not in PREDICT_PATHS:
                raise _HTTPError(404, f"no route {path}; POST / or /predict, GET /health")
            if request.method != "POST":
                raise _HTTPError(405, f"{request.method} {path}: use POST with {{\"inputs\": ...}}")
            data = self.read_body(await request.body(), request.headers.get("content-type", ""))
            try:
                parsed = self.handler.parse(data)
            except ValueError as exc:  # the handler's RequestError
                raise _HTTPError(400, one_line(exc)) from None
            if parsed.stream:
                if len(parsed.inputs) != 1:
                    raise _HTTPError(400, f"'stream' answers one prompt; got {len(parsed.inputs)}")
                events = (f"data: {json.dumps(event)}\n\n" for event in stream_tokens(
                    self.handler.pipe.model, self.handler.pipe.tokenizer, parsed.inputs[0], parsed.parameters))
                return StreamingResponse(events, media_type="text/event-stream")
            parts = split_request(parsed, self.spec.max_batch_size)
            answers = await asyncio.gather(*(predict_batch(part) for part in parts))
            if len(parts) == 1:
                return JSONResponse(answers[0])
            return JSONResponse([item for answer in answers for item in answer])
        except _HTTPError as exc:
            self._count_error(exc.status)
            return JSONResponse({"error": exc.message, "status": exc.status}, status_code=exc.status)
        except Exception as exc:  # a bug or the machine (out of memory): the replica answers the next request
            logger.exception("request failed")
            self._count_error(500)
            return JSONResponse({"error": f"{type(exc).__name__}: {one_line(exc)}", "status": 500}, status_code=500)

    def _count_error(self, status: int) -> None:
        if self.metrics is not None:
            self.metrics["errors"].inc(tags={"status": str(status)})


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _replica_metrics() -> dict[str, Any] | None:
    """The replica's own Prometheus metrics (Ray's metrics: exported on every node's metrics port)."""
    try:
        from ray.serve import metrics  # the serve extra
    except ImportError:  # outside Ray (ServerCore used directly)
        return None
    return {
        "batch_inputs": metrics.Histogram("hydra_batch_inputs", description="inputs per forward pass",
                                          boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256]),
        "inputs": metrics.Counter("hydra_inputs", description="inputs answered"),
        "errors": metrics.Counter("hydra_request_errors", description="requests answered with an error status",
                                  tag_keys=("status",)),
    }


def require_serve() -> Any:
    """``ray.serve``, or one :class:`HydraInputError` line naming the extra that installs it."""
    try:
        from ray import serve  # the serve extra: pip install 'hydra-hf[serve]'
    except ImportError as exc:
        raise HydraInputError(f"hydra-hf serve needs Ray Serve ({one_line(exc)}); {SERVE_FIX}") from None
    return serve


def deployment(spec: ServeSpec) -> Any:
    """The Ray Serve deployment of ``spec``: each replica a :class:`ServerCore`, with ``@serve.batch`` batching
    up to ``max_batch_size`` inputs."""
    serve = require_serve()

    @serve.deployment(
        name=spec.name,
        num_replicas=spec.replicas,
        # one batch running and the next one filling (Ray's default of 5 would cap every batch at 5 requests)
        max_ongoing_requests=2 * spec.max_batch_size,
        ray_actor_options={"num_cpus": spec.threads},
        health_check_period_s=2,
        graceful_shutdown_wait_loop_s=0.5,
        graceful_shutdown_timeout_s=60,
    )
    class HydraDeployment:
        def __init__(self, fields: dict[str, Any]) -> None:
            self.core = ServerCore(ServeSpec(**fields))

        @serve.batch(max_batch_size=spec.max_batch_size, batch_wait_timeout_s=spec.batch_wait_ms / 1000,
                     batch_size_fn=count_inputs)
        async def predict_batch(self, requests: list[Any]) -> list[Any]:
            return await asyncio.to_thread(self.core.predict, requests)

        async def __call__(self, request: Any) -> Any:
            return await self.core.respond(request, self.predict_batch)

    return HydraDeployment


def build_app(args: dict[str, Any]) -> Any:
    """A Ray Serve application builder: ``serve run hydra_hf.workflows.serve:build_app model=DIR replicas=2``, or
    ``import_path: hydra_hf.workflows.serve:build_app`` with ``args`` in a Serve config file (a KubeRay
    ``RayService``'s ``serveConfigV2``). ``args`` are :class:`ServeSpec`'s fields (strings from the command line are
    converted); the folder is read by the replicas, on whichever nodes they run."""
    fields = {field: _convert(field, value) for field, value in dict(args).items()}
    try:
        spec = ServeSpec(**fields)
    except HydraError:
        raise
    except TypeError as exc:  # an unknown field
        raise HydraInputError(f"build_app: {one_line(exc)}; the arguments are ServeSpec's fields") from None
    return deployment(spec).bind(asdict(spec))


def _convert(field: str, value: Any) -> Any:
    """A ``serve run`` argument (always a string) as the type of the ServeSpec field it names."""
    if not isinstance(value, str):
        return value
    kind = ServeSpec.__dataclass_fields__.get(field)
    kind = kind.type if kind is not None else "str"
    if kind.startswith("int"):
        return int(value) if value.lstrip("-").isdigit() else value
    if kind.startswith("float"):
        try:
            return float(value)
        except ValueError:
            return value
    if kind == "bool":
        return value.strip().lower() in ("1", "true", "yes")
    return value


# --------------------------------------------------------------------------------------- the server
class ServeHandle:
    """A running server: ``url``; :meth:`shutdown` answers the requests it accepted, then stops."""

    def __init__(self, spec: ServeSpec, started_ray: bool) -> None:
        self.spec = spec
        self.url = spec.url
        self._started_ray = started_ray
        self._stopped = False

    def shutdown(self) -> None:
        """Delete the application (every replica finishes the requests it holds: Ray Serve's graceful shutdown),
        then stop Serve when it serves nothing else, and Ray if :func:`serve` started it."""
        if self._stopped:
            return
        self._stopped = True
        import ray  # the serve extra
        from ray import serve

        serve.delete(self.spec.name)
        if serve.status().applications:
            return  # Serve (and Ray) keep serving the other applications
        serve.shutdown()
        if self._started_ray:
            ray.shutdown()
        logger.info("stopped the server at %s", self.url)

    def __enter__(self) -> ServeHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise HydraInputError(f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port or "
                                  "--host") from None


def _join_in_token_mode() -> None:
    """Ray's clusters authenticate with a token (``ray start --head`` writes ``~/.ray/auth_token``); a driver that
    joins one sends it only in token mode, which Ray reads when it is imported: set it first, when a token is
    found and no mode is set."""
    token = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or RAY_TOKEN_FILE.is_file()
    if token and "RAY_AUTH_MODE" not in os.environ and "ray" not in sys.modules:
        os.environ["RAY_AUTH_MODE"] = "token"


def _start_ray(spec: ServeSpec) -> bool:
    """Join ``spec.address`` or start Ray on this machine (unless this process runs Ray already); returns whether
    Ray was started here."""
    import ray  # the serve extra

    if ray.is_initialized():
        return False
    if spec.address is not None:
        ray.init(address=spec.address, log_to_driver=True)
        return True
    cpus = os.cpu_count() or 1
    if spec.replicas * spec.threads > cpus:
        raise HydraInputError(f"{spec.replicas} replicas x {spec.threads} threads need {spec.replicas * spec.threads} "
                              f"CPUs; this machine has {cpus}: lower --replicas or --threads, or join a cluster "
                              "(--address)")
    options: dict[str, Any] = {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": True}
    if spec.metrics_port is not None:
        options["_metrics_export_port"] = spec.metrics_port
    ray.init(**options)
    return True


def serve(spec: ServeSpec, *, block: bool = True) -> ServeHandle:
    """Serve ``spec.model`` over HTTP on Ray Serve (see the module docstring); with ``block`` until SIGINT /
    SIGTERM, then shut down gracefully. Returns the :class:`ServeHandle` (already stopped when ``block``).

    The folder is checked in this process first (its handler built and warmed up, then dropped), so that a folder
    that cannot answer is one :class:`HydraError` line and Ray never starts.
    """
    if spec.address is not None:
        _join_in_token_mode()
    require_serve()
    check = build_handler(spec)
    description = check.describe()
    del check
    gc.collect()
    import ray  # the serve extra
    from ray import serve as ray_serve

    started = False
    if spec.address is None and not ray.is_initialized():  # a Ray of this process may be serving on the port already
        _check_port(spec.host, spec.port)
    stop = threading.Event()
    previous: dict[int, Any] = {}
    try:
        started = _start_ray(spec)
        if block:  # after ray.init, whose own SIGTERM handler would abort the process mid-way
            previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        ray_serve.start(http_options={"host": spec.host, "port": spec.port})
        ray_serve.run(deployment(spec).bind(asdict(spec)), name=spec.name, route_prefix=spec.route_prefix,
                      blocking=False)
    except HydraError:
        raise
    except Exception as exc:  # a replica that does not start: its traceback is in Ray's logs
        raise HydraInputError(f"the server did not start: {one_line(exc)}") from exc
    handle = ServeHandle(spec, started)
    logger.info("serving %s (%s, %d members) at %s with %d replica(s), batches of up to %d inputs", spec.model,
                description["task"], description["members"], spec.url, spec.replicas, spec.max_batch_size)
    if not block:
        return handle
    try:
        while not stop.wait(0.5):  # until SIGINT / SIGTERM (one received while starting stops at once)
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        handle.shutdown()
    return handle


__all__ = ["BACKENDS", "ServeHandle", "build_app", "ServeSpec", "build_handler", "serve", "stream_tokens"]
