#!/usr/bin/env python3
"""For one kind of machine only: a GPU host with no package index, reached one command at a time.

Repeats an experiment's GPU run end to end there with the product's offline bundle: `make bundle TARGET=cuda`
here (less what the host has: bench/machines/h200-host-packages.txt, the host's `pip list --format=freeze`),
the bundle carried over in parts, `make install WHEELS=... ENGINE=cuda` there, the workflow run detached, its
results fetched and filed under docs/results/<experiment>/. The machine this was written for has Python 3.12 and
CUDA torch in a venv, no package index, takes commands of at most 10 minutes, carries at most 64 MiB of files
with each command and returns files from $OUT. On a GPU host you can copy a folder to, none of this is needed:
docs/gpu.md, "A GPU host with no package index". Below, R is bench/machines/offline_gpu_run.py.

    python3 $R build [--peers] [--env LOCK] [--part 28m]
        # here: the bundle in .gk/bundle/, cut into .gk/b00, .gk/b01, ... (--peers: AIPerf and GuideLLM too, the
        # reference rule's clients; --env envs/versions/X.lock: another vLLM release, installed there in
        # .versions/X/ by `make version`; --part: the size of a part, what one command carries beside the tree)
    python3 $R plan [EXPERIMENT] [--kind K]   # here: the remote commands, one per line
    python3 $R start EXPERIMENT [EXPERIMENT ...]
        # there: join the parts, install from the bundle, start the workflow detached; several experiments run
        # one after another in one results folder (one results store); one named again is measured again from
        # nothing, the earlier run's folder kept as EXPERIMENT@1
        # [--until reference]: only the jobs that rule needs (the reference jobs and their server)
    python3 $R wait EXPERIMENT  # there: wait (< 9 min) for it, then pack its results folder into $OUT as it is
        # (finished or not: each call brings back what has finished; it says which experiments have)
    python3 $R collect TARBALL EXPERIMENT [--folder EXPERIMENT@1] [--dest DIR]
        # here: file the results under docs/results/ (--folder: which run of the tarball)
    python3 $R rederive TARBALL EXPERIMENT --policy flag_only --suffix -flag-only
        # here: the loop verdicts, matrix, decisions and report again from the returned cells under another
        # loop policy (the code of the loops, aggregate and report rules; no measurement is repeated)
    python3 $R report EXPERIMENT   # here: the report again from docs/results/EXPERIMENT/ as it is
    python3 $R agree [--shapes 16x64,64x128] [--rounds 2]
        # there, after a `build --peers` bundle's calls: `speedmatrix agree` (speedmatrix, vllm bench serve,
        # AIPerf, GuideLLM) on a server of its own (the 31B shape cut to 6 layers, eager); one JSON per shape

The workflow runs detached (its own session) so that it outlives one remote
command (10 minutes at most); the host stays up while commands follow each
other within its timeout between commands. The server stops when the workflow ends.

Send the first remote command alone and the rest only once a host has answered it: a command sent while no host
was up still counts against how long the run has on the host (a batch of part uploads sent then once cost nearly
half of it). Once it has answered, send every remaining part's command and the start in one batch: a pause
longer than the host's timeout between two commands ends the host, and the parts already sent go with it.

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
BUNDLE = KIT / "bundle"
# the host's packages (its `python3 -m pip list --format=freeze`): left out of its bundle
HOST_PACKAGES = "bench/machines/h200-host-packages.txt"
PEER_LOCKS = ["envs/peers/aiperf.lock", "envs/peers/guidellm.lock"]
PART = "28m"  # a part per remote command: one command carries 64 MiB with the tree (35 MiB on 2026-12-05)
CARRY = 64 * 2**20  # what one remote command carries: the tree and the paths it names
WORK = "/tmp/smx"  # on the device
ON_HOST = Path("/tmp/bundle")  # the bundle joined again there
PY = REPO / ".venv" / "bin" / "python"


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def build(ns: argparse.Namespace) -> int:
    """The product's cuda bundle less what the host has, cut into parts of at most PART."""
    KIT.mkdir(exist_ok=True)
    exclude = Path(subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=REPO, capture_output=True,
                                  text=True, check=True).stdout.strip())
    exclude = exclude if exclude.is_absolute() else REPO / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.gk/" not in (exclude.read_text() if exclude.exists() else ""):
        with exclude.open("a") as f:
            f.write("/.gk/\n")
    locks = (PEER_LOCKS if ns.peers else []) + ns.env
    args = f"--host-has {HOST_PACKAGES}" + "".join(f" --env {lock}" for lock in locks)
    if not (BUNDLE / "bundle.json").exists():
        sh(["make", "bundle", "TARGET=cuda", f"BUNDLE={BUNDLE}", f"BUNDLE_ARGS={args}"], cwd=REPO)
    for old in KIT.glob("b[0-9][0-9]"):
        old.unlink()
    # the wheels are compressed already: the parts are one plain tar, cut
    subprocess.run(f"tar -cf - -C {BUNDLE} . | split -b {ns.part} -d -a 2 - {KIT}/b", shell=True, check=True)
    for p in sorted(KIT.glob("b[0-9][0-9]")):
        print(p.name, p.stat().st_size)
    return 0


def tree_bytes() -> int:
    """The bytes a remote command carries of the repository itself: its tracked files and those git does not
    ignore (the tree grows with every result filed, so a part that fitted once may not)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def plan(ns: argparse.Namespace) -> int:
    parts = sorted(p.name for p in KIT.glob("b[0-9][0-9]"))
    if not parts:
        print(f"no bundle parts: run `python3 {SELF} build` first", file=sys.stderr)
        return 2
    tree = tree_bytes()
    biggest = max((KIT / name).stat().st_size for name in parts)
    if tree + biggest > CARRY:
        fits = (CARRY - tree) // 2**20 - 1
        print(f"a part ({biggest / 2**20:.0f} MiB) and the repository's tree ({tree / 2**20:.1f} MiB) are more than "
              f"one command carries ({CARRY // 2**20} MiB): cut the parts smaller, `python3 {SELF} build --part "
              f"{fits}m` (the bundle is kept, only cut again), or carry less of the tree: move docs/results/ out of "
              "the checkout while the parts travel (the host's run reads none of it; the tree is then about 6 MB and "
              "parts of 54m fit, half as many commands) and put it back after", file=sys.stderr)
        return 2
    print("# one remote command a part (carry the part, copy it out), back to back; the last starts the run.")
    print("# Send the first command alone and the rest only once a host has answered it: a command sent while")
    print("# no host is up still counts against how long the run has on the host. Then send all the rest, the")
    print("# start included, in one batch: a pause longer than the host's timeout between commands loses the")
    print("# parts sent.")
    for name in parts:
        print(json.dumps({"carry": [f".gk/{name}"], "command": f"cp .gk/{name} /tmp/kit.{name}"}))
    print(json.dumps({"command": f"python3 {SELF} start {ns.experiment} && "
                                 f"python3 {SELF} wait {ns.experiment} --max-s 400"}))
    print(json.dumps({"command": f"python3 {SELF} wait {ns.experiment}", "repeat": "until it says the chain has ended",
                      "kind": ns.kind}))
    return 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _make(args: list[str], log_path: str) -> None:
    """`make ARGS` with this Python, its output in LOG_PATH; its exit and time said, its log's tail on failure."""
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        done = subprocess.run(["make", *args, f"PYTHON={sys.executable}"], cwd=REPO, env=_env(), stdout=log,
                              stderr=subprocess.STDOUT)
    print(f"make {' '.join(args)}: exit {done.returncode} in {time.monotonic() - t0:.0f} s (log {log_path})",
          flush=True)
    if done.returncode:
        print(Path(log_path).read_text(errors="replace")[-4000:])
        raise SystemExit(done.returncode)


def unpack() -> None:
    """There: join the parts into the bundle and install this clone from it (`make install WHEELS=... ENGINE=cuda`:
    a .venv that sees the host's own packages, every other package from the bundle, no index), once a host."""
    if not (ON_HOST / "bundle.json").exists():
        parts = sorted(Path("/tmp").glob("kit.b[0-9][0-9]"))
        if not parts:
            raise SystemExit("no bundle parts in /tmp: carry them first (`plan` prints the commands)")
        have = {int(p.name[-2:]) for p in parts}
        missing = [f"b{i:02d}" for i in range(max(have) + 1) if i not in have]
        if missing:  # a host handed back between two parts comes back fresh: the parts before are gone
            raise SystemExit(f"bundle parts {', '.join(missing)} are not in /tmp (a fresh host?): carry them again "
                             "(`plan` prints their commands), then start again")
        # joined beside, moved into place only whole: a join that fails leaves nothing a later start would trust
        partial = ON_HOST.with_name(ON_HOST.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        subprocess.run(f"cat {' '.join(map(str, parts))} | tar -xf - -C {partial}", shell=True, check=True)
        shutil.rmtree(ON_HOST, ignore_errors=True)
        partial.rename(ON_HOST)
    Path(WORK).mkdir(parents=True, exist_ok=True)
    if not (REPO / ".venv" / ".speedmatrix-installed").exists():
        _make(["install", f"WHEELS={ON_HOST}", "ENGINE=cuda"], f"{WORK}/install.log")
    manifest = json.loads((ON_HOST / "bundle.json").read_text())
    envs = manifest.get("envs", manifest.get("peers", []))  # bundles made before --env named them peers
    if any(e.startswith("envs/peers/") for e in envs) and not (REPO / ".peers").exists():
        subprocess.run(["make", "peers", f"WHEELS={ON_HOST}", f"PYTHON={sys.executable}"], cwd=REPO, env=_env(),
                       check=True)
    for name in (Path(e).stem for e in envs if e.startswith("envs/versions/")):
        if (REPO / ".versions" / name / ".installed").exists():
            continue
        _make(["version", f"VERSION={name}", f"WHEELS={ON_HOST}", "ENGINE=cuda"], f"{WORK}/install-{name}.log")
        subprocess.run([str(REPO / ".versions" / name / "bin" / "python"), "-c", "import torch, vllm; print('vllm', "
                        "vllm.__version__, 'torch', torch.__version__, torch.cuda.is_available())"], env=_env(),
                       check=True, cwd=REPO)


def start(ns: argparse.Namespace) -> int:
    unpack()
    until = ["--until", *ns.until] if ns.until else []
    root = results_dir(ns)
    steps, seen = [], {}
    for experiment in ns.experiment:
        if experiment in seen:  # measured again from nothing; the earlier run's folder kept beside it
            seen[experiment] += 1
            steps.append(f"mv {root}/{experiment} {root}/{experiment}@{seen[experiment]}")
        seen.setdefault(experiment, 0)
        # targets before --config (which takes every word after it)
        targets = [f"{root}/{experiment}/{t}" for t in ns.target]
        steps.append(" ".join([str(PY), "-m", "snakemake", "--profile", "profiles/default", *targets, *until,
                               "--config", f"experiment={experiment}", f"results_dir={root}",
                               f"models_dir={WORK}/models", *ns.set])
                     + f"; code=$?; codes=\"$codes $code\"; echo \"{experiment} $code\" >> {WORK}/done{ns.tag}")
    for stale in (f"{WORK}/rc{ns.tag}", f"{WORK}/done{ns.tag}"):  # an earlier chain's end is not this one's
        Path(stale).unlink(missing_ok=True)
    log = open(f"{WORK}/run{ns.tag}.log", "ab")
    subprocess.run([str(PY), "-c", "import torch, vllm, snakemake, altair; print('vllm', vllm.__version__, 'torch', "
                    "torch.__version__, torch.cuda.is_available())"], env=_env(), check=True, cwd=REPO)
    cpus = cpu_list(ns.cpus) if ns.cpus else None
    delay = f"sleep {ns.delay_s:g}; " if ns.delay_s else ""
    chain = "; ".join(steps)
    proc = subprocess.Popen(["bash", "-c", f"{delay}codes=; {chain}; echo $codes > {WORK}/rc{ns.tag}"], stdout=log,
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
    if Path(sys.executable) != PY:  # the rest in the venv the bundle made
        os.execve(str(PY), [str(PY), str(REPO / SELF), *sys.argv[1:]], _env())
    from speedmatrix.provision import models

    model = Path(WORK) / "models" / f"gemma4-31b-shape-{ns.layers}l"
    models.synthesize("gemma4-31b-shape", model, {
        "num_hidden_layers": ns.layers,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (ns.layers // 6)})
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "agree-server.log", "wb")
    t0 = time.monotonic()
    server = subprocess.Popen([str(PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
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
            subprocess.run([str(PY), "-m", "speedmatrix.cli",
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
    """There: wait up to --max-s for the run to end, then pack the results folder as it is into $OUT, finished or
    not: every call brings back what has finished so far, so a host that ends between calls loses only the
    experiment it was measuring (twice a host went while `wait` said "still running" and had packed nothing)."""
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
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(results_dir(ns))
    with tarfile.open(out / f"results{ns.tag}.tar.gz", "w:gz") as tar:  # every run of the folder, and its store
        for res in sorted(root.iterdir()) if root.exists() else ():
            tar.add(res, arcname=res.name, filter=lambda t: None if "/store/" in t.name else t)
    shutil.copy(f"{WORK}/run{ns.tag}.log", out / f"run{ns.tag}.log")
    if shutil.which("nvidia-smi"):  # the GPU's name and driver beside the results
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                       stdout=open(out / "nvidia-smi.csv", "w"))
    print(progress(Path(f"{WORK}/done{ns.tag}"), rc_file) + f"; packed {out / f'results{ns.tag}.tar.gz'}")
    return 0


def progress(done_file: Path, rc_file: Path) -> str:
    """What `start`'s chain has done: each finished experiment with its workflow's exit status, and whether the
    chain is still running."""
    done = [line.split() for line in done_file.read_text().splitlines() if line.strip()] \
        if done_file.exists() else []
    said = ", ".join(f"{name} (exit {code})" for name, code in done) or "none"
    state = "the chain has ended" if rc_file.exists() else "still running: call wait again"
    return f"finished: {said}; {state}"


# what a GPU run leaves in docs/results/<experiment>/ (the server logs and per-cell request files stay out:
# requests.parquet holds every request of every cell)
KEEP = ("matrix.parquet", "decisions.parquet", "requests.parquet", "report.md", "report.html", "runtime.lock.json",
        "models.lock", "run-summary.json")


def collect(ns: argparse.Namespace) -> int:
    dest = Path(ns.dest).resolve() if ns.dest else REPO / "docs" / "results" / ns.experiment
    dest.mkdir(parents=True, exist_ok=True)
    folder = ns.folder or ns.experiment
    with tarfile.open(ns.tarball) as tar:
        names = set(tar.getnames())
        for m in tar.getmembers():
            top, _, rel = m.name.partition("/")
            if top != folder:
                continue
            keep = (rel in KEEP or (rel.startswith("charts/") and rel.endswith(".png"))
                    or rel.startswith("reference/")
                    or rel.endswith(("startup.json", "launch.json", "p2p.json", "startup-error.json"))
                    or (rel.startswith(("cells/", "loops/")) and rel.endswith(".json"))
                    # the log of a server that failed to start: its traceback is the evidence
                    or (rel.startswith("servers/") and rel.endswith("/server.log")
                        and f"{top}/{rel[:-len('server.log')]}startup-error.json" in names))
            if m.isfile() and keep:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(m).read())
                print("kept", target.relative_to(REPO) if target.is_relative_to(REPO) else target)
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
    b.add_argument("--peers", action="store_true", help="carry AIPerf and GuideLLM too (the reference rule, agree)")
    b.add_argument("--env", action="append", default=[], metavar="LOCK",
                   help="another environment's lock whose wheels go too (envs/versions/*.lock: another vLLM release)")
    b.add_argument("--part", default=PART, help=f"the size of a part (default {PART}); with less of the tree "
                   "carried beside it, a part can be larger")
    b.set_defaults(func=build)
    pl = sub.add_parser("plan")
    pl.add_argument("experiment", nargs="?", default="h200-gemma4-31b-shape")
    pl.add_argument("--kind", default="nvidia-h200", help="the device kind (nvidia-h200-x2 for the TP-2 run)")
    pl.set_defaults(func=plan)
    s = sub.add_parser("start")
    s.add_argument("experiment", nargs="+", help="one or more, run one after another in one results folder")
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
    c.add_argument("--dest", help="file them here, not in docs/results/<experiment>/ (a second run beside the first)")
    c.add_argument("--folder", help="the tarball's folder to file (default: the experiment's; EXPERIMENT@1: its "
                   "earlier run)")
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
