"""Turn a model path into a `LoadedModel`.

A GGUF file is converted once into a Hugging Face style directory (config.json, fp32
model.safetensors, tokenizer files) under the cache; later loads memory-map that directory,
which takes well under a second instead of dequantizing every time.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from pathlib import Path

from engine.errors import KogError
from engine.loaders import gguf_file
from engine.loaders.safetensors_dir import check_weights, load_dir
from engine.model import LoadedModel
from engine.paths import cache_dir, make_dir
from engine.tokenizer import Tokenizer


def load_model(path: Path, name: str | None = None) -> LoadedModel:
    path = Path(path)
    if path.is_dir():
        return load_dir(path, name)
    if path.suffix.lower() == ".gguf":
        model = load_dir(converted_dir(path), name or path.stem)
        model.source = model.target = str(path)
        return model
    if not path.exists():
        raise KogError(f"no model at {path}")
    raise KogError(f"{path} is neither a Hugging Face model directory nor a .gguf file")


# Bumped whenever a conversion's output changes (2: end-of-turn ids and rope scaling kept), so
# copies made by an older kog are made again.
CONVERSION_VERSION = 2


def conversion_of(gguf_path: Path) -> Path:
    """Where the cached conversion of `gguf_path` as it is now lives (made or not): a changed file has another."""
    try:
        stat = gguf_path.stat()
    except FileNotFoundError:
        raise KogError(f"missing model file {gguf_path}") from None
    return cache_dir() / "converted" / f"{_utf8(gguf_path.stem)}-{stat.st_size}-{stat.st_mtime_ns}-v{CONVERSION_VERSION}"


def _utf8(name: str) -> str:
    """A file name's undecodable bytes (kept by Python as surrogates, which UTF-8 text cannot hold) as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def converted_dir(gguf_path: Path) -> Path:
    """The cached conversion of `gguf_path`, made now if missing or stale."""
    target = conversion_of(gguf_path)
    source = target.name.removesuffix(f"-v{CONVERSION_VERSION}")
    if not target.exists():  # conversions are renamed into place whole, so presence means complete
        convert_gguf(gguf_path, target)
        older = [target.parent / source, *target.parent.glob(f"{glob.escape(source)}-v*")]  # older converters' copies
        older += [d for d in target.parent.glob(f"{glob.escape(_utf8(gguf_path.stem))}-*") if _source_of(d) == gguf_path.resolve()]
        for stale in older:  # (and the copies of this path's earlier file: a model pulled again gets a new mtime)
            if stale != target and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    return target


SOURCE_NOTE = "source.txt"  # in a conversion: the path of the GGUF file it was made from


def _source_of(conversion: Path) -> Path | None:
    try:
        return Path((conversion / SOURCE_NOTE).read_text(encoding="utf-8", errors="surrogateescape"))
    except OSError:
        return None  # made by an older kog, or unreadable: left alone


STAGING_PREFIX = ".converting-"  # then the converting process's id: a folder whose process is gone is litter


def convert_gguf(gguf_path: Path, target: Path) -> None:
    from safetensors.numpy import save_file

    reader = gguf_file.open_reader(gguf_path)
    config = gguf_file.read_config(reader, gguf_path)
    weights = gguf_file.read_weights(reader, config, gguf_path)
    check_weights(config, weights, gguf_path)
    tokenizer = Tokenizer.from_gguf(reader)
    make_dir(target.parent)
    _remove_abandoned_staging(target.parent)
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=target.parent))
        save_file(weights, staging / "model.safetensors", metadata={"source": _utf8(gguf_path.name)})
        tokenizer.save(staging)
        (staging / "config.json").write_text(json.dumps(config.to_hf(), indent=1))
        (staging / SOURCE_NOTE).write_text(str(gguf_path.resolve()), encoding="utf-8", errors="surrogateescape")
        staging.rename(target)
    except Exception as e:  # a failed write: OSError, or safetensors' and tokenizers' own errors (a full disk)
        if not target.is_dir():  # (else another kog process converted the same file first: its copy serves)
            why = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())
            raise KogError(f"cannot write the converted model to {target.parent}: {why}") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned_staging(folder: Path) -> None:
    """Staging folders of conversions whose process ended without cleaning up (killed, out of memory)."""
    for staging in folder.glob(f"{STAGING_PREFIX}*"):
        pid = staging.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or not _running(int(pid)):  # (an older kog's staging names no process)
            shutil.rmtree(staging, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's
        return True
    except (OSError, OverflowError):  # none of that number
        return False
    return True
