"""Load a GGUF file: metadata -> ModelConfig, tensors dequantized to fp32 with HF names.

llama.cpp's converter reorders the rows of Q and K in llama-architecture files (it pairs
rotary dimensions as interleaved instead of split halves); `_unpermute` restores the
Hugging Face order so one RoPE convention serves every format.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.config import ModelConfig
from engine.errors import KogError

SUPPORTED_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
SUPPORTED_ARCHS = {"llama", "qwen2", "qwen3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def open_reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except FileNotFoundError:
        raise KogError(f"missing model file {path}") from None
    except Exception as e:  # the reader raises assorted errors on a truncated or foreign file
        raise KogError(f"corrupt or truncated GGUF file {path}: {type(e).__name__}: {e}") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return f.contents() if f is not None else default


def _positive(reader, key: str, path: Path, default: int | None = None) -> int:
    """A positive integer field; `default` where the file has none (None: the model cannot be built without it)."""
    value = _field(reader, key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise KogError(f"{path} lacks a valid {key} ({value!r}): not a complete GGUF model")
    return value


def _number(reader, key: str, path: Path, default: float) -> float:
    value = _field(reader, key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise KogError(f"{path} lacks a valid {key} ({value!r}): not a complete GGUF model")
    return float(value)


def read_config(reader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise KogError(f"unsupported GGUF architecture {arch!r} in {path} (kog runs: {', '.join(sorted(SUPPORTED_ARCHS))})")
    heads = _positive(reader, f"{arch}.attention.head_count", path)
    hidden = _positive(reader, f"{arch}.embedding_length", path)
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens", []))
    # end of sequence, end of turn, end of message: the converted copy keeps them all as eos ids
    stops = [_field(reader, f"tokenizer.ggml.{kind}_token_id") for kind in ("eos", "eot", "eom")]
    config = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_positive(reader, f"{arch}.feed_forward_length", path),
        num_layers=_positive(reader, f"{arch}.block_count", path),
        num_heads=heads,
        num_kv_heads=_positive(reader, f"{arch}.attention.head_count_kv", path, heads),
        head_dim=_positive(reader, f"{arch}.attention.key_length", path, hidden // heads or None),
        rms_norm_eps=_number(reader, f"{arch}.attention.layer_norm_rms_epsilon", path, 1e-6),
        rope_theta=_number(reader, f"{arch}.rope.freq_base", path, 10000.0),
        max_context=_positive(reader, f"{arch}.context_length", path, 2048),
        tie_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(i for i in stops if i is not None)),
        rope_scaling=_rope_scaling(reader, arch, path),
    )
    try:  # what the converted copy's config.json would be refused for, refused before anything is converted
        ModelConfig.from_hf(config.to_hf())
    except KogError as e:
        raise KogError(f"{path}: {e}") from None
    return config


def _rope_scaling(reader, arch: str, path: Path) -> dict | None:
    """Linear scaling from the GGUF's keys; Llama 3's comes as the rope_freqs tensor instead."""
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if kind != "linear":
        raise KogError(f"unsupported rope scaling type {kind!r} in {path} (kog runs linear)")
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise KogError(f"{path} lacks a valid {arch}.rope.scaling.factor ({factor!r})")
    return {"rope_type": "linear", "factor": float(factor)}


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_weights(reader, config: ModelConfig, path: Path) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    weights = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            raise KogError(f"unexpected tensor {t.name!r} in {path}")
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise KogError(
                f"unsupported GGUF tensor type {t.tensor_type.name} ({t.name}) in {path}; "
                f"kog reads {', '.join(sorted(SUPPORTED_TYPES))}"
            )
        try:
            w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except Exception as e:
            raise KogError(f"corrupt tensor {t.name} in {path}: {e}") from None
        if config.arch == "llama" and name.endswith("q_proj.weight"):
            w = _unpermute(w, config.num_heads)
        elif config.arch == "llama" and name.endswith("k_proj.weight"):
            w = _unpermute(w, config.num_kv_heads)
        weights[name] = w
    return weights
