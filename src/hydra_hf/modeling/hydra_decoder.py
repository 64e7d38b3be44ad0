# Shipped with every Hydra Ensemble model folder built on a decoder (remote code): imports only the
# standard library, torch, transformers and sibling files.
"""What every fused decoder (Llama-style, GPT-2) shares: its outputs, the decoder's forward
(:class:`HydraDecoderModelMixin`: embeddings, the cache, the causal masks, the layer loop), the sequence
classifier (:class:`HydraDecoderClassifierMixin`: last-token pooling), the causal LM
(:class:`HydraCausalLMMixin`: the ensemble's next-token distribution and loss) and the per-token uncertainty
of generated text (:class:`HydraGenerationUncertaintyMixin`: ``score_generated`` /
``generate_with_uncertainty``). A family's modeling file holds only its own modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.utils import ModelOutput
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_hydra import GENERATION_SCORE_NAMES, check_calibration
from .hydra_formulas import ensemble_log_probs, log_prob_uncertainty
from .hydra_layers import HydraClassifierOutput, HydraMemberLinear, LayerOutputs, ensemble_outputs, rows_linear

# The cache is ``cache`` in and out, transformers' name (``generate()`` passes and reads it); the older
# ``past_key_values`` is renamed to it with transformers' own deprecation, as its decoders' forwards do.
cache_argument = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")

# a layer's attention type -> transformers' function building its mask (padding, causality, sliding window)
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"
CAUSAL_MASKS = {FULL_ATTENTION: create_causal_mask, SLIDING_ATTENTION: create_sliding_window_causal_mask}


@dataclass
class HydraDecoderOutput(ModelOutput):
    """Output of the fused decoder.

    Args:
        last_hidden_state: ``(B, T, d)`` the members' mean of ``member_last_hidden_state``.
        cache: the key/value cache (every member's kept key/value heads), with ``use_cache``.
        hidden_states, attentions: as in ``HydraModelOutput``: ``hidden_states[l] (B, T, d)``, the embeddings
            then the members' mean after every layer, the last one ``last_hidden_state`` (after the final
            norm, as transformers' language models return it); attentions ``(B, K_l, T, S)`` over the K_l kept
            query heads of layer l in member order, with eager attention.
        member_last_hidden_state: ``(B, M, T, d)`` every member's final hidden states (after its final norm).
        member_hidden_states: per layer ``(B, M, T, d)``, every member's stream (the last one
            ``member_last_hidden_state``), with ``output_member_hidden_states=True`` (``output_hidden_states``
            adds only the standard ``hidden_states``, as transformers' contract has it); ``retain_grad()`` on them
            receives member m's gradient in slot ``[:, m]``.
    """

    last_hidden_state: torch.Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    member_last_hidden_state: torch.Tensor | None = None
    member_hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class HydraCausalLMOutput(ModelOutput):
    """Output of the fused causal LM.

    Args:
        loss: mean over members of each member's next-token cross-entropy, when ``labels`` are given.
        logits: ``(B, T, V)`` log of the mean of the members' next-token softmaxes.
        member_logits: ``(B, M, T, V)`` every member's own logits.
        cache, hidden_states, attentions, member_hidden_states: as in ``HydraDecoderOutput``.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    member_logits: torch.Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    member_hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class HydraGenerateOutput(ModelOutput):
    """What ``generate_with_uncertainty`` (:class:`HydraGenerationUncertaintyMixin`) returns.

    Args:
        sequences: ``(B, P + N)`` the prompts and the N generated tokens (as ``generate()`` returns them).
        token_entropy: ``(B, N)`` predictive entropy (nats) of the ensemble's distribution each generated
            token was drawn from.
        token_mutual_information: ``(B, N)`` mutual information between the prediction and the member
            (predictive entropy minus the members' mean entropy): the members' disagreement.
        token_probability: ``(B, N)`` the ensemble's probability of the generated token.
        member_top_tokens: ``(B, N, M)`` every member's most likely token at that step.
        generated_mask: ``(B, N)`` 1 for generated tokens, 0 after the end of a sequence (padding).
        sequence_entropy, sequence_mutual_information: ``(B,)`` the means over each sequence's generated tokens.
    """

    sequences: torch.Tensor | None = None
    token_entropy: torch.Tensor | None = None
    token_mutual_information: torch.Tensor | None = None
    token_probability: torch.Tensor | None = None
    member_top_tokens: torch.Tensor | None = None
    generated_mask: torch.Tensor | None = None
    sequence_entropy: torch.Tensor | None = None
    sequence_mutual_information: torch.Tensor | None = None


# token score -> the output field holding it
GENERATION_SCORES = dict(zip(GENERATION_SCORE_NAMES, ("token_entropy", "token_mutual_information")))


def add_generation_abstention(out: HydraGenerateOutput, calibration: Any) -> HydraGenerateOutput:
    """``out`` with ``token_abstain (B, N)`` and ``sequence_abstain (B,)`` (bool) when ``calibration`` (the
    config's, from ``hydra-hf calibrate`` on a causal LM) holds thresholds on a token score: a token abstains
    when its score is above ``token_threshold``, a sequence when its mean score is above
    ``sequence_threshold``. Without such a calibration ``out`` is returned as it is; a calibration that is not
    what `hydra-hf calibrate` stores (:func:`check_calibration`) is a ``ValueError``."""
    calibration = check_calibration(calibration)
    if calibration is None or calibration.get("task") != "causal_lm":
        return out
    tokens = out[GENERATION_SCORES[calibration["score"]]]  # (B, N), 0 after the end of sequence
    mask = out.generated_mask.bool()  # (B, N)
    sequence = (tokens * mask).sum(-1) / mask.sum(-1).clamp_min(1)  # (B,)
    out["token_abstain"] = (tokens > float(calibration["token_threshold"])) & mask
    out["sequence_abstain"] = sequence > float(calibration["sequence_threshold"])
    return out


def token_uncertainty(member_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position uncertainty of an ensemble from ``member_logits (..., M, V)``: ``entropy`` and
    ``mutual_information`` ``(...)`` (nats), the ensemble ``log_probs (..., V)`` and ``member_top (..., M)``
    (``hydra_formulas.log_prob_uncertainty``)."""
    u = log_prob_uncertainty(F.log_softmax(member_logits.float(), dim=-1), dim=-2)  # members (..., M, V)
    return {
        "entropy": u["predictive_entropy"],
        "mutual_information": u["mutual_information"],
        "log_probs": u["log_probs"],
        "member_top": member_logits.argmax(-1),
    }


def ensemble_lm_outputs(
    member_logits: torch.Tensor, labels: torch.Tensor | None, num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The causal LM's ``logits (B, T, V)`` (log of the mean of the members' softmaxes, from
    ``member_logits (B, M, T, V)``) and, with ``labels (B, T)`` (shifted here, -100 ignored), the mean over
    members of each member's next-token cross-entropy. ``shift_labels (B, T)``: the targets already shifted
    (position t's next token; what transformers' Trainer passes under sequence or context parallelism, where
    a shard cannot shift its own labels), used as given, as transformers' causal-LM loss does.

    ``num_items_in_batch``: the number of target tokens in all the batches of one optimiser step (what
    transformers' ``Trainer`` passes with gradient accumulation, as to its own causal LMs): the loss is then the
    summed cross-entropy over members and tokens divided by ``M * num_items_in_batch``, so that the
    accumulated loss is the mean over every token of the step."""
    logits = ensemble_log_probs(member_logits, dim=1)  # (B, T, V)
    loss = None
    if labels is not None:
        M, V = member_logits.shape[1], member_logits.shape[-1]
        if shift_labels is None:
            shift = member_logits[:, :, :-1].float()  # (B, M, T-1, V)
            target = labels[:, 1:].to(shift.device)  # (B, T-1)
        else:
            shift = member_logits.float()  # (B, M, T, V)
            target = shift_labels.to(shift.device)  # (B, T)
        target = target[:, None].expand(-1, M, -1)  # every member predicts the same tokens
        if num_items_in_batch is None:
            loss = F.cross_entropy(shift.reshape(-1, V), target.reshape(-1), ignore_index=-100)
        else:
            total = F.cross_entropy(shift.reshape(-1, V), target.reshape(-1), ignore_index=-100, reduction="sum")
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(total.device)
            loss = total / (M * num_items_in_batch)
    return logits, loss


def last_token_index(input_ids: torch.Tensor | None, pad_token_id: int | None, batch: int) -> torch.Tensor | int:
    """Every row's last non-padding token, as transformers' sequence classifiers pool (left or right
    padding: the rightmost token that is not ``pad_token_id``; -1 without input ids or a pad token)."""
    if pad_token_id is None:
        if batch != 1:
            raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
        return -1
    if input_ids is None:
        return -1
    non_pad = (input_ids != pad_token_id).to(torch.int32)
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device, dtype=torch.int32)
    return (positions * non_pad).argmax(-1)


def resized_member_lm_head(
    old: HydraMemberLinear, new_num_tokens: int | None, mean_resizing: bool, std: float
) -> HydraMemberLinear:
    """Per-member LM heads ``weight (M, V, d)`` resized to ``new_num_tokens`` rows per member, as transformers'
    ``_get_resized_lm_head`` resizes one head: the first ``min(V, new)`` rows copied, added rows set to each
    member's mean row (``mean_resizing``: new tokens do not move the members' next-token distributions) or
    drawn from ``N(0, std)``; ``resize_token_embeddings`` calls it through the causal LMs."""
    if new_num_tokens is None:
        return old
    M, V, d = old.weight.shape
    if new_num_tokens == V:
        return old
    new = HydraMemberLinear(M, d, new_num_tokens, bias=old.bias is not None).to(old.weight.device, old.weight.dtype)
    keep = min(V, new_num_tokens)
    with torch.no_grad():
        new.weight[:, :keep] = old.weight[:, :keep]
        if new_num_tokens > V:
            if mean_resizing:
                new.weight[:, V:] = old.weight.float().mean(1, keepdim=True).to(old.weight.dtype)
            else:
                new.weight[:, V:].normal_(0.0, std)
        if old.bias is not None:
            new.bias[:, :keep] = old.bias[:, :keep]
            if new_num_tokens > V:
                new.bias[:, V:] = old.bias.float().mean(1, keepdim=True).to(old.bias.dtype) if mean_resizing else 0.0
    return new


class HydraDecoderModelMixin:
    """The fused decoder's forward, put before the family's pre-trained class:
    ``class HydraEnsembleXModel(HydraDecoderModelMixin, HydraEnsembleXPreTrainedModel)``.

    Shared token embeddings (``get_input_embeddings()``) feed M residual streams through the layers, which read
    one key/value cache (every member's kept key/value heads) and the causal masks transformers builds for the
    base (``mask_config``); every member's final norm ends it. The family's model defines its modules, names
    two of them (``layers_name``: the fused layers, each with an ``attention_type``, a key of ``CAUSAL_MASKS``,
    called as ``layer(hidden, mask, position_embeddings, cache, output_attentions)``; ``norm_name``: every
    member's final norm, ``(M, B, T, d)`` -> ``(M, B, T, d)``), and where the base has them overrides ``embed``
    (learned positions, token types: GPT-2) and ``position_embeddings`` (rotary tables: Llama).
    """

    gradient_checkpointing = False  # transformers' gradient_checkpointing_enable() sets it on the model
    layers_name: str  # the attribute holding the fused layers, in order (an nn.ModuleList)
    norm_name: str  # the attribute holding every member's final norm

    def embed(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """What the first layer reads, ``(B, T, d)``, from the token embeddings (default: those; the others are
        the base's: a decoder without learned positions or token types ignores them, as transformers' does)."""
        return inputs_embeds

    def position_embeddings(self, embeddings: torch.Tensor, position_ids: torch.Tensor) -> tuple | None:
        """What every layer's attention takes for the positions (rotary ``(cos, sin)``), or None."""
        return None

    def mask_config(self):
        """The base config the causal masks and the cache are built from, with this model's attention
        implementation (transformers' own mask functions: padding, causality and sliding windows)."""
        base = self.base_config(self.config)
        base._attn_implementation = self.config._attn_implementation
        return base

    @cache_argument
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        token_type_ids: torch.LongTensor | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraDecoderOutput | tuple:
        """
        Args:
            input_ids: ``(B, T)`` token ids (or ``inputs_embeds (B, T, d)``).
            attention_mask: ``(B, S)`` 1 for tokens, 0 for padding (left or right), over the cached and new tokens.
            position_ids: ``(B, T)``; default: the cache's length plus ``0..T-1``, as transformers does.
            cache: a transformers ``Cache`` (``DynamicCache``) to read and extend (``past_key_values``: its
                deprecated name); with ``use_cache`` and no cache, a new one is made for the base's layer types.
            token_type_ids: ``(B, T)``, embedded and added where the base does it (GPT-2).
            output_member_hidden_states: also return every member's per-layer streams (``member_hidden_states``);
                ``output_hidden_states`` returns only the standard ``hidden_states``.
        Returns:
            ``HydraDecoderOutput``: ``last_hidden_state (B, T, d)`` (the members' mean), ``cache``,
            ``hidden_states``, ``attentions``, ``member_last_hidden_state (B, M, T, d)``, ``member_hidden_states``.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if use_cache is None:  # a converted base_config leaves use_cache out (not an architecture setting)
            use_cache = getattr(self.config, "use_cache", True)
        if self.gradient_checkpointing and self.training:
            use_cache = False  # recomputed layers would write the cache twice
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        inputs_embeds = self.get_input_embeddings()(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, d)
        base = self.mask_config()
        if use_cache and cache is None:
            cache = DynamicCache(config=base)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past).unsqueeze(0)
        embeddings = self.embed(inputs_embeds, position_ids, token_type_ids)  # (B, T, d)
        layers = self.get_submodule(self.layers_name)
        # eager attention reads only the mask (it has no is_causal path): never let the mask be skipped
        masks = {
            kind: CAUSAL_MASKS[kind](
                config=base, inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=cache,
                position_ids=position_ids, allow_is_causal_skip=self.config._attn_implementation != "eager",
            )
            for kind in {layer.attention_type for layer in layers}
        }
        positions = self.position_embeddings(embeddings, position_ids)  # rotary (cos, sin), each (B or 1, T, dk)

        record = output_hidden_states or output_member_hidden_states  # the layers record the streams for either
        outs = LayerOutputs(embeddings, self.config.num_members, record, output_attentions)
        for layer in layers:
            outs.add(*layer(outs.input, masks[layer.attention_type], positions, cache if use_cache else None,
                            output_attentions))
        last = self.get_submodule(self.norm_name)(outs.streams()).transpose(0, 1)  # (B, M, T, d)
        fields = outs.output_fields(
            last, tie_last=True, hidden_states=output_hidden_states, member_hidden_states=output_member_hidden_states
        )
        out = HydraDecoderOutput(cache=cache if use_cache else None, attentions=outs.attentions, **fields)
        return out if return_dict else out.to_tuple()


class HydraDecoderClassifierMixin:
    """The fused decoder's sequence classifier, put before the family's pre-trained class, with
    ``decoder_class`` (the family's fused decoder, held as ``self.hydra``): M pruned decoder classifiers in one
    model; every member's ``score_m`` (no bias) reads its last non-padding token, as transformers' decoder
    classifiers pool; ``logits`` = log of the mean of the members' softmaxes. ``AutoModelForSequenceClassification``
    and ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use it."""

    decoder_class: type
    # the loss is a mean per batch, whatever keyword arguments forward takes: transformers' Trainer divides it by
    # the gradient accumulation steps itself (it assumed the loss summed over num_items_in_batch: steps too large)
    accepts_loss_kwargs = False

    def __init__(self, config) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.hydra = self.decoder_class(config)
        self.score = HydraMemberLinear(config.num_members, config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.hydra.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.hydra.set_input_embeddings(value)

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
        output_attentions=None, output_hidden_states=None, return_dict=None, token_type_ids=None,
        output_member_hidden_states: bool = False, **kwargs,
    ) -> HydraClassifierOutput | tuple:
        """``labels (B,)``: mean over members of each member's loss. Returns ``logits (B, C)``,
        ``member_logits (B, M, C)``."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.hydra(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids, use_cache=False, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, return_dict=True,
            output_member_hidden_states=output_member_hidden_states,
        )
        hidden = outputs.member_last_hidden_state  # (B, M, T, d)
        B = hidden.shape[0]
        last = last_token_index(input_ids, self.config.pad_token_id, B)
        pooled = hidden[torch.arange(B, device=hidden.device), :, last]  # (B, M, d)
        member_logits = self.score(pooled.transpose(0, 1)).transpose(0, 1)  # (B, M, C)
        logits, loss = ensemble_outputs(member_logits, labels, self.config)
        out = HydraClassifierOutput(
            loss=loss, logits=logits, member_logits=member_logits, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions, member_hidden_states=outputs.member_hidden_states,
        )
        return out if return_dict else out.to_tuple()


class HydraGenerationUncertaintyMixin:
    """``score_generated`` and ``generate_with_uncertainty`` for a fused causal LM whose forward takes
    ``input_ids``, ``attention_mask``, ``position_ids``, ``use_cache``, ``logits_to_keep`` and returns
    ``member_logits (B, M, T, V)`` (with transformers' ``GenerationMixin`` for ``generate``)."""

    @torch.no_grad()
    def score_generated(
        self, sequences: torch.Tensor, prompt_length: int, attention_mask: torch.Tensor | None = None,
        pad_token_id: int | None = None, eos_token_id: int | list[int] | None = None,
    ) -> HydraGenerateOutput:
        """Per-token uncertainty of generated tokens, from one forward pass over ``sequences (B, P + N)``.

        The distribution of generated token t is the one the model decoded it from (the same prefix; with the
        cache the numbers agree to float rounding), so this works after any decoding mode (greedy, sampling,
        beam search). ``attention_mask (B, P)`` is the prompts' mask (left padding); tokens after a sequence's
        end-of-sequence token are masked out (``generated_mask``).
        """
        B, total = sequences.shape
        N = total - prompt_length
        if not 1 <= prompt_length <= total:
            raise ValueError(
                f"prompt_length={prompt_length} for sequences of {total} tokens; the prompt holds at least the token "
                "generation started from (generate() without input_ids starts from the start-of-sequence token: 1)"
            )
        if attention_mask is None:
            attention_mask = torch.ones(B, prompt_length, dtype=torch.long, device=sequences.device)
        if tuple(attention_mask.shape) != (B, prompt_length):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the {B} sequences have {prompt_length} "
                "prompt tokens; give the prompts' mask repeated for every returned sequence "
                "(attention_mask.repeat_interleave(num_return_sequences, dim=0))"
            )
        generated = sequences[:, prompt_length:]
        gen_mask = torch.ones_like(generated, dtype=torch.long)
        eos = eos_token_id if eos_token_id is not None else self.generation_config.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        if eos:
            is_eos = torch.isin(generated, torch.tensor(eos, device=generated.device))
            after = (is_eos.cumsum(-1) - is_eos.long()) > 0  # strictly after the first end of sequence
            gen_mask = gen_mask.masked_fill(after, 0)
        mask = torch.cat([attention_mask.to(gen_mask.dtype), gen_mask], dim=1)  # (B, P + N)
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate() numbers left-padded rows
        out = self(input_ids=sequences, attention_mask=mask, position_ids=position_ids, use_cache=False,
                   logits_to_keep=N + 1, return_dict=True)
        member_logits = out.member_logits[:, :, :-1].transpose(1, 2)  # (B, N, M, V): the step that drew token t
        u = token_uncertainty(member_logits)
        token_p = u["log_probs"].gather(-1, generated[..., None]).squeeze(-1).exp()  # (B, N)
        w = gen_mask.float()
        denom = w.sum(-1).clamp_min(1.0)
        return HydraGenerateOutput(
            sequences=sequences, token_entropy=u["entropy"] * w, token_mutual_information=u["mutual_information"] * w,
            token_probability=token_p * w, member_top_tokens=u["member_top"], generated_mask=gen_mask,
            sequence_entropy=(u["entropy"] * w).sum(-1) / denom,
            sequence_mutual_information=(u["mutual_information"] * w).sum(-1) / denom,
        )

    def generate_with_uncertainty(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                                  **generate_kwargs) -> HydraGenerateOutput:
        """``generate()`` (any decoding mode it supports), then the per-token uncertainty of what it generated
        (:meth:`score_generated`): entropy, mutual information, the token's probability, every member's top token."""
        generate_kwargs.pop("return_dict_in_generate", None)
        sequences = self.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
        if attention_mask is not None:  # generate() returns num_return_sequences rows per prompt, in prompt order
            attention_mask = attention_mask.repeat_interleave(sequences.shape[0] // input_ids.shape[0], dim=0)
        out = self.score_generated(sequences, input_ids.shape[1], attention_mask,
                                   eos_token_id=generate_kwargs.get("eos_token_id"))
        return add_generation_abstention(out, getattr(self.config, "calibration", None))


class HydraCausalLMMixin(HydraGenerationUncertaintyMixin):
    """What every fused causal LM shares, put before the family's pre-trained class:
    ``class HydraEnsembleXForCausalLM(HydraCausalLMMixin, HydraEnsembleXPreTrainedModel, GenerationMixin)`` with
    ``decoder_class`` (the family's fused decoder, held as ``self.hydra``) and ``embeddings_name`` (its token
    embeddings' attribute, ``"embed_tokens"`` / ``"wte"``).

    The language-model head is one ``nn.Linear`` shared by all members (tied to the token embeddings when the
    base ties them) or, with ``lm_head_fusion="per_member"``, a ``HydraMemberLinear`` (every member's own);
    ``resize_token_embeddings`` resizes either. ``generate()`` decodes from ``logits`` = log of the members'
    mean softmax; the uncertainty of what it generated comes from ``HydraGenerationUncertaintyMixin``.
    """

    decoder_class: type
    embeddings_name: str

    def __init__(self, config) -> None:
        per_member = config.lm_head_fusion == "per_member"
        # the input and output embeddings are one tensor when the base ties them and the head is shared
        self._tied_weights_keys = None if per_member else {"lm_head.weight": f"hydra.{self.embeddings_name}.weight"}
        super().__init__(config)
        # decoding settings the base's config holds (end-of-sequence, padding and start tokens)
        base = self.base_config(config)
        generation = self.generation_config
        if generation.bos_token_id is None:
            generation.bos_token_id = base.bos_token_id
        if generation.eos_token_id is None:
            generation.eos_token_id = base.eos_token_id
        if generation.pad_token_id is None:
            generation.pad_token_id = base.pad_token_id
        self.hydra = self.decoder_class(config)
        V, d = config.vocab_size, config.hidden_size
        if per_member:
            self.lm_head = HydraMemberLinear(config.num_members, d, V, bias=False)
        else:
            self.lm_head = nn.Linear(d, V, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.hydra.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.hydra.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def _get_resized_lm_head(self, old_lm_head, new_num_tokens=None, transposed=False, mean_resizing=True):
        """``resize_token_embeddings`` resizes per-member heads too (transformers' resizes one ``nn.Linear``)."""
        if isinstance(old_lm_head, HydraMemberLinear):
            std = self.config.base_config.get("initializer_range", 0.02)
            return resized_member_lm_head(old_lm_head, new_num_tokens, mean_resizing, std)
        return super()._get_resized_lm_head(old_lm_head, new_num_tokens, transposed, mean_resizing)

    def member_logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(B, M, T, d)`` final hidden states -> ``(B, M, T, V)`` every member's logits."""
        if isinstance(self.lm_head, HydraMemberLinear):
            return self.lm_head(hidden.transpose(0, 1)).transpose(0, 1)
        # one product for all members over contiguous 2-D rows: under CPU bf16 autocast, F.linear of the 4-D
        # input sliced to the last positions (``logits_to_keep``) takes a slow path (measured, one thread: a
        # 3-member SmolLM2 Hydra's 16-review zero-shot batch 53 s before, 18 s after; fp32 unchanged; the same
        # probabilities)
        flat = rows_linear(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight, self.lm_head.bias)
        return flat.view(*hidden.shape[:-1], flat.shape[-1])

    @cache_argument
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        token_type_ids: torch.LongTensor | None = None,
        output_member_hidden_states: bool = False,
        **kwargs,
    ) -> HydraCausalLMOutput | tuple:
        """
        Args:
            labels: ``(B, T)`` the input ids (shifted inside, -100 ignored): the loss is the mean over members of
                each member's next-token cross-entropy (with transformers' Trainer and gradient accumulation:
                the sum over members and tokens divided by ``M * num_items_in_batch``, as its causal LMs do).
                ``shift_labels`` (a keyword, with ``labels``): targets already shifted, used as given.
            cache: a transformers ``Cache`` to read and extend (``past_key_values``: its deprecated name).
            logits_to_keep: compute logits for the last ``logits_to_keep`` positions only (0: all), as
                transformers' causal LMs (``generate()`` keeps 1).
            token_type_ids: GPT-2's token types (embedded like tokens); other decoders have none.
            output_member_hidden_states: also return every member's per-layer streams (``member_hidden_states``).
        Returns:
            ``HydraCausalLMOutput``: ``logits (B, T', V)``, ``member_logits (B, M, T', V)``, ``loss``, ``cache``.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.hydra(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            inputs_embeds=inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, return_dict=True, token_type_ids=token_type_ids,
            output_member_hidden_states=output_member_hidden_states,
        )
        hidden = outputs.member_last_hidden_state  # (B, M, T, d)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        member_logits = self.member_logits_of(hidden[:, :, keep])  # (B, M, T', V)
        shift_labels = kwargs.get("shift_labels") if labels is not None else None
        logits, loss = ensemble_lm_outputs(member_logits, labels, kwargs.get("num_items_in_batch"), shift_labels)
        out = HydraCausalLMOutput(
            loss=loss, logits=logits, member_logits=member_logits, cache=outputs.cache,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
            member_hidden_states=outputs.member_hidden_states,
        )
        return out if return_dict else out.to_tuple()
