"""kog's inference engine: models, tokenizers, backends and the Session API. No UI code."""

__version__ = "0.1.0"
