"""Architecture adapters: where a model's attention heads live and how to get logits from a batch.

Pruning (gates, Taylor scores, circuit search) only needs, for every attention layer,

- the output projection ``W_O`` (an ``nn.Linear`` whose input columns ``h*dk:(h+1)*dk`` belong to
  head ``h``) — gates scale those column blocks;
- the rows of ``W_q``, ``W_k``, ``W_v`` that belong to each head — Taylor scores read them;

and a way to compute class logits from a batch. :func:`hydra_hf.families.get_adapter` asks the family
registry (:func:`~hydra_hf.families.base.family_of_model`) which family owns a model; the family builds
its :class:`ModelAdapter` from the helpers here:

- :func:`bert_like_adapter`: transformers encoders with BERT's layout
  ``encoder.layer[i].attention.{self.query,key,value; output.dense}`` (BERT, RoBERTa, ELECTRA, ...);
- :func:`hf_vit_adapter`: transformers ViT (``layers[i].attention.{q,k,v,o}_proj``);
- :func:`hf_clip_adapter`: transformers CLIP (towers ``"vision"`` and ``"text"``);
- :func:`timm_vit_adapter`: timm ``VisionTransformer`` (``blocks[i].attn.{qkv, proj}``);
- :func:`open_clip_adapter`: open_clip ``CLIP`` (towers ``"vision"`` and ``"text"``,
  ``nn.MultiheadAttention`` with ``in_proj_weight`` and ``out_proj``);
- :func:`layer_list_adapter`: any layout, from one ``(attention module -> names)`` description;
- :func:`llama_like_adapter`: transformers decoders with Llama's layout
  ``layers[i].self_attn.{q,k,v,o}_proj`` (Llama, Mistral, Qwen2, Qwen3; grouped-query attention);
- :func:`gpt2_adapter`: transformers GPT-2 (``h[i].attn.{c_attn, c_proj}``, ``Conv1D`` weights stored
  ``(in, out)``: ``AttentionLayer.transposed``);
- :func:`decoder_adapter`: either of the two, by the model's layout.

Decoders (``task``): a sequence classifier (``...ForSequenceClassification``) gives class logits
``(B, C)`` like every encoder; a causal LM (a model with an ``lm_head``) gets ``task="causal_lm"`` and
the logits of :func:`next_token_logits`: next-token prediction seen as classification over the
vocabulary, one row per *valid* position (:func:`next_token_mask`), so that Taylor scores and circuit
accuracy are next-token loss and accuracy (:mod:`hydra_hf.pruning.lm` builds the matching batches).

Grouped-query attention (``num_key_value_heads < num_attention_heads``): the heads the pruning code
sees are the *query* heads (the input blocks of ``o_proj``); query head ``h`` reads key/value head
``h // (H / H_kv)``. Taylor's weight criterion gives query head ``h`` the mean importance of its own
Q rows and of the K and V rows of its key/value group (so the query heads of one group share the K/V
part of their score): removing every query head of a group removes the group's K/V rows too.

Single-tower models have one tower, named ``"text"`` (BERT) or ``"vision"`` (ViT, timm).
CLIP logits are zero-shot logits: scaled cosine similarity of each image with the class prompts
(``class_text_inputs``, tokenized by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class AttentionLayer:
    """One self-attention layer, seen from the pruning code.

    Attributes:
        out_proj: the output projection; its input features are ``num_heads`` blocks of ``head_dim``.
        qkv: ``[(weight, row_offset)]`` for Q, K and V: head ``h``'s rows of that projection are
            ``weight[row_offset + h*head_dim : row_offset + (h+1)*head_dim]``.
        num_heads: heads in the layer (``H``; the query heads under grouped-query attention).
        head_dim: features per head (``dk``).
        num_key_value_heads: heads of the K and V projections (``qkv[1:]``) under grouped-query
            attention (``H_kv``, dividing ``H``; query head ``h`` reads K/V head ``h // (H / H_kv)``);
            ``None``: ``H`` (plain multi-head attention).
        transposed: the weights (``out_proj.weight`` and the ``qkv`` weights) are stored ``(in, out)``
            (transformers ``Conv1D``, GPT-2), not ``(out, in)`` like ``nn.Linear``: a head's "rows" of
            Q/K/V are then *columns* of the weight and its input block of ``W_O`` is a block of *rows*.
    """

    out_proj: nn.Module
    qkv: list[tuple[nn.Parameter, int]]
    num_heads: int
    head_dim: int
    num_key_value_heads: int | None = None
    transposed: bool = False

    def proj_heads(self, index: int) -> int:
        """Heads of ``qkv[index]``: ``H`` for Q (index 0), ``H_kv`` for K and V."""
        if index == 0 or self.num_key_value_heads is None:
            return self.num_heads
        return self.num_key_value_heads


@dataclass
class ModelAdapter:
    """What pruning needs to know about one architecture.

    Attributes:
        kind: ``"hf_bert"``, ``"hf_vit"``, ``"hf_clip"``, ``"timm_vit"``, ``"open_clip"``,
            ``"hf_llama"`` (Llama-like decoders), ``"hf_gpt2"``, ...
        model: the wrapped model.
        towers: tower name -> its attention layers, in depth order.
        logits_fn: ``(model, batch) -> logits (B, C)``; for ``task="causal_lm"``, ``(N_valid, V)``
            (:func:`next_token_logits`).
        input_keys: batch keys the model reads (``labels`` is never passed to the model).
        task: ``"classification"`` (one row of logits per example) or ``"causal_lm"`` (one row per
            valid next-token position; circuit search then scores with
            :class:`hydra_hf.pruning.lm.LMGatedEvaluator`).
    """

    kind: str
    model: nn.Module
    towers: dict[str, list[AttentionLayer]]
    logits_fn: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]
    input_keys: tuple[str, ...] = field(default_factory=tuple)
    task: str = "classification"

    @property
    def tower_names(self) -> list[str]:
        return list(self.towers)

    def shape(self, tower: str | None = None) -> tuple[int, int]:
        """``(L, H)`` of one tower (the only one when ``tower`` is None)."""
        layers = self.towers[self.resolve_tower(tower)]
        return len(layers), layers[0].num_heads

    def resolve_tower(self, tower: str | None) -> str:
        if tower is None:
            if len(self.towers) != 1:
                raise ValueError(
                    f"this {self.kind} model has towers {list(self.towers)}; choose one with tower=... (or --tower)"
                )
            return next(iter(self.towers))
        if tower not in self.towers:
            raise ValueError(f"unknown tower {tower!r}; this {self.kind} model has {list(self.towers)}")
        return tower

    def logits(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Class logits ``(B, C)`` of a batch (moved to the model's device); ``(N_valid, V)`` next-token
        logits for ``task="causal_lm"``."""
        device = next(self.model.parameters()).device
        inputs = {k: v.to(device) for k, v in batch.items() if k in self.input_keys}
        return self.logits_fn(self.model, inputs)


def _bert_layers(encoder_layers: Any) -> list[AttentionLayer]:
    out = []
    for layer in encoder_layers:
        att = layer.attention.self
        H, dk = att.num_attention_heads, att.attention_head_size
        out.append(
            AttentionLayer(
                out_proj=layer.attention.output.dense,
                qkv=[(att.query.weight, 0), (att.key.weight, 0), (att.value.weight, 0)],
                num_heads=H,
                head_dim=dk,
            )
        )
    return out


def _qkv_proj_layers(attn_modules: list[nn.Module], out_name: str, num_heads: int) -> list[AttentionLayer]:
    out = []
    for att in attn_modules:
        o = getattr(att, out_name)
        dk = o.in_features // num_heads
        out.append(
            AttentionLayer(
                out_proj=o,
                qkv=[(att.q_proj.weight, 0), (att.k_proj.weight, 0), (att.v_proj.weight, 0)],
                num_heads=num_heads,
                head_dim=dk,
            )
        )
    return out


def _fused_qkv_layers(pairs: list[tuple[nn.Parameter, nn.Linear]], num_heads: int) -> list[AttentionLayer]:
    """Layers whose Q, K, V are one fused ``(3*H*dk, d)`` weight (timm ``qkv``, torch MHA ``in_proj``)."""
    out = []
    for weight, proj in pairs:
        attn_dim = weight.shape[0] // 3
        out.append(
            AttentionLayer(
                out_proj=proj,
                qkv=[(weight, 0), (weight, attn_dim), (weight, 2 * attn_dim)],
                num_heads=num_heads,
                head_dim=attn_dim // num_heads,
            )
        )
    return out


def _hf_classifier_logits(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return model(**inputs).logits


def find_bert_like_layers(model: nn.Module) -> Any:
    """``encoder.layer`` of a BERT-like model (``attention.self.query`` / ``attention.output.dense``), or None."""
    base = getattr(model, model.base_model_prefix, model) if hasattr(model, "base_model_prefix") else model
    encoder = getattr(base, "encoder", None)
    if (
        encoder is not None
        and hasattr(encoder, "layer")
        and len(encoder.layer)
        and hasattr(encoder.layer[0], "attention")
    ):
        att = encoder.layer[0].attention
        if hasattr(att, "self") and hasattr(att.self, "query") and hasattr(att, "output"):
            return encoder.layer
    return None


def bert_like_adapter(
    model: nn.Module, kind: str, input_keys: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
) -> ModelAdapter:
    """A transformers text classifier with BERT's encoder layout (BERT, RoBERTa, ELECTRA, ...)."""
    layers = find_bert_like_layers(model)
    if layers is None:
        raise TypeError(f"cannot find the BERT-like encoder layers of {type(model).__name__}")
    return ModelAdapter(kind, model, {"text": _bert_layers(layers)}, _hf_classifier_logits, input_keys)


def hf_vit_adapter(model: nn.Module) -> ModelAdapter:
    """A transformers ViT (``ViTModel`` / ``ViTForImageClassification``; ``layers[i].attention.{q,k,v,o}_proj``)."""
    vit = model if hasattr(model, "layers") else getattr(model, "vit", None)
    if vit is None or not hasattr(vit, "layers"):
        raise TypeError(f"cannot find the ViT layers of {type(model).__name__}")
    H = model.config.num_attention_heads
    layers = _qkv_proj_layers([layer.attention for layer in vit.layers], "o_proj", H)
    return ModelAdapter("hf_vit", model, {"vision": layers}, _hf_classifier_logits, ("pixel_values",))


def timm_vit_adapter(model: nn.Module) -> ModelAdapter:
    """A timm ``VisionTransformer`` (``blocks[i].attn.{qkv, proj}``)."""
    H = model.blocks[0].attn.num_heads
    pairs = [(blk.attn.qkv.weight, blk.attn.proj) for blk in model.blocks]
    return ModelAdapter(
        "timm_vit",
        model,
        {"vision": _fused_qkv_layers(pairs, H)},
        lambda m, b: m(b["pixel_values"]),
        ("pixel_values",),
    )


def layer_list_adapter(
    model: nn.Module,
    kind: str,
    attention_modules: list[nn.Module],
    names: tuple[str, str, str, str],
    num_heads: int,
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask"),
    tower: str = "text",
) -> ModelAdapter:
    """A classifier whose layer ``i`` attends with ``attention_modules[i]``, holding its Q, K, V and
    output projections (``nn.Linear``) under ``names`` (e.g. DistilBERT's ``q_lin, k_lin, v_lin, out_lin``)."""
    q, k, v, o = names
    layers = [
        AttentionLayer(
            out_proj=getattr(att, o),
            qkv=[(getattr(att, q).weight, 0), (getattr(att, k).weight, 0), (getattr(att, v).weight, 0)],
            num_heads=num_heads,
            head_dim=getattr(att, o).in_features // num_heads,
        )
        for att in attention_modules
    ]
    return ModelAdapter(kind, model, {tower: layers}, _hf_classifier_logits, input_keys)


def hf_clip_adapter(model: nn.Module, class_text_inputs: Any) -> ModelAdapter:
    """The adapter of a transformers CLIP-like model (``vision_model`` / ``text_model`` towers, ``self_attn``
    with ``q/k/v/out_proj``); zero-shot logits against ``class_text_inputs``."""
    vis, txt = model.vision_model, model.text_model
    towers = {
        "vision": _qkv_proj_layers(
            [l.self_attn for l in vis.encoder.layers], "out_proj", model.config.vision_config.num_attention_heads
        ),
        "text": _qkv_proj_layers(
            [l.self_attn for l in txt.encoder.layers], "out_proj", model.config.text_config.num_attention_heads
        ),
    }

    def logits_fn(m: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if class_text_inputs is None:
            raise ValueError("CLIP logits need the tokenized class prompts: get_adapter(model, class_text_inputs=...)")
        device = inputs["pixel_values"].device
        text = {k: v.to(device) for k, v in dict(class_text_inputs).items()}
        out = m(pixel_values=inputs["pixel_values"], **text)
        return out.logits_per_image  # (B, C)

    return ModelAdapter("hf_clip", model, towers, logits_fn, ("pixel_values",))


def open_clip_adapter(model: nn.Module, class_text_inputs: Any) -> ModelAdapter:
    """The adapter of an open_clip ``CLIP`` (``nn.MultiheadAttention`` towers); zero-shot logits against
    the token ids ``class_text_inputs``."""
    towers: dict[str, list[AttentionLayer]] = {}
    visual_tf = getattr(model.visual, "transformer", None)
    if visual_tf is not None and isinstance(visual_tf.resblocks[0].attn, nn.MultiheadAttention):
        towers["vision"] = _fused_qkv_layers(
            [(b.attn.in_proj_weight, b.attn.out_proj) for b in visual_tf.resblocks],
            visual_tf.resblocks[0].attn.num_heads,
        )
    text_tf = getattr(model, "transformer", None)
    if text_tf is not None and isinstance(text_tf.resblocks[0].attn, nn.MultiheadAttention):
        towers["text"] = _fused_qkv_layers(
            [(b.attn.in_proj_weight, b.attn.out_proj) for b in text_tf.resblocks], text_tf.resblocks[0].attn.num_heads
        )
    if not towers:
        raise TypeError(
            "this open_clip model uses custom attention blocks; only nn.MultiheadAttention towers are supported"
        )

    def logits_fn(m: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if class_text_inputs is None:
            raise ValueError("CLIP logits need the tokenized class prompts: get_adapter(model, class_text_inputs=...)")
        tokens = class_text_inputs.to(inputs["pixel_values"].device)
        image = nn.functional.normalize(m.encode_image(inputs["pixel_values"]), dim=-1)  # (B, E)
        text = nn.functional.normalize(m.encode_text(tokens), dim=-1)  # (C, E)
        return m.logit_scale.exp() * image @ text.T  # (B, C)

    return ModelAdapter("open_clip", model, towers, logits_fn, ("pixel_values",))


# ------------------------------------------------------------------------------------- decoders
TASKS = ("classification", "causal_lm")


def next_token_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Which positions ``t`` of each row predict a real next token: tokens ``t`` and ``t+1`` both real.

    Shape:
        attention_mask: ``(B, T)`` 0/1; returns ``(B, T-1)`` bool. The valid positions, read in
        row-major order (``logits[:, :-1][mask]``), are the rows of :func:`next_token_logits` and
        the targets ``input_ids[:, 1:][mask]``.
    """
    real = attention_mask.bool()
    return real[:, :-1] & real[:, 1:]


def next_token_logits(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A causal LM's logits at its valid next-token positions, flattened row-major. ``(N_valid, V)``.

    Row ``i`` is ``model(**inputs).logits[b, t]`` for the ``i``-th ``(b, t)`` of
    :func:`next_token_mask` (no attention mask: every position but the last is valid).
    """
    logits = model(**inputs).logits  # (B, T, V)
    mask = inputs.get("attention_mask")
    if mask is None:
        return logits[:, :-1].reshape(-1, logits.shape[-1])
    return logits[:, :-1][next_token_mask(mask.to(logits.device))]  # (N_valid, V)


def _headless_logits(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    raise TypeError(
        f"{type(model).__name__} has no head to give logits (a bare base model); gates work on it, but Taylor "
        "scores and circuit search need a ...ForCausalLM or ...ForSequenceClassification model"
    )


def _decoder_task(model: nn.Module, headless: bool, task: str | None) -> tuple[str, Callable[..., torch.Tensor]]:
    """The task of a decoder (``None``: a causal LM if it has an ``lm_head``) and its logits function
    (``headless``: a bare base model, whose logits function explains that it has none)."""
    if task is None:
        task = "causal_lm" if hasattr(model, "lm_head") else "classification"
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {list(TASKS)}")
    if task == "causal_lm":
        return task, next_token_logits
    return task, (_headless_logits if headless else _hf_classifier_logits)


def find_llama_like_layers(model: nn.Module) -> Any:
    """``layers`` of a Llama-like decoder (``layers[i].self_attn.{q,k,v,o}_proj``), or None."""
    prefix = getattr(model, "base_model_prefix", "model")
    for base in (model, getattr(model, prefix, None)):
        layers = getattr(base, "layers", None) if base is not None else None
        if layers is not None and len(layers) and hasattr(getattr(layers[0], "self_attn", None), "o_proj"):
            return layers
    return None


def llama_like_adapter(
    model: nn.Module,
    kind: str = "hf_llama",
    *,
    task: str | None = None,
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask"),
) -> ModelAdapter:
    """A transformers decoder with Llama's layout: ``LlamaForCausalLM`` / ``...ForSequenceClassification`` /
    ``LlamaModel`` and the same classes of Mistral, Qwen2, Qwen3 (``<base>.layers[i].self_attn``).

    ``head_dim`` is ``config.head_dim`` when set (Qwen3 may have ``H * head_dim != hidden_size``),
    else ``hidden_size // num_attention_heads``; grouped-query attention is read from
    ``config.num_key_value_heads``. The gates act on the query heads (``o_proj`` input columns).

    Args:
        task: ``"causal_lm"`` (logits :func:`next_token_logits`), ``"classification"`` (class logits
            ``(B, C)``), or ``None``: ``"causal_lm"`` when the model has an ``lm_head``.
    """
    layers = find_llama_like_layers(model)
    if layers is None:
        raise TypeError(
            f"cannot find the Llama-like decoder layers (layers[i].self_attn.o_proj) of {type(model).__name__}"
        )
    cfg = model.config
    H = cfg.num_attention_heads
    H_kv = getattr(cfg, "num_key_value_heads", None) or H
    dk = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    if H % H_kv:
        raise ValueError(f"num_attention_heads {H} is not a multiple of num_key_value_heads {H_kv}")
    out = []
    for layer in layers:
        att = layer.self_attn
        if att.o_proj.in_features != H * dk or att.k_proj.out_features != H_kv * dk:
            raise ValueError(
                f"{type(model).__name__}: o_proj has {att.o_proj.in_features} input features and k_proj "
                f"{att.k_proj.out_features} outputs; expected {H}x{dk} and {H_kv}x{dk} (heads x head_dim)"
            )
        out.append(
            AttentionLayer(
                out_proj=att.o_proj,
                qkv=[(att.q_proj.weight, 0), (att.k_proj.weight, 0), (att.v_proj.weight, 0)],
                num_heads=H,
                head_dim=dk,
                num_key_value_heads=H_kv if H_kv != H else None,
            )
        )
    task, logits_fn = _decoder_task(model, hasattr(model, "layers"), task)
    return ModelAdapter(kind, model, {"text": out}, logits_fn, input_keys, task)


def find_gpt2_layers(model: nn.Module) -> Any:
    """``h`` of a GPT-2 model (``h[i].attn.{c_attn, c_proj}``), or None."""
    for base in (model, getattr(model, "transformer", None)):
        blocks = getattr(base, "h", None) if base is not None else None
        if blocks is not None and len(blocks) and hasattr(getattr(blocks[0], "attn", None), "c_proj"):
            return blocks
    return None


def gpt2_adapter(
    model: nn.Module,
    kind: str = "hf_gpt2",
    *,
    task: str | None = None,
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask"),
) -> ModelAdapter:
    """transformers GPT-2 (``GPT2LMHeadModel`` / ``GPT2ForSequenceClassification`` / ``GPT2Model``).

    ``attn.c_attn`` (fused Q, K, V) and ``attn.c_proj`` are ``Conv1D``: weights ``(in, out)``, so the
    layers are ``transposed`` (head ``h``'s Q rows are columns ``h*dk:(h+1)*dk`` of ``c_attn.weight``,
    K and V follow at offsets ``d`` and ``2d``; its ``W_O`` block is rows ``h*dk:(h+1)*dk`` of
    ``c_proj.weight``). ``task``: as :func:`llama_like_adapter`.
    """
    blocks = find_gpt2_layers(model)
    if blocks is None:
        raise TypeError(f"cannot find the GPT-2 blocks (h[i].attn.c_proj) of {type(model).__name__}")
    if getattr(blocks[0].attn, "is_cross_attention", False):
        raise TypeError("GPT-2 cross-attention blocks are not supported")
    H = model.config.n_head
    out = []
    for block in blocks:
        att = block.attn
        d = att.c_proj.weight.shape[0]  # Conv1D weight (in, out): in = H * dk
        out.append(
            AttentionLayer(
                out_proj=att.c_proj,
                qkv=[(att.c_attn.weight, 0), (att.c_attn.weight, d), (att.c_attn.weight, 2 * d)],
                num_heads=H,
                head_dim=d // H,
                transposed=True,
            )
        )
    task, logits_fn = _decoder_task(model, hasattr(model, "h"), task)
    return ModelAdapter(kind, model, {"text": out}, logits_fn, input_keys, task)


def decoder_adapter(model: nn.Module, *, task: str | None = None) -> ModelAdapter:
    """:func:`llama_like_adapter` or :func:`gpt2_adapter`, whichever layout ``model`` has.

    Raises:
        TypeError: neither layout.
    """
    if find_llama_like_layers(model) is not None:
        return llama_like_adapter(model, task=task)
    if find_gpt2_layers(model) is not None:
        return gpt2_adapter(model, task=task)
    raise TypeError(
        f"{type(model).__name__} has neither Llama's decoder layout (layers[i].self_attn.o_proj) nor GPT-2's "
        "(h[i].attn.c_proj)"
    )
