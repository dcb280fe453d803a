"""A model ready to run: its config, its weights (host arrays) and its tokenizer.

Weights use Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`, ...), the
layout every loader converts to, so backends know one naming only. Linear weights are
[out_features, in_features]. Tied models have no `lm_head.weight`: use the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.config import ModelConfig

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    weights: dict[str, np.ndarray]
    tokenizer: "Tokenizer"
    source: str  # the path it was loaded from
    target: str = ""  # what engine.api.load takes to load it again: its registry name, else `source`

    def __post_init__(self):
        self.target = self.target or self.source

    def lm_head(self) -> np.ndarray:
        return self.weights.get("lm_head.weight", self.weights["model.embed_tokens.weight"])

    @property
    def stop_ids(self) -> set[int]:
        """Ids that end a reply: the tokenizer's end-of-turn tokens and the config's eos ids."""
        return self.tokenizer.stop_ids | set(self.config.eos_token_ids)
