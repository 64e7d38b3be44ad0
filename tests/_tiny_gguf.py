"""Tiny GGUF checkpoints written with the ``gguf`` package's GGUFWriter (llama.cpp's tensor names and metadata):
a 2-layer Llama with grouped-query attention and a byte-pair tokenizer (its unknown token ``<|endoftext|>``,
which transformers adds to a GPT-2-style GGUF vocabulary that lacks it), read by transformers' GGUF loader in a
second, and files of architectures hydra_hf builds no Hydra of."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
TOKENS = ["<|endoftext|>", "<s>", "</s>", *LETTERS, "Ġ", "th", "the", "Ġthe"]
MERGES = ["t h", "th e", "Ġ the"]
LAYERS, HIDDEN, HEADS, KV_HEADS, INNER = 2, 32, 4, 2, 48


def write_tiny_gguf(path: Path, *, arch: str = "llama", seed: int = 0, tied: bool = True) -> Path:
    """A tiny decoder GGUF of ``arch`` (fp32 tensors, file type ALL_F32): Llama's tensors and metadata; for
    another ``arch`` the same layout under that name (read only as far as its ``general.architecture``)."""
    import gguf  # the [gguf] extra

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INNER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    rng = np.random.default_rng(seed)

    def tensor(*shape: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.2 * rng.standard_normal(shape)).astype(np.float32)

    dk = HIDDEN // HEADS
    writer.add_tensor("token_embd.weight", tensor(len(TOKENS), HIDDEN))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", tensor(HIDDEN, around=1.0))
        writer.add_tensor(f"blk.{i}.attn_q.weight", tensor(HEADS * dk, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_k.weight", tensor(KV_HEADS * dk, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_v.weight", tensor(KV_HEADS * dk, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_output.weight", tensor(HIDDEN, HEADS * dk))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", tensor(HIDDEN, around=1.0))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", tensor(INNER, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", tensor(INNER, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", tensor(HIDDEN, INNER))
    writer.add_tensor("output_norm.weight", tensor(HIDDEN, around=1.0))
    if not tied:
        writer.add_tensor("output.weight", tensor(len(TOKENS), HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_texts(path: Path, n: int = 12) -> Path:
    """A csv of short texts the tiny tokenizer reads (letters, spaces and "the")."""
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "the end"]
    rows = [" ".join(words[(i + k) % len(words)] for k in range(3 + i % 4)) for i in range(n)]
    path.write_text("text,label\n" + "".join(f"{row},{i % 2}\n" for i, row in enumerate(rows)))
    return path
