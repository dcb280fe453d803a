"""Sampling parameters and the reference sampler.

The order of the logit processors follows the common convention (repetition penalty,
temperature, top-k, top-p, min-p). Randomness comes from a counter-based generator —
`uniform(seed, step)` is a pure function of its arguments — so the same seed gives the same
tokens, and a GPU kernel can draw the very same numbers without sharing any state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.errors import KogError

_MASK64 = (1 << 64) - 1


MIN_TEMPERATURE = 1e-6  # temperatures below it decode greedily


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (or below MIN_TEMPERATURE) means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise KogError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise KogError(f"top-k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise KogError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise KogError(f"min-p must be in [0, 1), got {self.min_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise KogError(f"repetition penalty must be a finite number > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE the fp32 logits / temperature overflow (or the float is 0), and
        # sampling could differ from greedy only between logits within ~1e-6 of each other.
        return self.temperature < MIN_TEMPERATURE


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijective 64-bit hash with good avalanche."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, step: int) -> float:
    """A float in [0, 1) determined by (seed, step) alone; 24 bits, exact in fp32."""
    h = _mix64((_mix64(seed & _MASK64) + step * 0x9E3779B97F4A7C15) & _MASK64)
    return (h >> 40) / float(1 << 24)


def apply_repetition_penalty(logits: np.ndarray, history: np.ndarray, penalty: float) -> np.ndarray:
    if penalty == 1.0 or len(history) == 0:
        return logits
    ids = np.unique(history)
    picked = logits[ids]
    logits = logits.copy()
    logits[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def sample(logits: np.ndarray, params: SamplingParams, history: np.ndarray, step: int) -> int:
    """Pick the next token from fp32 `logits`; `history` is every token in the context so far."""
    logits = apply_repetition_penalty(logits.astype(np.float32, copy=False), history, params.repetition_penalty)
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits / np.float32(params.temperature)
    order = np.argsort(-scaled, kind="stable")
    if params.top_k:
        order = order[: params.top_k]
    top = scaled[order]
    weights = np.exp(top - top[0])  # fp32, relative to the most likely token
    # float64 sums: the pick must not depend on summation order (a GPU sums in another order)
    probs = weights.astype(np.float64) / weights.astype(np.float64).sum()
    keep = len(order)
    if params.top_p < 1.0:
        # smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
    if params.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(weights >= np.float32(params.min_p))))
    cdf = np.cumsum(probs[:keep])
    u = uniform(params.seed, step) * cdf[-1]
    return int(order[min(int(np.searchsorted(cdf, u, side="right")), keep - 1)])
