"""Random weights at a model's real shapes, for benchmarks of models that are not downloaded.

Speed depends on shapes, not on values, so a model built from models.toml's `shape` streams
exactly the bytes the real one would. Values are random, never zeros, and scaled so that
greedy decoding is well defined: a default initialization (std 0.02) gives nearly flat
logits, where the last rounding bit decides the argmax and two correct backends disagree.
So matrices are N(0, 1/fan_in) (every layer moves the residual stream), embeddings
N(0, 0.05²), norm weights 1 + N(0, 0.1²), biases N(0, 0.1²). The tokenizer names each id
`<N>`: enough to stream text, and plainly not a language model's output.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer as Backend
from tokenizers import models

from engine.config import ModelConfig
from engine.loaders.safetensors_dir import expected_shapes
from engine.model import LoadedModel
from engine.tokenizer import Tokenizer

EMBEDDING_STD = 0.05


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    vocab = {f"<{i}>": i for i in range(vocab_size)}
    return Tokenizer(Backend(models.WordLevel(vocab, unk_token="<0>")))


def synthetic_model(name: str, config: ModelConfig, seed: int) -> LoadedModel:
    rng = np.random.default_rng(seed)
    weights = {}
    for key, shape in expected_shapes(config).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if key.endswith(".bias"):
            weights[key] = noise * np.float32(0.1)
        elif len(shape) == 1:  # norm weights
            weights[key] = np.float32(1.0) + noise * np.float32(0.1)
        elif key in ("model.embed_tokens.weight", "lm_head.weight"):
            weights[key] = noise * np.float32(EMBEDDING_STD)
        else:
            weights[key] = noise / np.float32(np.sqrt(shape[1]))
    return LoadedModel(
        name=name, config=config, weights=weights, tokenizer=synthetic_tokenizer(config.vocab_size),
        source="synthetic weights at the real shapes",
    )
