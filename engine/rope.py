"""Rotary position embedding tables (the non-interleaved "rotate half" convention).

Computed the way the reference implementation does it — fp32 inverse frequencies, fp32
position × frequency products — so logits agree to the last bits that matter.
"""

from __future__ import annotations

import math

import numpy as np

from engine.config import ModelConfig
from engine.errors import KogError


def inverse_frequencies(config: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    dim = config.head_dim
    inv = (1.0 / (np.float32(config.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(np.float32)
    if freq_factors is not None:  # GGUF llama3 files carry the scaling as per-frequency divisors
        return (inv / freq_factors.astype(np.float32)).astype(np.float32)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / np.float32(scaling["factor"])).astype(np.float32)
    if kind == "llama3":
        return _llama3_scaled(inv, scaling)
    raise KogError(f"unsupported rope scaling type {kind!r}")


def _llama3_scaled(inv: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1+: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_context / low, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(is_mid, mid, scaled).astype(np.float32)


def cos_sin(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables of shape [len(positions), head_dim]."""
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x [tokens, heads, head_dim] by the tables [tokens, head_dim]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
