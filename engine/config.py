"""The shape of a decoder-only transformer, independent of the file format it came from.

Every loader produces a `ModelConfig`; every backend consumes one. Architectures differ only
in a few switches (QKV bias, per-head q/k norm, tied embeddings, RoPE scaling), so one
config and one forward pass cover Llama, Mistral-style, Qwen2 and Qwen3 models.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import KogError

# HF `architectures` / `model_type` values -> the family whose switches they use.
ARCH_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
}


@dataclass
class ModelConfig:
    arch: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_context: int
    tie_embeddings: bool
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    def parameter_count(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        embeddings = v * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h

    def weights_read_per_token(self) -> int:
        """Parameters one decode step streams: every matrix and norm, the LM head, but of the
        input embedding only one row (when it is not tied to the LM head)."""
        untied_embedding = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.parameter_count() - untied_embedding

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        names = list(cfg.get("architectures") or []) + [cfg.get("model_type", "")]
        arch = next((ARCH_FAMILIES[n] for n in names if n in ARCH_FAMILIES), None)
        if arch is None:
            raise KogError(
                f"unsupported architecture {names[0] if names else 'unknown'!r} "
                f"(kog runs: {', '.join(sorted(n for n in ARCH_FAMILIES if n.endswith('ForCausalLM')))})"
            )
        _check_supported(cfg, arch)
        context = _positive_int(cfg, "max_position_embeddings", 2048)
        if cfg.get("sliding_window") and arch == "llama":
            # Mistral-style: within one window, windowed attention is full attention
            context = min(context, _positive_int(cfg, "sliding_window"))
        heads = _positive_int(cfg, "num_attention_heads")
        eos = cfg.get("eos_token_id")
        # older configs: rope_theta + rope_scaling; newer ones fold both into rope_parameters
        rope_params = cfg.get("rope_parameters") or {}
        if not isinstance(rope_params, dict):
            raise KogError(f"rope_parameters must be an object, got {rope_params!r}")
        scaling = _rope_scaling(cfg.get("rope_scaling") or rope_params)
        kv_heads = _positive_int(cfg, "num_key_value_heads", heads)
        if heads % kv_heads:
            raise KogError(f"{heads} attention heads do not share {kv_heads} key/value heads evenly")
        hidden = _positive_int(cfg, "hidden_size")
        return cls(
            arch=arch,
            vocab_size=_positive_int(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(cfg, "intermediate_size"),
            num_layers=_positive_int(cfg, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=_positive_int(cfg, "head_dim", hidden // heads or None),
            rms_norm_eps=_positive_number("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_positive_number("rope_theta", rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_context=context,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=list(eos) if isinstance(eos, list) else ([eos] if eos is not None else []),
        )

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            fields = json.loads(path.read_text())
            if not isinstance(fields, dict):
                raise TypeError(f"a JSON {type(fields).__name__}, not an object")
            return cls.from_hf(fields)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise KogError(f"corrupt model config {path}: {type(e).__name__}: {e}") from None
    def to_hf(self) -> dict:
        """The config.json a Hugging Face model of this shape would carry."""
        arch_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        cfg = {
            "architectures": [arch_class[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_context,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
            "hidden_act": "silu",
            "attention_bias": self.qkv_bias,
            "torch_dtype": "float32",
        }
        return cfg


# The keys each rope scaling kind kog implements needs (engine/rope.py).
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def _check_supported(cfg: dict, arch: str) -> None:
    """Refuse the config switches of a family that kog's forward pass does not implement: loading
    such a model anyway would give fluent-looking wrong text."""
    if cfg.get("use_sliding_window"):
        raise KogError(f"{arch} sliding-window attention is not supported")
    activation = cfg.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise KogError(f"activation {activation!r} is not supported (kog runs SiLU-gated MLPs)")
    if cfg.get("mlp_bias"):
        raise KogError("MLP biases are not supported")
    if cfg.get("attention_bias") and arch != "qwen2":  # Qwen2's own q/k/v biases are
        raise KogError(f"attention biases are not supported for {arch}")


def _positive_int(cfg: dict, key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KogError(f"config field {key} must be a positive integer, got {value!r}")
    return value


def _positive_number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise KogError(f"config field {key} must be a positive number, got {value!r}")
    return value


def _rope_scaling(scaling) -> dict | None:
    if not isinstance(scaling, dict):
        raise KogError(f"rope_scaling must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_KEYS:
        raise KogError(f"unsupported rope scaling type {kind!r} (kog runs {', '.join(ROPE_SCALING_KEYS)})")
    missing = [k for k in ROPE_SCALING_KEYS[kind] if isinstance(scaling.get(k), bool) or not isinstance(scaling.get(k), (int, float))]
    if missing:
        raise KogError(f"rope scaling {kind!r} needs the numbers {', '.join(missing)}")
    return {k: v for k, v in scaling.items() if k != "rope_theta"}
