#!/usr/bin/env python3
"""For one kind of machine only: a GPU host with no package index, reached one command at a time.

Repeats an experiment's GPU run end to end there: build the kit, carry it, run, fetch. The
machine this was written for has Python 3.12 and CUDA torch but no vLLM, no Snakemake and
no package index, takes commands of at most 10 minutes, and returns files from $OUT. A kit
builder that is not part of this repository (`build --builder DIR`: DIR holds its build.sh, the
host's package list device-has.txt and vllm-0.25.1-server-deps.txt) packs vLLM 0.25.1; this script
packs what the pipeline needs beside it, prints the commands, runs the workflow there, and
files what comes back under docs/results/<experiment>/. On a GPU machine with a package
index none of this is needed: docs/gpu.md, "Running on your own GPU". Below, R is
bench/machines/offline_gpu_run.py.

    python3 $R build --builder DIR   # here: .gk/p0.. (vLLM), .gk/x0.. (Snakemake, Altair, ...),
                                              # .gk/y0.. (AIPerf and GuideLLM, the reference rule's clients)
    python3 $R plan [EXPERIMENT] [--kind K]   # here: the remote commands, one per line
    python3 $R start EXPERIMENT # there: unpack the kit, start the workflow detached
        # [--until reference]: only the jobs that rule needs (the reference jobs and their server)
    python3 $R wait EXPERIMENT  # there: wait (< 9 min) for it; when done, pack results into $OUT
    python3 $R collect TARBALL EXPERIMENT   # here: file the results under docs/results/
    python3 $R rederive TARBALL EXPERIMENT --policy flag_only --suffix -flag-only
        # here: the loop verdicts, matrix, decisions and report again from the returned cells under another
        # loop policy (the code of the loops, aggregate and report rules; no measurement is repeated)
    python3 $R report EXPERIMENT   # here: the report again from docs/results/EXPERIMENT/ as it is
    python3 $R agree [--shapes 16x64,64x128] [--rounds 2]
        # there, after the kit's calls: `speedmatrix agree` (speedmatrix, vllm bench serve, AIPerf, GuideLLM)
        # on a server of its own (the 31B shape cut to 6 layers, eager); one JSON per shape into $OUT

The workflow runs detached (its own session) so that it outlives one remote
command (10 minutes at most); the host stays up while commands follow each
other within its 30 s idle window. The server stops when the workflow ends.

Copy what a remote command returns out of the folder its files come back to at once: a later
command's files can take the same folder (a results tarball was lost that way).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELF = "bench/machines/offline_gpu_run.py"
KIT = REPO / ".gk"
EXTRAS = ["snakemake==9.27.1", "altair==6.3.0", "vl-convert-python==1.9.0.post1", "msgspec==0.22.0",
          "jsonschema==4.26.0"]
# the independent clients of the reference rule (their own site folder, last on the path)
PEERS = ["aiperf==0.13.0", "guidellm==0.8.1"]
SHARED_WITH_DEVICE = {"numpy", "pandas", "pyarrow", "scipy", "transformers", "tokenizers", "matplotlib", "sympy",
                      "pillow", "safetensors", "huggingface-hub", "hf-xet", "fonttools", "networkx", "mpmath",
                      "kiwisolver", "contourpy", "cycler", "pyparsing", "regex", "sentencepiece", "tiktoken",
                      "cuda-bindings", "cuda-pathfinder", "cuda-toolkit"}
# sdist-only dependencies (no wheel on PyPI): built here as pure-Python wheels
SDIST_ONLY = ["connection_pool==0.0.3"]
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
            *(x for p in ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
                          "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
              for x in ("--platform", p))]
WORK = "/tmp/smx"  # on the device


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def build(ns: argparse.Namespace) -> int:
    builder = Path(ns.builder)
    KIT.mkdir(exist_ok=True)
    exclude = REPO / ".git" / "info" / "exclude"
    if "/.gk/" not in exclude.read_text():
        exclude.write_text(exclude.read_text() + "/.gk/\n")
    if not list(KIT.glob("p[0-9]")):
        sh(["bash", str(builder / "build.sh"), str(KIT)])
    have = set((builder / "device-has.txt").read_text().split())
    in_kit = set()
    deps = builder / "vllm-0.25.1-server-deps.txt"
    for line in deps.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            in_kit.add(line.split("==")[0].strip().lower().replace("_", "-"))
    pack("x", EXTRAS, have | in_kit)
    # the peers run in their own processes with only their site before the device's packages (their pins clash
    # with vLLM's): everything they need but the device's large numeric stack, which they share
    pack("y", PEERS, {n for n in have if n in SHARED_WITH_DEVICE})
    for p in sorted(KIT.iterdir()):
        print(p.name, p.stat().st_size)
    return 0


def pack(prefix: str, wanted: list[str], skip: set[str]) -> set[str]:
    """Resolve `wanted` for the device's Python, download what the device and the earlier parts lack, and pack
    it into .gk/<prefix>0.. (50 MiB each). Returns the names packed."""
    tmp = Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True, check=True).stdout.strip())
    wh, site = tmp / "wh", tmp / "site"
    wh.mkdir()
    site.mkdir()
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wh), *SDIST_ONLY])
    sh([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report",
        str(tmp / "r.json"), *PLATFORM, "--find-links", str(wh), "--target", str(tmp / "x"),
        *wanted])
    want, names = [], set()
    for item in json.loads((tmp / "r.json").read_text())["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-").replace(".", "-")
        if name in skip or name.startswith(("nvidia-", "torch", "triton")):
            continue
        names.add(name)
        want.append(f"{item['metadata']['name']}=={item['metadata']['version']}")
    print(f"{prefix} carries:", " ".join(want), file=sys.stderr)
    sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "--find-links", str(wh),
        "-d", str(wh), *want])
    for w in wh.glob("*.whl"):
        if w.name.split("-")[0].lower().replace("_", "-").replace(".", "-") in names:
            shutil.unpack_archive(str(w), str(site), format="zip")
    for old in KIT.glob(f"{prefix}[0-9]"):
        old.unlink()
    subprocess.run(f"tar -cf - -C {site} . | xz -6 -T0 | split -b 50m -d -a 1 - {KIT}/{prefix}", shell=True,
                   check=True)
    shutil.rmtree(tmp)
    return names


def plan(ns: argparse.Namespace) -> int:
    parts = sorted(p.name for p in KIT.glob("[pxy][0-9]"))
    if not parts:
        print(f"no kit: run `python3 {SELF} build` first", file=sys.stderr)
        return 2
    print("# one remote command a part (carry the part, copy it out), back to back; the last starts the run:")
    for name in parts:
        print(json.dumps({"carry": [f".gk/{name}"], "command": f"cp .gk/{name} /tmp/kit.{name}"}))
    print(json.dumps({"command": f"python3 {SELF} start {ns.experiment} && "
                                 f"python3 {SELF} wait {ns.experiment} --max-s 500"}))
    print(json.dumps({"command": f"python3 {SELF} wait {ns.experiment}", "repeat": "until packed",
                      "kind": ns.kind}))
    return 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"/tmp/site:/tmp/site-x:{REPO / 'src'}"
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def unpack() -> None:
    for kind, dest in (("p", "/tmp/site"), ("x", "/tmp/site-x"), ("y", "/tmp/site-y")):
        if not Path(dest).exists() and list(Path("/tmp").glob(f"kit.{kind}[0-9]")):
            Path(dest).mkdir(parents=True)
            subprocess.run(f"cat /tmp/kit.{kind}? | xz -dc | tar -xf - -C {dest}", shell=True, check=True)
    Path(WORK).mkdir(parents=True, exist_ok=True)
    if Path("/tmp/site-y").exists():  # each peer's Python where `make peers` puts it: its site, then the device's
        for name in ("aiperf", "guidellm"):
            wrapper = REPO / ".peers" / name / "bin" / "python"
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            # the workflow's environment says offline; each peer's env() decides what it keeps (AIPerf
            # fails offline on a local tokenizer folder): the wrapper adds nothing of its own
            wrapper.write_text(f"#!/bin/sh\nPYTHONPATH=/tmp/site-y exec {sys.executable} \"$@\"\n")
            wrapper.chmod(0o755)


def start(ns: argparse.Namespace) -> int:
    unpack()
    until = ["--until", *ns.until] if ns.until else []
    # targets before --config (which takes every word after it)
    targets = [f"{results_dir(ns)}/{ns.experiment}/{t}" for t in ns.target]
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/default", *targets, *until, "--config",
           f"experiment={ns.experiment}", f"results_dir={results_dir(ns)}", f"models_dir={WORK}/models", *ns.set]
    log = open(f"{WORK}/run{ns.tag}.log", "ab")
    subprocess.run([sys.executable, "-c", "import vllm, snakemake, altair, msgspec; print('vllm', vllm.__version__)"],
                   env=_env(), check=True, cwd=REPO)
    cpus = cpu_list(ns.cpus) if ns.cpus else None
    delay = f"sleep {ns.delay_s:g}; " if ns.delay_s else ""
    proc = subprocess.Popen(["bash", "-c", f"{delay}{' '.join(cmd)}; echo $? > {WORK}/rc{ns.tag}"], stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO, env=_env(), start_new_session=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    print(f"workflow started (pid {proc.pid}{f', cores {ns.cpus}' if cpus else ''}"
          f"{f', after {ns.delay_s:g} s' if ns.delay_s else ''}), log {WORK}/run{ns.tag}.log")
    return 0


def cpu_list(spec: str) -> set[int]:
    """'0-11' or '12,13,14-15' -> the cores (the workflow and every process it starts stay on them)."""
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def agree(ns: argparse.Namespace) -> int:
    """There: `speedmatrix agree` (speedmatrix, vllm bench serve, AIPerf, GuideLLM) on a server of its own: the
    Gemma-4-31B shape cut to --layers layers (the same widths and vocabulary; it starts in about a minute,
    eager), one JSON per concurrency into $OUT as each finishes."""
    unpack()
    sys.path.insert(0, str(REPO / "src"))
    from speedmatrix.provision import models

    model = Path(WORK) / "models" / f"gemma4-31b-shape-{ns.layers}l"
    models.synthesize("gemma4-31b-shape", model, {
        "num_hidden_layers": ns.layers,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (ns.layers // 6)})
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "agree-server.log", "wb")
    t0 = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                               "--served-model-name", "shape", "--load-format", "dummy", "--max-model-len", "4096",
                               "--enforce-eager", "--gpu-memory-utilization", "0.5", "--port", "8011"],
                              stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        import urllib.request
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:8011/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() - t0 > 300:
                    raise SystemExit("the server did not come up: see agree-server.log") from None
                time.sleep(2)
        print(f"server up in {time.monotonic() - t0:.0f} s", flush=True)
        for c, n in ns.shapes:
            subprocess.run([sys.executable, "-c", "import sys; from speedmatrix.cli import main; sys.exit(main())",
                            "agree", "--url", "http://127.0.0.1:8011", "--model", "shape", "--tokenizer", str(model),
                            "--context", "1024", "--max-tokens", "256", "--requests", str(n), "--concurrency", str(c),
                            "--rounds", str(ns.rounds), "--out", str(out / f"agree-c{c}.json")],
                           env=_env(), cwd=REPO, check=False)
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)
    return 0


def results_dir(ns: argparse.Namespace) -> str:
    """Where a run's results go on the device: one folder per --tag (e.g. serial, parallel)."""
    return f"{WORK}/results{ns.tag}"


def wait(ns: argparse.Namespace) -> int:
    deadline = time.monotonic() + ns.max_s
    rc_file = Path(f"{WORK}/rc{ns.tag}")
    if not Path(f"{WORK}/run{ns.tag}.log").exists():
        # a machine handed back while idle comes back fresh, its /tmp empty: waiting would spend GPU time on nothing
        print(f"no run here ({WORK}/run{ns.tag}.log is missing): a fresh machine? start the run again", file=sys.stderr)
        return 2
    while time.monotonic() < deadline and not rc_file.exists():
        time.sleep(5)
    log = Path(f"{WORK}/run{ns.tag}.log").read_text(errors="replace")
    print(log[-6000:])
    if not rc_file.exists() and not ns.partial:
        print(f"still running after {ns.max_s} s: call wait again")
        return 0
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    res = Path(f"{results_dir(ns)}/{ns.experiment}")
    with tarfile.open(out / f"results{ns.tag}.tar.gz", "w:gz") as tar:
        tar.add(res, arcname=ns.experiment, filter=lambda t: None if "/store/" in t.name else t)
    shutil.copy(f"{WORK}/run{ns.tag}.log", out / f"run{ns.tag}.log")
    subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                   stdout=open(out / "nvidia-smi.csv", "w"))
    state = f"workflow exit {rc_file.read_text().strip()}" if rc_file.exists() else "still running: packed what it has"
    print(f"{state}; packed {out / f'results{ns.tag}.tar.gz'}")
    return 0


# what a GPU run leaves in docs/results/<experiment>/ (the server logs and per-cell request files stay out:
# requests.parquet holds every request of every cell)
KEEP = ("matrix.parquet", "decisions.parquet", "requests.parquet", "report.md", "report.html", "runtime.lock.json",
        "models.lock", "run-summary.json")


def collect(ns: argparse.Namespace) -> int:
    dest = REPO / "docs" / "results" / ns.experiment
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(ns.tarball) as tar:
        for m in tar.getmembers():
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            keep = (rel in KEEP or (rel.startswith("charts/") and rel.endswith(".png"))
                    or rel.startswith("reference/") or rel.endswith(("startup.json", "launch.json", "p2p.json"))
                    or (rel.startswith(("cells/", "loops/")) and rel.endswith(".json")))
            if m.isfile() and keep:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(m).read())
                print("kept", target.relative_to(REPO))
    return 0


def rederive(ns: argparse.Namespace) -> int:
    """`speedmatrix rederive` on a returned tarball, its matrix, decisions and report into docs/results/<experiment>/
    (names with --suffix: a second policy beside the first)."""
    sys.path.insert(0, str(REPO / "src"))
    from speedmatrix.report.rederive import rederive as rederive_run

    work = Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True, check=True).stdout.strip())
    with tarfile.open(ns.tarball) as tar:
        tar.extractall(work, filter="data")
    out = work / "out"
    rederive_run(work / ns.experiment, ns.experiment, REPO / "config" / "experiments", out, ns.policy,
                 REPO / "docs" / "captions")
    dest = REPO / "docs" / "results" / ns.experiment
    (dest / "charts").mkdir(parents=True, exist_ok=True)
    for name in ("matrix.parquet", "decisions.parquet"):
        stem, ext = name.split(".", 1)
        shutil.copyfile(out / name, dest / f"{stem}{ns.suffix}.{ext}")
    pngs = sorted((out / "charts").glob("*.png"))
    for png in pngs:
        shutil.copyfile(png, dest / "charts" / f"{png.stem}{ns.suffix}.png")
    for name in ("report.md", "report.html"):  # their chart links name the suffixed files
        text = (out / name).read_text()
        for png in pngs:
            text = text.replace(f"charts/{png.name}", f"charts/{png.stem}{ns.suffix}.png")
        stem, ext = name.split(".", 1)
        (dest / f"{stem}{ns.suffix}.{ext}").write_text(text)
    print(f"wrote {dest.relative_to(REPO)}/matrix{ns.suffix}.parquet and report{ns.suffix}.md")
    return 0


def report(ns: argparse.Namespace) -> int:
    """Here: the report again from what docs/results/<experiment>/ holds (its matrix, decisions, requests,
    reference JSONs, launch and locks), with the code of the report rule: after files were added there (e.g.
    the reference rule's JSONs of a later run on the same experiment). No loop verdict is judged again."""
    sys.path.insert(0, str(REPO / "src"))
    from speedmatrix.plan import experiment
    from speedmatrix.report.rederive import write_report

    dest = REPO / "docs" / "results" / ns.experiment
    exps = REPO / "config" / "experiments"
    exp = experiment.load(ns.experiment, exps)
    paths = {k: dest / f"{k}.parquet" for k in ("matrix", "decisions", "requests")}
    md = write_report(exp, exps, dest, dest, paths, exp.loops, REPO / "docs" / "captions")
    print(f"wrote {md.relative_to(REPO)} and report.html")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--builder", required=True, metavar="DIR",
                   help="the kit builder's folder (build.sh, device-has.txt, vllm-0.25.1-server-deps.txt)")
    b.set_defaults(func=build)
    pl = sub.add_parser("plan")
    pl.add_argument("experiment", nargs="?", default="h200-gemma4-31b-shape")
    pl.add_argument("--kind", default="nvidia-h200", help="the device kind (nvidia-h200-x2 for the TP-2 run)")
    pl.set_defaults(func=plan)
    s = sub.add_parser("start")
    s.add_argument("experiment")
    s.add_argument("--tag", default="", help="a suffix for the results folder, log and tarball (e.g. -serial)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more workflow config, e.g. gpus=1 (one undivided device: one server at a time)")
    s.add_argument("--until", action="append", default=[], metavar="RULE",
                   help="run only the jobs these rules need, and theirs (Snakemake's --until), e.g. reference")
    s.add_argument("--cpus", help="keep the workflow, its servers and clients on these cores (e.g. 0-11): two "
                                  "runs side by side on one host without sharing cores")
    s.add_argument("--delay-s", type=float, default=0, help="start the workflow this many seconds later")
    s.add_argument("--target", action="append", default=[], metavar="PATH",
                   help="only this output (and what it needs), relative to the experiment's results folder, e.g. "
                        "cells/mtp3/decode-ctx128-c1-temp0.7.json; repeatable")
    s.set_defaults(func=start)
    w = sub.add_parser("wait")
    w.add_argument("experiment")
    w.add_argument("--tag", default="")
    w.add_argument("--max-s", type=float, default=540)
    w.add_argument("--partial", action="store_true",
                   help="pack what the run has after --max-s even if it is still running (the host's last command)")
    w.set_defaults(func=wait)
    ag = sub.add_parser("agree")
    ag.add_argument("--layers", type=int, default=6)
    ag.add_argument("--rounds", type=int, default=2)
    ag.add_argument("--shapes", type=lambda v: [tuple(map(int, x.split("x"))) for x in v.split(",")],
                    default=[(16, 64), (64, 128)], help="CONCURRENCYxREQUESTS,...")
    ag.set_defaults(func=agree)
    c = sub.add_parser("collect")
    c.add_argument("tarball")
    c.add_argument("experiment")
    c.set_defaults(func=collect)
    r = sub.add_parser("rederive")
    r.add_argument("tarball")
    r.add_argument("experiment")
    r.add_argument("--policy", choices=["any", "fraction", "flag_only"], default="flag_only")
    r.add_argument("--suffix", default="-flag-only")
    r.set_defaults(func=rederive)
    rp = sub.add_parser("report")
    rp.add_argument("experiment")
    rp.set_defaults(func=report)
    ns = ap.parse_args()
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
