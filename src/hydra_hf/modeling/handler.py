# Shipped with every Hydra Ensemble model folder: imports only the standard library, torch and transformers.
# The folder's entry point for servers (Hugging Face Inference Endpoints' custom handler, `hydra-hf serve`):
# nothing imports it when the model loads.
"""The Inference Endpoints custom handler of a Hydra Ensemble folder: predictions with their uncertainty, in
the shapes of the Hugging Face task specifications.

Inference Endpoints runs a repository's ``handler.py`` when it has one: ``EndpointHandler(path)`` once, then
``handler(data)`` per request, with ``data["inputs"]`` (one input or a list) and ``data.get("parameters")``.
``hydra-hf serve`` runs the same class behind Ray Serve. The answer, per input:

- **classifiers** (text, image, zero-shot image): a list of ``{"label", "score"}``, best first (the task
  specifications' element; ``top_k`` keeps the first k), each element with extra fields: ``member_scores`` (every
  member's probability of that label), and, the same on every element, ``uncertainty``
  (``predictive_entropy``, ``expected_entropy``, ``mutual_information``: nats), ``member_labels`` (each member's
  top label) and ``flagged`` (the uncertainty above the folder's or the call's threshold; None without one); a
  folder calibrated by ``hydra-hf calibrate`` adds ``prediction_set`` (the conformal set's labels) and
  ``abstain`` with ``abstain_score``. A single input is answered as a list holding its one list, as the Hub's
  Inference API answers it (``InferenceClient.text_classification`` reads that shape).
- **causal LMs**: the text-generation records, ``{"generated_text", ...}`` with ``token_entropy``,
  ``token_mutual_information``, ``token_probability``, ``member_top_tokens``, ``generated_token_ids``,
  ``sequence_entropy`` and ``sequence_mutual_information``; a single prompt gets its list of records, a list of
  prompts one such list each (the pipeline's shapes).

Every input of a call (and of several calls, :meth:`EndpointHandler.predict`) goes through the model in ONE
padded forward pass per group of equal parameters; the pipelines alone would run one forward per input. A bad
request raises :class:`RequestError` (a ``ValueError``) whose one line names the problem; a server answers it
with status 400. The results come from the folder's own uncertainty pipelines (``pipeline_hydra.py``), so they
equal ``pipeline("hydra-...", model=folder, trust_remote_code=True)``'s.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import (
    ImageClassificationPipeline,
    PretrainedConfig,
    TextClassificationPipeline,
    TextGenerationPipeline,
    ZeroShotImageClassificationPipeline,
    pipeline,
)
from transformers.image_transforms import to_pil_image
from transformers.image_utils import load_image

TEXT_CLASSIFICATION = "hydra-text-classification"
IMAGE_CLASSIFICATION = "hydra-image-classification"
ZERO_SHOT = "hydra-zero-shot-image-classification"
TEXT_GENERATION = "hydra-text-generation"
# the task head (auto class) a folder was built as -> the pipeline that serves it
TASK_OF_AUTO_CLASS = {
    "AutoModelForSequenceClassification": TEXT_CLASSIFICATION,
    "AutoModelForImageClassification": IMAGE_CLASSIFICATION,
    "AutoModelForZeroShotImageClassification": ZERO_SHOT,
    "AutoModelForCausalLM": TEXT_GENERATION,
}
# the parameters each task takes (anything else is refused, never silently ignored)
TASK_PARAMETERS = {
    TEXT_CLASSIFICATION: ("top_k", "function_to_apply", "uncertainty_threshold", "truncation"),
    IMAGE_CLASSIFICATION: ("top_k", "function_to_apply", "uncertainty_threshold"),
    ZERO_SHOT: ("candidate_labels", "hypothesis_template", "top_k", "uncertainty_threshold"),
    TEXT_GENERATION: ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                      "num_return_sequences", "return_full_text", "details", "decoder_input_details"),
}
# text-generation-inference's answer options (InferenceClient.text_generation sends them): every answer has the
# details a Hydra adds (the tokens' uncertainty); the prompt's own tokens are not scored
ANSWER_OPTIONS = ("details", "decoder_input_details")
# fields of a request besides "inputs" and "parameters" (what InferenceClient sends for text generation)
REQUEST_FIELDS = ("inputs", "parameters", "stream")
MAX_INPUTS = 256  # inputs per request
MAX_TEXT_CHARS = 100_000  # characters per text (the tokenizer truncates to the model's length anyway)
MAX_IMAGE_CHARS = 20_000_000  # characters of a base64 image
MAX_NEW_TOKENS = 1024
MAX_RETURN_SEQUENCES = 16


class RequestError(ValueError):
    """A request the handler cannot answer: one line naming the bad value and what is expected (status 400)."""


class Request:
    """One parsed request: its inputs (a list, one entry per input), parameters, whether the request held one
    input (answered in the task's shape for one input) or a list, and whether it asks for a token stream.

    A plain class, not a dataclass: a server may load this file by path, outside any package."""

    def __init__(self, inputs: list[Any], parameters: dict[str, Any] | None = None, single: bool = False,
                 stream: bool = False) -> None:
        self.inputs = inputs
        self.parameters = parameters or {}
        self.single = single
        self.stream = stream


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def folder_task(config: dict[str, Any]) -> str:
    """The Hydra pipeline task of a folder's ``config.json`` (a dict): the task head whose class
    ``architectures`` names (a decoder folder ships a causal LM and a classifier head; it was built as one),
    else the one uncertainty pipeline it names."""
    auto_map = config.get("auto_map") or {}
    pipelines = config.get("custom_pipelines") or {}
    architectures = config.get("architectures") or []
    built = str(architectures[0]) if isinstance(architectures, list) and architectures else None
    for auto_class, task in TASK_OF_AUTO_CLASS.items():
        reference = auto_map.get(auto_class)
        if built and isinstance(reference, str) and reference.rpartition(".")[2] == built and task in pipelines:
            return task
    known = [task for task in pipelines if task in TASK_PARAMETERS]
    if len(known) == 1:
        return known[0]
    raise ValueError(
        f"config.json names the uncertainty pipelines {sorted(pipelines)} and the architectures {architectures}: "
        f"no single task to serve; a Hydra folder names one of {sorted(TASK_PARAMETERS)} (re-write it with "
        "hydra-hf convert)"
    )


class EndpointHandler:
    """Serves one Hydra folder: ``EndpointHandler(path)(data)`` (the Inference Endpoints contract).

    Args:
        path: the model folder (Inference Endpoints passes the repository's local copy).
        pipe: an uncertainty pipeline to serve instead of building one from ``path`` (``hydra-hf serve``
            passes the ONNX Runtime pipeline of ``hydra_hf.onnx``, or a stock classifier wrapped as a
            one-member ensemble).
        max_inputs: inputs per request; more are refused.
    """

    def __init__(self, path: str = "", pipe: Any = None, max_inputs: int = MAX_INPUTS) -> None:
        if pipe is None:
            config, _ = PretrainedConfig.get_config_dict(path)
            pipe = pipeline(folder_task(config), model=path, trust_remote_code=True)
        self.pipe = pipe
        self.task = self._task_of(pipe)
        self.max_inputs = int(max_inputs)
        if self.task == TEXT_GENERATION:
            tokenizer = pipe.tokenizer
            tokenizer.padding_side = "left"  # decoders continue the prompt's last token: pad on the left
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        self._warm_up()

    @staticmethod
    def _task_of(pipe: Any) -> str:
        for task, base in ((TEXT_GENERATION, TextGenerationPipeline),
                           (ZERO_SHOT, ZeroShotImageClassificationPipeline),
                           (IMAGE_CLASSIFICATION, ImageClassificationPipeline),
                           (TEXT_CLASSIFICATION, TextClassificationPipeline)):
            if isinstance(pipe, base):
                return task
        raise ValueError(f"{type(pipe).__name__} is not a pipeline this handler serves; give a Hydra uncertainty "
                         "pipeline (pipeline_hydra.py)")

    def _warm_up(self) -> None:
        """One prediction at start: the model, its preprocessor and the folder's stored values (threshold,
        calibration) are checked before the first request, so a folder that cannot answer never starts."""
        if self.task == TEXT_CLASSIFICATION:
            self({"inputs": "hello"})
        elif self.task == IMAGE_CLASSIFICATION:
            self._classify_images([self._image(torch.zeros(3, 32, 32, dtype=torch.uint8))], {})
        elif self.task == ZERO_SHOT:
            calibration = getattr(self.pipe.model.config, "calibration", None)
            names = calibration.get("class_names") if isinstance(calibration, dict) else None
            labels = names if isinstance(names, list) and len(names) >= 2 else ["a", "b"]
            self._zero_shot([self._image(torch.zeros(3, 32, 32, dtype=torch.uint8))], {"candidate_labels": labels})
        else:
            self({"inputs": "hello", "parameters": {"max_new_tokens": 1}})

    def describe(self) -> dict[str, Any]:
        """What the handler serves (a server's health answer)."""
        config = self.pipe.model.config
        labels = getattr(config, "id2label", None) or {}
        return {
            "task": self.task,
            "model_type": getattr(config, "model_type", None),
            "members": int(getattr(config, "num_members", 1) or 1),
            "labels": [str(labels[i]) for i in sorted(labels)] if self.task != TEXT_GENERATION else None,
            "calibrated": getattr(config, "calibration", None) is not None,
            "parameters": list(TASK_PARAMETERS[self.task]),
            "max_inputs": self.max_inputs,
        }

    # ------------------------------------------------------------------------------------ requests
    def __call__(self, data: Any) -> list[Any]:
        """Answer one request ``{"inputs": ..., "parameters": {...}}`` (see the module docstring)."""
        return self.predict([self.parse(data)])[0]

    def parse(self, data: Any) -> Request:
        """Check one request's fields, inputs and parameters; raises :class:`RequestError`."""
        if not isinstance(data, dict):
            raise RequestError(f"the request must be a JSON object with 'inputs', got {type(data).__name__}")
        unknown = [key for key in data if key not in REQUEST_FIELDS]
        if unknown:
            raise RequestError(f"unknown request field(s) {unknown}; a request has {list(REQUEST_FIELDS)}")
        if "inputs" not in data:
            raise RequestError("the request has no 'inputs'; send {\"inputs\": ..., \"parameters\": {...}}")
        parameters = data.get("parameters")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise RequestError(f"'parameters' must be an object, got {_describe(parameters)}")
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(f"'stream' must be true or false, got {_describe(stream)}")
        if stream and self.task != TEXT_GENERATION:
            raise RequestError(f"'stream' is for text generation; this folder serves {self.task}")
        inputs = data["inputs"]
        single = not isinstance(inputs, list)
        inputs = [inputs] if single else inputs
        if not inputs:
            raise RequestError("'inputs' is an empty list; send one input or a non-empty list")
        if len(inputs) > self.max_inputs:
            raise RequestError(f"'inputs' holds {len(inputs)} inputs, more than the {self.max_inputs} a request may "
                               "hold; split it into several requests")
        parameters = self._check_parameters(parameters)
        texts = self.task in (TEXT_CLASSIFICATION, TEXT_GENERATION)
        checked = []
        for i, item in enumerate(inputs):
            where = "inputs" if single else f"inputs[{i}]"
            checked.append(self._check_text(item, where) if texts else self._image(item, where))
        if self.task == TEXT_GENERATION:
            self._check_prompt_lengths(checked, parameters)
        return Request(inputs=checked, parameters=parameters, single=single, stream=stream)

    def _check_text(self, item: Any, where: str) -> Any:
        if self.task == TEXT_CLASSIFICATION and isinstance(item, dict):
            if set(item) - {"text", "text_pair"} or "text" not in item:
                raise RequestError(f"{where} must be a text or {{'text', 'text_pair'}}, got the keys {sorted(item)}")
            for key, value in item.items():
                self._check_text(value, f"{where}.{key}")
            return item
        if not isinstance(item, str):
            raise RequestError(f"{where} must be a text (a JSON string), got {type(item).__name__} "
                               f"{_describe(item)}")
        if len(item) > MAX_TEXT_CHARS:
            raise RequestError(f"{where} holds {len(item)} characters, more than {MAX_TEXT_CHARS}; send a shorter "
                               "text (the model reads at most its maximum length in tokens)")
        return item

    def _check_prompt_lengths(self, prompts: list[str], parameters: dict[str, Any]) -> None:
        """A prompt and its new tokens must fit the model's positions (checked per request, so that one long
        prompt never fails the batch it would have joined)."""
        limit = self._max_length()
        new_tokens = parameters.get("max_new_tokens") or self._default_new_tokens()
        for i, prompt in enumerate(prompts):
            length = len(self.pipe.tokenizer(prompt)["input_ids"])
            if length + new_tokens > limit:
                raise RequestError(f"inputs[{i}] has {length} tokens; with max_new_tokens={new_tokens} that is more "
                                   f"than the model's {limit} positions: send a shorter prompt or fewer new tokens")

    def _default_new_tokens(self) -> int:
        generation = getattr(self.pipe.model, "generation_config", None)
        value = getattr(generation, "max_new_tokens", None)
        return value if isinstance(value, int) and value > 0 else 20

    @staticmethod
    def _image(item: Any, where: str = "inputs") -> Any:
        """An input of an image task as the image the pipeline reads: a PIL image (what Inference Endpoints
        passes for an image body), a tensor, or base64 text (never a file path or a URL: nothing is read or
        fetched)."""
        if isinstance(item, torch.Tensor):
            return to_pil_image(item)  # (C, H, W) uint8, as the pipelines take an image
        if isinstance(item, str):
            if item.startswith(("http://", "https://")):
                raise RequestError(f"{where} is a URL; the server fetches nothing: send the image's bytes, or its "
                                   "base64 text in 'inputs'")
            if len(item) > MAX_IMAGE_CHARS:
                raise RequestError(f"{where} holds {len(item)} characters of base64, more than {MAX_IMAGE_CHARS}")
            if not item.startswith("data:image/"):
                item = f"data:image/unknown;base64,{item}"  # read as base64, never as a path
        try:
            return load_image(item)
        except (ValueError, TypeError, OSError) as exc:
            raise RequestError(f"{where} is not an image ({type(exc).__name__}); send the image's bytes, or its "
                               "base64 text") from None

    def _check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        allowed = TASK_PARAMETERS[self.task]
        unknown = sorted(key for key in parameters if key not in allowed)
        if unknown:
            raise RequestError(f"unknown parameter(s) {unknown} for {self.task}; it takes {list(allowed)}")
        out = {key: value for key, value in parameters.items() if value is not None}
        top_k = out.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise RequestError(f"top_k must be a positive integer, got {_describe(top_k)}")
        function = out.pop("function_to_apply", None)
        if function is not None and str(function).lower() != "softmax":
            raise RequestError(f"function_to_apply={_describe(function)}: a Hydra Ensemble's prediction is the mean "
                               "of its members' softmaxes; leave it out or send 'softmax'")
        if "truncation" in out and not isinstance(out["truncation"], bool):
            raise RequestError(f"truncation must be true or false, got {_describe(out['truncation'])}")
        threshold = out.get("uncertainty_threshold")
        if threshold is not None:
            number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
            if not (threshold is False or number or isinstance(threshold, dict)):
                raise RequestError(f"uncertainty_threshold must be a number, {{'metric', 'value'}} or false, got "
                                   f"{_describe(threshold)}")
            if number and not math.isfinite(threshold):
                raise RequestError(f"uncertainty_threshold must be finite, got {threshold!r}")
        if self.task == ZERO_SHOT:
            labels = out.get("candidate_labels")
            if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) for x in labels):
                raise RequestError(f"candidate_labels must be a list of at least 2 texts, got {_describe(labels)}")
            template = out.get("hypothesis_template", "This is a photo of {}.")
            if not isinstance(template, str) or "{}" not in template:
                raise RequestError(f"hypothesis_template must be a text holding {{}}, got {_describe(template)}")
        if self.task == TEXT_GENERATION:
            self._check_generation(out)
        else:
            self._postprocess_parameters(out)
        return out

    @staticmethod
    def _check_generation(out: dict[str, Any]) -> None:
        integers = (("max_new_tokens", 1, MAX_NEW_TOKENS), ("num_return_sequences", 1, MAX_RETURN_SEQUENCES),
                    ("top_k", 1, None))
        for key, low, high in integers:
            value = out.get(key)
            wrong = isinstance(value, bool) or not isinstance(value, int)
            if value is not None and (wrong or value < low or (high is not None and value > high)):
                raise RequestError(f"{key} must be an integer from {low}{f' to {high}' if high else ' up'}, got "
                                   f"{_describe(value)}")
        for key, low, high in (("temperature", 0.0, None), ("top_p", 0.0, 1.0), ("repetition_penalty", 0.0, None)):
            value = out.get(key)
            wrong = isinstance(value, bool) or not isinstance(value, (int, float))
            if value is not None and (wrong or not math.isfinite(value) or value <= low
                                      or (high is not None and value > high)):
                raise RequestError(f"{key} must be a number above {low}{f' and at most {high}' if high else ''}, got "
                                   f"{_describe(value)}")
        for key in ("do_sample", "return_full_text", *ANSWER_OPTIONS):
            if key in out and not isinstance(out[key], bool):
                raise RequestError(f"{key} must be true or false, got {_describe(out[key])}")
        if out.pop("decoder_input_details", False):
            raise RequestError("decoder_input_details=true is not served: the answer scores the generated tokens, "
                               "not the prompt's")
        out.pop("details", None)  # the answer always has them

    # ---------------------------------------------------------------------------------- predictions
    def predict(self, requests: list[Request]) -> list[list[Any]]:
        """The answers of several parsed requests: the inputs of all requests with equal parameters go through
        the model in one padded forward pass (a server's dynamic batch)."""
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.parameters.items())), []).append(index)
        answers: list[Any] = [None] * len(requests)
        for indices in groups.values():
            parameters = requests[indices[0]].parameters
            inputs = [item for i in indices for item in requests[i].inputs]
            results = self._run(inputs, parameters)
            start = 0
            for i in indices:
                count = len(requests[i].inputs)
                own = results[start:start + count]
                answers[i] = own[0] if requests[i].single and self.task == TEXT_GENERATION else own
                start += count
        return answers

    def _run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        if self.task == TEXT_CLASSIFICATION:
            return self._classify_texts(inputs, parameters)
        if self.task == IMAGE_CLASSIFICATION:
            return self._classify_images(inputs, parameters)
        if self.task == ZERO_SHOT:
            return self._zero_shot(inputs, parameters)
        return self._generate(inputs, parameters)

    def _postprocess_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's own checks of the call options (threshold, top_k), as a one-line RequestError."""
        keep = {key: parameters[key] for key in ("uncertainty_threshold", "top_k") if key in parameters}
        try:
            return self.pipe._sanitize_parameters(**keep)[2]
        except ValueError as exc:
            raise RequestError(str(exc).strip().splitlines()[0]) from None

    def _answers(self, member_logits: torch.Tensor, parameters: dict[str, Any],
                 candidate_labels: list[str] | None = None) -> list[list[dict[str, Any]]]:
        """Per input, the pipeline's result (pipeline_hydra) as the task's list of ``{label, score}`` elements.

        Shape:
            member_logits: ``(B, M, C)``.
        """
        post = self._postprocess_parameters(parameters)
        if candidate_labels is not None:
            post["hypothesis_template"] = parameters.get("hypothesis_template", "This is a photo of {}.")
        answers = []
        for row in member_logits:  # (M, C)
            outputs = {"member_logits": row[None]}  # what the pipelines' postprocess reads: (1, M, C)
            if candidate_labels is not None:
                outputs["candidate_labels"] = candidate_labels
            answers.append(elements(self.pipe.postprocess(outputs, **post)))
        return answers

    def _forward(self, model_inputs: dict[str, Any], key: str = "member_logits") -> torch.Tensor:
        with torch.inference_mode():
            outputs = self.pipe.model(**model_inputs)
        member_logits = outputs.get(key) if hasattr(outputs, "get") else None
        if member_logits is None:  # a stock classifier served as a one-member ensemble
            member_logits = outputs["logits" if key == "member_logits" else "logits_per_image"][:, None]
        return member_logits.float()  # (B, M, C)

    def _classify_texts(self, texts: list[Any], parameters: dict[str, Any]) -> list[Any]:
        tokenizer = self.pipe.tokenizer
        first = [t["text"] if isinstance(t, dict) else t for t in texts]
        pairs = [t.get("text_pair") if isinstance(t, dict) else None for t in texts]
        if any(p is not None for p in pairs) and any(p is None for p in pairs):
            raise RequestError("some inputs are text pairs and some are not; send them in separate requests")
        truncation = parameters.get("truncation", True)
        encoded = tokenizer(first, pairs if pairs[0] is not None else None, padding=True, truncation=truncation,
                            max_length=self._max_length() if truncation else None, return_tensors="pt")
        return self._answers(self._forward(dict(encoded)), parameters)

    def _max_length(self) -> int:
        """The longest input the model reads: the tokenizer's maximum, capped by the model's positions."""
        limit = self.pipe.tokenizer.model_max_length
        base = getattr(self.pipe.model.config, "base_config", None)
        positions = (base or {}).get("max_position_embeddings") if isinstance(base, dict) else None
        positions = positions or getattr(self.pipe.model.config, "max_position_embeddings", None)
        candidates = [n for n in (limit, positions) if isinstance(n, int) and 0 < n < 1_000_000]
        return min(candidates) if candidates else 512

    def _pixel_values(self, images: list[Any]) -> torch.Tensor:
        values = self.pipe.image_processor(images=images, return_tensors="pt")["pixel_values"]
        return values.to(self.pipe.dtype) if self.pipe.dtype is not None else values

    def _classify_images(self, images: list[Any], parameters: dict[str, Any]) -> list[Any]:
        return self._answers(self._forward({"pixel_values": self._pixel_values(images)}), parameters)

    def _zero_shot(self, images: list[Any], parameters: dict[str, Any]) -> list[Any]:
        labels = [str(x) for x in parameters["candidate_labels"]]
        template = parameters.get("hypothesis_template", "This is a photo of {}.")
        prompts = self.pipe.preprocess(images[0], candidate_labels=labels, hypothesis_template=template)
        text_inputs = dict(prompts["text_inputs"][0])
        member_logits = self._forward({**text_inputs, "pixel_values": self._pixel_values(images)},
                                      key="member_logits_per_image")  # (B, M, N)
        return self._answers(member_logits, parameters, candidate_labels=labels)

    def _generate(self, prompts: list[str], parameters: dict[str, Any]) -> list[Any]:
        """Every prompt in one batched ``generate()`` (the pipeline pads them on the left)."""
        records = self.pipe(prompts, batch_size=len(prompts), **parameters)
        return [[plain(record) for record in per_prompt] for per_prompt in records]


def plain(value: Any) -> Any:
    """``value`` with tensors and numbers as JSON values (lists, floats, ints)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def elements(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A Hydra pipeline's result for one input (``pipeline_hydra.format_result``) as the task specification's
    list of ``{label, score}`` elements, best first, each with the members' probabilities of its label and the
    input's uncertainty, member labels, flag and calibrated decision."""
    shared = {key: plain(result[key]) for key in ("uncertainty", "flagged", "member_labels", "prediction_set",
                                                   "abstain", "abstain_score") if key in result}
    members = result["member_scores"]  # one {label: probability} per member
    return [{"label": entry["label"], "score": float(entry["score"]),
             "member_scores": [float(member[entry["label"]]) for member in members], **shared}
            for entry in result["scores"]]
