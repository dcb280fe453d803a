"""The reference backend: plain numpy, fp32 everywhere, written to be read.

Every GPU path is tested against this one, so it follows the model's math literally:
RMSNorm, Q/K/V projections (+bias for Qwen2, per-head RMSNorm for Qwen3), rotary
embedding, causal grouped-query attention over the KV cache, output projection, SwiGLU
MLP, final norm, LM head. Projections that read the same input are concatenated once at
load (QKV, gate/up), which changes no arithmetic but halves the calls per layer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from engine import rope
from engine.backends.base import Backend
from engine.errors import KogError
from engine.model import LoadedModel, layer_prefix
from engine.sampling import SamplingParams, sample

# Bounds the attention score matrix to chunk x context, and how long a cancel waits during a long
# prompt (~0.7 s on a 2-core machine; 64-token chunks prefill 20-25% slower: each reads every weight).
PREFILL_CHUNK = 256


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + np.float32(eps)) * weight


def linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x @ weight.T; one row goes through matrix-vector BLAS, which streams the weight faster."""
    if x.shape[0] == 1:
        return (weight @ x[0])[None, :]
    return x @ weight.T


def silu(x: np.ndarray) -> np.ndarray:
    # below about -88.7 exp(-x) overflows to inf and x / inf is the right -0: no warning on the user's terminal
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


class _Layer:
    def __init__(self, w: dict[str, np.ndarray], p: str, qk_norm: bool, qkv_bias: bool):
        f32 = lambda name: np.ascontiguousarray(w[p + name], dtype=np.float32)  # noqa: E731
        self.attn_norm = f32("input_layernorm.weight")
        self.mlp_norm = f32("post_attention_layernorm.weight")
        self.wqkv = np.concatenate([f32(f"self_attn.{n}_proj.weight") for n in "qkv"])
        self.bqkv = np.concatenate([f32(f"self_attn.{n}_proj.bias") for n in "qkv"]) if qkv_bias else None
        self.q_norm = f32("self_attn.q_norm.weight") if qk_norm else None
        self.k_norm = f32("self_attn.k_norm.weight") if qk_norm else None
        self.wo = f32("self_attn.o_proj.weight")
        self.w_gate_up = np.concatenate([f32("mlp.gate_proj.weight"), f32("mlp.up_proj.weight")])
        self.w_down = f32("mlp.down_proj.weight")


class CpuBackend(Backend):
    name = "cpu"
    weight_bytes = 4
    kv_bytes = 4

    def __init__(self, model: LoadedModel, max_context: int):
        super().__init__(model.config, max_context)
        c = self.config
        w = model.weights
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = np.ascontiguousarray(model.lm_head(), dtype=np.float32)
        self.final_norm = np.asarray(w["model.norm.weight"], dtype=np.float32)
        self.layers = [_Layer(w, layer_prefix(i), c.qk_norm, c.qkv_bias) for i in range(c.num_layers)]
        self.inv_freq = rope.inverse_frequencies(c, w.get("rope_freqs.weight"))
        # np.zeros maps untouched pages lazily: memory grows with the context actually used
        shape = (c.num_layers, c.num_kv_heads, max_context, c.head_dim)
        try:
            self.k_cache = np.zeros(shape, dtype=np.float32)
            self.v_cache = np.zeros(shape, dtype=np.float32)
        except MemoryError:
            size = 2 * np.prod(shape, dtype=np.int64) * self.kv_bytes
            raise KogError(f"out of memory for the KV cache of a {max_context:,}-token context ({size / 1e9:,.1f} GB): "
                           f"give a smaller --context") from None
        self.logits: np.ndarray | None = None

    @property
    def device_name(self) -> str:
        return f"CPU ({os.cpu_count()} cores)"

    def prefill(self, tokens: list[int]) -> np.ndarray:
        if self.cached_tokens + len(tokens) > self.max_context:
            raise ValueError("prefill past the end of the context")
        for start in range(0, len(tokens), PREFILL_CHUNK):
            if self._cancel.is_set():  # the K/V so far stay cached; the decode that follows yields nothing
                break
            self.logits = self._forward(tokens[start : start + PREFILL_CHUNK])
        return self.logits

    def decode(
        self, params: SamplingParams, history: list[int], max_tokens: int, stop_ids: set[int]
    ) -> Iterator[int]:
        context = np.array(history, dtype=np.int64)
        self.decode_passes = 0
        for step in range(max_tokens):
            if self._cancel.is_set():
                return
            token = sample(self.logits, params, context, step)
            yield token
            context = np.append(context, token)
            last = step == max_tokens - 1 or self.cached_tokens + 1 >= self.max_context
            if token in stop_ids or last:
                return
            self.logits = self._forward([token])
            self.decode_passes += 1

    def _forward(self, tokens: list[int]) -> np.ndarray:
        """Run `tokens` at the next cache positions and return the last position's logits."""
        c = self.config
        n, start = len(tokens), self.cached_tokens
        end = start + n
        cos, sin = rope.cos_sin(self.inv_freq, np.arange(start, end))
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        group = c.num_heads // c.num_kv_heads
        scale = np.float32(1.0 / np.sqrt(c.head_dim))
        # causal mask for the new rows against every cached column
        mask = np.where(np.arange(end)[None, :] > np.arange(start, end)[:, None], -np.inf, 0).astype(np.float32)
        x = self.embed[tokens].astype(np.float32)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            qkv = linear(h, layer.wqkv)
            if layer.bqkv is not None:
                qkv += layer.bqkv
            q = qkv[:, :q_size].reshape(n, c.num_heads, c.head_dim)
            k = qkv[:, q_size : q_size + kv_size].reshape(n, c.num_kv_heads, c.head_dim)
            v = qkv[:, q_size + kv_size :].reshape(n, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None:
                q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
            q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
            self.k_cache[i, :, start:end] = k.transpose(1, 0, 2)
            self.v_cache[i, :, start:end] = v.transpose(1, 0, 2)
            keys, values = self.k_cache[i, :, :end], self.v_cache[i, :, :end]
            # [kv_heads, group*n, head_dim]: the query heads that share one kv head, stacked
            qg = q.reshape(n, c.num_kv_heads, group, c.head_dim).transpose(1, 2, 0, 3).reshape(c.num_kv_heads, group * n, c.head_dim)
            scores = (qg @ keys.transpose(0, 2, 1)) * scale
            scores = scores.reshape(c.num_kv_heads, group, n, end) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = probs.reshape(c.num_kv_heads, group * n, end) @ values
            attn = attn.reshape(c.num_kv_heads, group, n, c.head_dim).transpose(2, 0, 1, 3).reshape(n, q_size)
            x = x + linear(attn, layer.wo)
            h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)
            gate_up = linear(h, layer.w_gate_up)
            inter = c.intermediate_size
            x = x + linear(silu(gate_up[:, :inter]) * gate_up[:, inter:], layer.w_down)
        self.cached_tokens = end
        last = rms_norm(x[-1], self.final_norm, c.rms_norm_eps)
        return self.lm_head @ last
