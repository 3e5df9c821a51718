"""A container image is pinned to its digest by asking a real registry (Debian's docker-registry on loopback)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time

import pytest
import yaml

from conftest import REPO
from speedmatrix.core import http
from speedmatrix.jobs import preflight
from speedmatrix.plan import experiment
from speedmatrix.provision import registry
from speedmatrix.serve import runtimes
from speedmatrix.serve.procs import free_port

REGISTRY_BIN = shutil.which("docker-registry") or shutil.which("registry")
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory):
    if REGISTRY_BIN is None:
        if os.environ.get("SPEEDMATRIX_CI"):
            pytest.fail("docker-registry is not installed (.ci/install-registry installs it)")
        pytest.skip("docker-registry is not installed: apt-get install docker-registry (.ci/install-registry)")
    d = tmp_path_factory.mktemp("registry")
    port = free_port("127.0.0.1")
    (d / "config.yml").write_text(yaml.safe_dump({
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(d / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }))
    log = open(d / "registry.log", "wb")
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(d / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if http.get(f"{base}/v2/", timeout=1).status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"docker-registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def push_image(host: str, name: str, tag: str, payload: bytes) -> str:
    """Push a one-layer OCI image through the registry's HTTP API; return the manifest's digest."""
    base = f"http://{host}/v2/{name}"

    def blob(data: bytes) -> dict:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        start = http.request("POST", f"{base}/blobs/uploads/", timeout=10)
        assert start.status == 202, start.text
        loc = start.headers["Location"]
        loc = loc if loc.startswith("http") else f"http://{host}{loc}"
        put = http.request("PUT", loc, params={"digest": digest}, data=data,
                           headers={"Content-Type": "application/octet-stream"}, timeout=10)
        assert put.status == 201, put.text
        return {"digest": digest, "size": len(data)}

    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {"Entrypoint": ["vllm", "serve"]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(payload)}],
    }).encode()
    resp = http.request("PUT", f"{base}/manifests/{tag}", data=manifest, headers={"Content-Type": MANIFEST_TYPE},
                        timeout=10)
    assert resp.status == 201, resp.text
    return f"sha256:{hashlib.sha256(manifest).hexdigest()}"


def docker_experiment(tmp_path, image: str, kind: str = "docker"):
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["runtime"] = {"kind": kind, "image": image, "gpus": "all", "options": ["--ipc=host"],
                       "volumes": ["~/.cache/huggingface:/root/.cache/huggingface"]}
    d = tmp_path / "experiments"
    d.mkdir(exist_ok=True)
    (d / "pinned.yaml").write_text(yaml.safe_dump(data))
    return experiment.load("pinned", d)


def test_tag_resolves_to_the_digest_the_registry_holds(local_registry, tmp_path):
    digest = push_image(local_registry, "speedmatrix/vllm", "v1", b"layer one")
    exp = docker_experiment(tmp_path, f"{local_registry}/speedmatrix/vllm:v1")
    lock = runtimes.pin(exp)
    assert lock["digest"] == digest
    assert lock["image_ref"] == f"{local_registry}/speedmatrix/vllm@{digest}"
    assert lock["tag"] == "v1" and lock["runtime_ref"] == f"docker:{lock['image_ref']}"

    # the launch runs the digest, not the tag
    srv = exp.server("base")
    argv = runtimes.launch_argv(exp, srv, tmp_path / "models", 8123, image=lock["image_ref"])
    assert argv[:2] == ["docker", "run"] and lock["image_ref"] in argv
    assert f"{local_registry}/speedmatrix/vllm:v1" not in argv
    assert argv[argv.index("-p") + 1] == "8123:8000"  # host port -> the container's 8000
    assert argv[argv.index("--port") + 1] == "8000"
    assert runtimes.stop_argv(exp, srv) == ["docker", "rm", "--force", "speedmatrix-pinned-base"]

    # the tag moves: a run with the old lock keeps its image and says so before any job; pinning again
    # asks the registry and gets the new digest
    lock_path = tmp_path / "runtime.lock.json"
    lock_path.write_text(json.dumps(lock))
    assert preflight.moved_tag(exp, lock_path) is None
    moved = push_image(local_registry, "speedmatrix/vllm", "v1", b"layer two")
    said = preflight.moved_tag(exp, lock_path)
    assert f"now names {moved}" in said and f"keeps the pinned {digest}" in said and "pinned.yaml" in said
    assert moved != digest and runtimes.pin(exp)["digest"] == moved

    # apptainer runs the same digest through docker://
    app = docker_experiment(tmp_path, f"{local_registry}/speedmatrix/vllm:v1", kind="apptainer")
    lock = runtimes.pin(app)
    argv = runtimes.launch_argv(app, app.server("base"), tmp_path / "models", 8124, image=lock["image_ref"])
    assert argv[:3] == ["apptainer", "run", "--nv"]
    assert f"docker://{local_registry}/speedmatrix/vllm@{moved}" in argv
    assert argv[argv.index("--port") + 1] == "8124"


def test_unknown_tag_and_unreachable_registry_fail_clearly(local_registry, tmp_path):
    exp = docker_experiment(tmp_path, f"{local_registry}/speedmatrix/vllm:nonesuch")
    with pytest.raises(registry.RegistryError, match="no tag 'nonesuch'"):
        runtimes.pin(exp)
    port = free_port("127.0.0.1")
    exp = docker_experiment(tmp_path, f"127.0.0.1:{port}/speedmatrix/vllm:v1")
    with pytest.raises(registry.RegistryError, match="could not reach the registry"):
        runtimes.pin(exp)


def test_image_references_parse_like_docker():
    hub = registry.parse("vllm/vllm-openai:cu129-nightly")
    assert (hub.registry, hub.repository, hub.tag) == (registry.DOCKER_HUB, "vllm/vllm-openai", "cu129-nightly")
    assert registry.parse("ubuntu").repository == "library/ubuntu" and registry.parse("ubuntu").tag == "latest"
    assert registry.parse("ubuntu").pinned("sha256:" + "0" * 64) == "ubuntu@sha256:" + "0" * 64
    local = registry.parse("localhost:5000/a/b:t")
    assert (local.registry, local.repository, local.tag) == ("http://localhost:5000", "a/b", "t")
    d = "sha256:" + "a" * 64
    given = registry.parse(f"nvcr.io/nvidia/vllm@{d}")
    assert given.digest == d and given.registry == "https://nvcr.io" and given.tag is None
    assert registry.resolve(f"nvcr.io/nvidia/vllm@{d}")[1] == d  # a digest is used as given, no network


def test_bearer_token_challenge_is_followed(tmp_path):
    """Docker Hub answers 401 with a bearer challenge; the resolver fetches an anonymous token from the
    realm and asks again. A stand-in registry (http.server) plays that exchange on loopback."""
    import http.server
    import threading

    digest = "sha256:" + "b" * 64
    seen = {}

    class Registry(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/token"):
                seen["token_query"] = self.path
                body = b'{"token": "anon-token"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(404)
            self.end_headers()

        def do_HEAD(self):
            if self.headers.get("Authorization") != "Bearer anon-token":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                                 'service="registry.test",scope="repository:vllm/vllm-openai:pull"')
                self.end_headers()
                return
            seen["accept"] = self.headers.get("Accept")
            self.send_response(200)
            self.send_header("Docker-Content-Digest", digest)
            self.end_headers()

    server = http.server.HTTPServer(("127.0.0.1", 0), Registry)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref, got = registry.resolve("vllm/vllm-openai:v0.25.1", registry=f"http://127.0.0.1:{port}")
    finally:
        server.shutdown()
    assert got == digest and ref.pinned(got) == f"vllm/vllm-openai@{digest}"
    assert "service=registry.test" in seen["token_query"] and "scope=repository" in seen["token_query"]
    assert "manifest.list.v2+json" in seen["accept"] and "image.index.v1+json" in seen["accept"]


def test_a_command_in_another_python_environment_is_pinned_by_that_environments_packages():
    """A local runtime whose command is another environment's Python is pinned as the workflow's own is: that
    environment's vLLM, torch and package digest (asked of its Python, which has no speedmatrix)."""
    import sys
    from pathlib import Path

    from speedmatrix.serve import runtimes

    found = runtimes.environment_packages(Path(sys.executable))
    here = runtimes.python_packages()
    assert found["vllm_version"] == here["vllm_version"] and found["torch_version"] == here["torch_version"]
    assert found["packages_sha256"] == runtimes.packages_digest(found["packages"])
    assert runtimes.environment_packages(Path("/nonexistent/python")) is None


def test_the_broker_starts_a_server_at_the_lowered_priority():
    """What the broker runs before vLLM: the process's nice and (Linux) its new session's autogroup lowered."""
    import subprocess
    import sys
    from pathlib import Path

    from speedmatrix.serve.broker import _lowered

    probe = ("import os, pathlib; g = pathlib.Path('/proc/self/autogroup'); "
             "print(os.nice(0), g.read_text().split()[-1] if g.exists() else 'none')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, start_new_session=True,
                         preexec_fn=_lowered(7), check=True).stdout.split()
    assert int(out[0]) == os.nice(0) + 7
    if Path("/proc/self/autogroup").exists():
        assert out[1] == "7"
