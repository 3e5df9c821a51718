#!/usr/bin/env python3
"""The GPU round of two vLLM releases, energy per useful token and the client at a GPU's request rates: file what
one H200 run returned and write the summary every figure of its README comes from.

    .venv/bin/python bench/h200_round4.py file TARBALL  # the runs in docs/results/h200-round4/, verdicts, summary.md
    .venv/bin/python bench/h200_round4.py summary        # summary.md again from what the folder holds

Each run (the workflow, `snakemake --profile profiles/default --config experiment=EXPERIMENT results_dir=DIR`, with
some of the experiments below one after another in one results folder and store) is filed from the tarball of
its results folder: h200-round4-releases (vLLM 0.25.1; run again on a
later host, `--as h200-round4-releases=vllm-0.25.1-again`), h200-round4-releases-vllm-0.26.0,
h200-round4-releases-ngram (0.25.1 with the ngram config beside MTP), h200-round4-client-at-gpu-rates and its
-rest. Here:

- each run's folder is filed under docs/results/h200-round4/<name>/ (matrix, decisions, requests, report, cells,
  loop verdicts, server start-ups, locks: ``keep``);
- ``history.sqlite.gz``: the results store (compressed); each filed run is added to it (as `speedmatrix history
  --add` adds) beside the runs filed before, from the same host or an earlier one (a run it has already adds nothing);
  ``runs.json``: which store run each folder is;
- ``regress-releases/``: `speedmatrix regress` 0.25.1 -> 0.26.0; ``regress-self/`` and ``regress-self-ngram-run/``:
  0.25.1 against itself on one host; ``regress-self-two-hosts/``: 0.25.1 on one host against 0.25.1 on another
  (VERDICTS; runs filed under other names than the defaults, e.g. from an H100 host, are named with --as);
- ``summary.md``: the tables the README cites (idle power, energy per output / goodput token, losslessness,
  the open-loop steps with the client check beside vllm bench serve's achieved rates).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from speedmatrix.core.table import Table, markdown  # noqa: E402
from speedmatrix.history import regress, store  # noqa: E402
from speedmatrix.measure import arrivals, telemetry  # noqa: E402
from speedmatrix.serve.broker import complaint  # noqa: E402

DEST = REPO / "docs" / "results" / "h200-round4"
# what a filed run keeps of its folder beside its cells, loop verdicts and server start-ups
KEEP = ("matrix.parquet", "decisions.parquet", "requests.parquet", "report.md", "report.html", "runtime.lock.json",
        "models.lock", "run-summary.json")
BIN = REPO / ".venv" / "bin"
RELEASES = "h200-round4-releases"
# the tarball's folders -> where they are filed (the first run of a rerun experiment is kept as NAME@1)
NAMES = {"h200-round4-client-at-gpu-rates": "client-at-gpu-rates", f"{RELEASES}-vllm-0.26.0": "vllm-0.26.0",
         f"{RELEASES}-ngram": "vllm-0.25.1-ngram",
         "h200-round4-client-at-gpu-rates-rest": "client-at-gpu-rates-rest",
         # ngram beside the target alone, the two servers the losslessness check needs (run on an H100)
         "h200-round4-ngram": "ngram-h100",
         # the Gemma-4-31B shape's decode on both releases, and ngram on 0.26.0
         "h200-round4-31b-shape": "31b-shape-vllm-0.25.1",
         "h200-round4-31b-shape-vllm-0.26.0": "31b-shape-vllm-0.26.0",
         "h200-round4-ngram-vllm-0.26.0": "ngram-vllm-0.26.0"}
# every filed run's folder name, in the summary's order
RUNS = ("vllm-0.25.1", "vllm-0.26.0", "vllm-0.26.0-failed-start", "vllm-0.25.1-ngram", "vllm-0.25.1-again",
        "ngram-h100", "vllm-0.25.1-ngram-h100", "vllm-0.25.1-h100", "vllm-0.25.1-h100-again",
        "client-at-gpu-rates", "client-at-gpu-rates-rest-h100", "31b-shape-vllm-0.25.1", "31b-shape-vllm-0.26.0",
        "ngram-vllm-0.26.0", "ngram-vllm-0.26.0-h100", "31b-shape-vllm-0.25.1-h100", "31b-shape-vllm-0.26.0-h100")
# the open-loop steps' folders: each step from the folder that measured it (the machine in its run's provenance)
CLIENT_RUNS = ("client-at-gpu-rates", "client-at-gpu-rates-rest-h100")
# the verdicts written: (folder, base run, new run), each where runs.json names both runs
VERDICTS = (("regress-releases", "vllm-0.25.1", "vllm-0.26.0"),
            # one release against itself on one host: the releases experiment twice, one run right after the other
            ("regress-self", "vllm-0.25.1-h100", "vllm-0.25.1-h100-again"),
            # and the ngram experiment's base and mtp2 cells against the releases experiment run right after it
            ("regress-self-ngram-run", "vllm-0.25.1-ngram-h100", "vllm-0.25.1-h100"),
            # one release on two hosts of one kind, a day apart (the cells both have: the target alone)
            ("regress-self-two-hosts", "ngram-h100", "vllm-0.25.1-h100"),
            # one release on an H200 and on an H100: the cells both runs have (the target alone)
            ("regress-h200-h100", "vllm-0.25.1", "ngram-h100"),
            # the Gemma-4-31B shape (random weights, GPU-bound) on 0.25.1 -> 0.26.0, on an H200 or on an H100
            ("regress-31b-shape-releases-h200", "31b-shape-vllm-0.25.1", "31b-shape-vllm-0.26.0"),
            ("regress-31b-shape-releases", "31b-shape-vllm-0.25.1-h100", "31b-shape-vllm-0.26.0-h100"),
            # the tiny target alone on 0.25.1 -> 0.26.0 on two H100 hosts (0.26.0's from the ngram experiment)
            ("regress-releases-h100", "vllm-0.25.1-h100", "ngram-vllm-0.26.0-h100"))



def keep(tarball: Path, folder: str, dest: Path) -> None:
    """File what a reader needs of one run's folder in the tarball: its tables, report and locks, every cell and
    loop verdict, the losslessness check's outputs and verdicts, each server's start-up, and the log of a server
    that failed to start (its traceback)."""
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        for m in tar.getmembers():
            top, _, rel = m.name.partition("/")
            if top != folder or not m.isfile():
                continue
            if (rel in KEEP or (rel.startswith("charts/") and rel.endswith(".png")) or rel.startswith("reference/")
                    or rel.endswith(("startup.json", "launch.json", "p2p.json", "startup-error.json"))
                    or (rel.startswith(("cells/", "loops/", "lossless/")) and rel.endswith(".json"))
                    or (rel.startswith("servers/") and rel.endswith("/server.log")
                        and f"{top}/{rel[:-len('server.log')]}startup-error.json" in names)):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(m).read())

def folders(tar: tarfile.TarFile) -> list[str]:
    return sorted({m.name.split("/", 1)[0] for m in tar.getmembers() if "/" in m.name})


def file_runs(tarball: Path, given: dict[str, str]) -> dict[str, str]:
    """Each run of the tarball into DEST/<name>/ (GIVEN: folder -> name, over the defaults), its store run id into
    runs.json; returns folder -> name. A name runs.json gives another run already is refused: a later host's run
    never overwrites an earlier one's folder."""
    with tarfile.open(tarball) as tar:
        found = folders(tar)
        names = dict(NAMES)
        again = f"{RELEASES}@1" in found  # the releases experiment ran twice: its first run is NAME@1
        names[f"{RELEASES}@1"] = "vllm-0.25.1"
        names[RELEASES] = "vllm-0.25.1-again" if again else "vllm-0.25.1"
        names.update(given)
    ids = run_ids()
    for folder in found:
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(tarball) as tar:
            tar.extractall(tmp, members=[m for m in tar.getmembers()
                                         if m.name.split("/", 1)[0] == folder
                                         and ("/cells/" in m.name or m.name.endswith("/run-summary.json"))],
                           filter="data")
            (Path(tmp) / folder).mkdir(exist_ok=True)
            rid = store.run_id(Path(tmp) / folder)
        name = names.get(folder)
        if name in ids and ids[name] != rid:
            raise SystemExit(f"{tarball}: its folder {folder} would be filed as {name}, which runs.json gives run "
                             f"{ids[name]} already (this one is {rid}): name it with --as {folder}=NEW-NAME")
    filed = {}
    for folder in found:
        if folder not in names:
            continue
        experiment = folder.split("@")[0]
        keep(tarball, folder, DEST / names[folder])
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(tarball) as tar:
            tar.extractall(tmp, members=[m for m in tar.getmembers() if m.name.split("/", 1)[0] == folder],
                           filter="data")
            run = Path(tmp) / folder
            if not (DEST / names[folder] / "matrix.parquet").exists() and any(run.glob("cells/*/*")):
                rederive(run, experiment, DEST / names[folder])
            # into the folder's store beside the runs filed before (from this host or an earlier one): a run
            # the store has already adds nothing
            ids[names[folder]] = store.add(run, DEST / "history.sqlite")[0]
            # where the run's wall time went (its job logs stay out of the repository: the split is kept)
            split = subprocess.run([str(BIN / "speedmatrix"), "walltime", str(run)], capture_output=True, text=True)
            (DEST / names[folder] / "walltime.txt").write_text(
                split.stdout.replace(str(run), names[folder]) + split.stderr.replace(str(run), names[folder]))
        slim(DEST / names[folder])
        filed[folder] = names[folder]
    (DEST / "runs.json").write_text(json.dumps(ids, indent=1) + "\n")
    return filed


# what a filed run leaves out to keep the repository small (SLIMMED says so in summary.md)
SLIMMED = ("report.html (report.md has the same tables), the charts (report.md says so where they were), loops/ "
           "(each cell's loop verdict: the matrix keeps its figures), and requests.parquet's columns text, "
           "chunk_tokens and chunk_chars (the generated text and each streamed chunk's size)")
CHARTS_LEFT_OUT = "Left out here to keep the repository small: the tables above hold their figures."


def slim(run: Path) -> None:
    (run / "report.html").unlink(missing_ok=True)
    shutil.rmtree(run / "loops", ignore_errors=True)
    shutil.rmtree(run / "charts", ignore_errors=True)
    report = run / "report.md"
    if report.exists():
        text = re.sub(r"(?m)^!\[[^\]]*\]\(charts/[\w-]+\.png\)\n\n?", "", report.read_text())
        report.write_text(text.replace("## Charts\n\n", f"## Charts\n\n{CHARTS_LEFT_OUT}\n\n", 1))
    requests = run / "requests.parquet"
    if requests.exists():
        r = pd.read_parquet(requests)
        r.drop(columns=[c for c in ("text", "chunk_tokens", "chunk_chars") if c in r]).to_parquet(requests)


def rederive(run: Path, experiment: str, dest: Path) -> None:
    """A run cut short (its workflow stopped mid-run) has its finished cells but no matrix: `speedmatrix
    rederive` makes the matrix, the requests, the decisions and the report of those cells (it says which ran)."""
    subprocess.run([str(BIN / "speedmatrix"), "rederive", str(run), "--experiment", experiment, "--out", str(dest),
                    "--captions", str(REPO / "docs" / "captions")], check=True, stdout=subprocess.DEVNULL)


def run_ids() -> dict[str, str]:
    """name -> the store's run id of each run filed here (runs.json, which `file` writes as it adds each run)."""
    ids = DEST / "runs.json"
    return json.loads(ids.read_text()) if ids.exists() else {}


def verdicts(ids: dict[str, str]) -> dict[str, int]:
    codes = {}
    for out, base, new in VERDICTS:
        if base not in ids or new not in ids:
            continue
        db = DEST / "history.sqlite"
        done = subprocess.run([str(BIN / "speedmatrix"), "regress", ids[base], ids[new], "--store",
                               str(db if db.exists() else DEST / "history.sqlite.gz"), "--out", str(DEST / out)],
                              capture_output=True, text=True)
        (DEST / out / "printed.md").write_text(done.stdout)
        codes[out] = done.returncode
    return codes


# matrix column -> the summary's heading
ENERGY = (("total_tok_s", "output tok/s"), ("gpu_power_w", "GPU W"), ("gpu_idle_power_w", "idle W"),
          ("gpu_energy_per_output_token_j", "J / output token"),
          ("gpu_energy_above_idle_per_output_token_j", "J above idle / output token"),
          ("goodput_token_share", "goodput token share"), ("gpu_energy_per_goodput_token_j", "J / goodput token"),
          ("spec_acceptance_rate", "acceptance"))
LOSSLESS = (("lossless_setting", "setting"), ("lossless_verdict", "verdict"),
            ("lossless_share_below_floor", "share below floor"),
            ("lossless_twin_share_below_floor", "twin's share"), ("lossless_reason", "why"))
RATES = (("offered_rate_rps", "offered req/s"), ("achieved_rate_rps", "achieved req/s"), ("status", "status"),
         ("total_tok_s", "output tok/s"), ("ttft_ms", "median TTFT ms"), ("schedule_lag_p95_ms", "send lag p95 ms"),
         ("client_loop_lag_p95_ms", "loop lag p95 ms"), ("client_cpu_share", "client CPU"),
         ("client_runqueue_share", "run-queue"), ("machine_busy_share", "machine busy"),
         ("client_wait_p95_ms", "client wait p95 ms"))


def _table(frame: pd.DataFrame) -> str:
    """A frame as the project's markdown table (speedmatrix.core.table), figures to four significant digits."""

    t = Table(list(frame.columns))
    for row in frame.itertuples(index=False):
        t.add(*("—" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else v) for v in row))
    return markdown([t]).strip()


def _startups(name: str) -> pd.DataFrame:
    rows = []
    for f in sorted((DEST / name / "servers").glob("*/startup.json")):
        d = json.loads(f.read_text())
        rows.append({"run": name, "server": f.parent.name, "vLLM": d.get("vllm_version"),
                     "started": d.get("started_at"), "start s": d.get("startup_seconds"),
                     "idle power W": d.get("gpu_idle_power_w"), "idle power window s": d.get("gpu_idle_window_s"),
                     "settled": d.get("gpu_idle_settled", "not checked"),
                     "host probe ms": d.get("host_probe_ms")})
    return pd.DataFrame(rows)


def _failed_starts(name: str) -> pd.DataFrame:
    """Each server of the run that failed to start: the error it gave then, and vLLM's root cause from its log."""

    rows = []
    for f in sorted((DEST / name / "servers").glob("*/startup-error.json")):
        log = f.parent / "server.log"
        rows.append({"run": name, "server": f.parent.name, "error": json.loads(f.read_text()).get("error"),
                     "root cause (server.log)": complaint(log) if log.exists() else None})
    return pd.DataFrame(rows)


def _saturation_now(requests: Path) -> dict[str, str]:
    """cell -> "k of n": in how many of its repeats the workflow's saturation rule, as it is now, finds the
    server's queue growing (from requests.parquet: a run measured before a change of the rule is judged again)."""

    r = pd.read_parquet(requests)
    r = r[r["counted"].fillna(True).astype(bool) & r["scheduled_s"].notna()]
    out: dict[str, list[bool]] = {}
    for (cell, _), g in r.groupby(["cell_id", "repeat"]):
        times = [(s, b, None if pd.isna(t) else b + t / 1000.0, None if pd.isna(e) else e)
                 for s, b, t, e in zip(g["scheduled_s"], g["start_s"], g["ttft_ms"], g["end_s"])]
        out.setdefault(cell, []).append(arrivals.saturation(times)["saturated"])
    return {cell: f"{sum(v)} of {len(v)}" for cell, v in out.items()}


def summary() -> Path:
    runs = [n for n in RUNS if (DEST / n / "matrix.parquet").exists()]
    out = ["# h200-round4: what the run's files say (written by bench/h200_round4.py from the folders beside it)", ""]
    filed = [n for n in RUNS if (DEST / n / "servers").is_dir()]
    frames = [f for f in (_startups(n) for n in filed) if len(f)]
    starts = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out += ["## Server starts and the GPU's idle power before each", "",
            "From each run's `servers/<config>/startup.json` (`gpu_idle_power_w`: NVML, sampled before the server "
            "started; `settled`: whether the power had stopped falling; \"not checked\": one window of "
            "`gpu_idle_window_s` right before the start, as the workflow sampled before it waited for the power "
            "to settle; `host probe ms`: the fastest of nine timings of a fixed piece of Python on the core the "
            "workflow ran on, before the start, absent in runs made before it was recorded).", "",
            _table(starts) if len(starts) else "(none)", ""]
    failed = [f for f in (_failed_starts(n) for n in filed) if len(f)]
    if failed:
        out += ["## Servers that failed to start", "",
                "From each run's `servers/<config>/startup-error.json` and the root cause in its `server.log`.", "",
                _table(pd.concat(failed, ignore_index=True)), ""]
    energy = []
    for n in runs:
        if n in CLIENT_RUNS:
            continue
        m = pd.read_parquet(DEST / n / "matrix.parquet")
        # a server started right after another stopped may read its GPU above idle (the power still falling):
        # the run's lowest idle reading beside each cell's own
        lowest = m["gpu_idle_power_w"].min()
        for r in m.sort_values(["server_id", "cell_id"]).to_dict("records"):
            energy.append({"run": n, "server": r["server_id"], "cell": r["cell_id"], "status": r["status"],
                           **{label: r.get(col) for col, label in ENERGY},
                           "J above the run's lowest idle / output token": telemetry.above_idle(
                               r.get("gpu_energy_per_output_token_j"), r.get("gpu_power_w"), lowest)})
    out += ["## Energy per output token and per goodput token", "",
            "From each run's `matrix.parquet` (the median of the cell's repeats; goodput: the requests that met "
            "the experiment's target: `tiny_h200`, p90 TTFT 50 ms and TPOT 8 ms, for the tiny pair; "
            "`interactive`, MLPerf's p99 TTFT 500 ms and TPOT 30 ms, for the 31B shape).", "",
            _table(pd.DataFrame(energy)) if energy else "(none)", ""]
    lossless = []
    for n in runs:
        m = pd.read_parquet(DEST / n / "matrix.parquet")
        spec = m[m["spec_tokens"].fillna(0) > 0].drop_duplicates("server_id")
        for r in spec.to_dict("records"):
            lossless.append({"run": n, "server": r["server_id"], **{label: r.get(col) for col, label in LOSSLESS}})
    out += ["## Does speculation keep the target's output on CUDA?", "",
            "From each run's `matrix.parquet` (`lossless_*`: the losslessness check of each speculative config "
            "against the config without speculation, at the cells' sampling).", "",
            _table(pd.DataFrame(lossless)) if lossless else "(none)", ""]
    rows = []
    for n in (c for c in CLIENT_RUNS if c in runs):
        m = pd.read_parquet(DEST / n / "matrix.parquet")
        ref = {}
        for f in (DEST / n / "reference").glob("*/*.json"):
            d = json.loads(f.read_text())
            # its median over rounds, else its one round as it ended (a failed round says so)
            rounds = (d.get("runs") or {}).get("vllm_bench_serve") or [{}]
            med = (d.get("medians") or {}).get("vllm_bench_serve") or {}
            row = med if med.get("duration") else rounds[0]
            if row.get("duration"):
                ref[d["cell"]["cell_id"]] = {"vllm bench serve req/s": row["completed"] / row["duration"],
                                             "its tok/s": row.get("output_throughput"),
                                             "its CPU s / wall s": (row.get("client_cpu_s") or 0)
                                             / (row.get("process_wall_s") or float("nan")),
                                             "its round": "failed" if row.get("error") else "ok"}
        judged = _saturation_now(DEST / n / "requests.parquet")
        ours = {r["cell_id"]: r for r in m.to_dict("records")}
        gpu = m["gpu_name"].dropna().iloc[0] if m["gpu_name"].notna().any() else None
        # every step either client measured (a run cut short may have one client's step and not the other's)
        for cell in set(ours) | set(ref):
            r = ours.get(cell, {})
            rows.append({"run": n, "GPU": gpu, "cell": cell, **{label: r.get(col) for col, label in RATES},
                         "saturated repeats (today's rule)": judged.get(cell), **ref.get(cell, {})})
    if rows:
        rows.sort(key=lambda r: (float(r["cell"].split("-r")[-1].split("-")[0]), r["run"]))  # the cell id's rate
        out += ["## The client at a GPU's request rates", "",
                "From each run's `matrix.parquet` (speedmatrix's cells, the client check on each; `GPU` its "
                "`gpu_name`) and `reference/*/*.json` (vllm bench serve sending the same arrivals, one round: "
                "its completed requests over its duration), the steps of "
                + " and ".join(f"`{c}/`" for c in CLIENT_RUNS) + " in one table by offered rate. `status` is "
                "the cell's as measured; the saturated repeats are judged again from the run's "
                "`requests.parquet` by the workflow's saturation rule as it is now "
                "(`speedmatrix.measure.arrivals.saturation`, per repeat).", "",
                _table(pd.DataFrame(rows)), ""]
    cap = DEST / "client-capacity" / "client_capacity.json"
    if cap.exists():  # bench/client_capacity.py run on the GPU host (its --out), the client pinned to its cores
        d = json.loads(cap.read_text())
        rows = [{"test": f"closed loop, {r['in_flight']} in flight, {r['requests']} requests of "
                         f"{d['short_tokens']} tokens", "speedmatrix": f"{r['speedmatrix_req_s']:.4g} req/s",
                 "streamer CPU": r["speedmatrix_streamer_cpu"]} for r in d["closed"]]
        rows += [{"test": f"open loop, highest rate kept ({r['rule']})",
                  "speedmatrix": f"{r['speedmatrix_highest_kept_rps']:.4g} req/s", "streamer CPU": None}
                 for r in d["open"]]
        rows += [{"test": f"ingest, {r['in_flight']} in flight, {r['tokens_per_request']} tokens a request",
                  "speedmatrix": f"{r['speedmatrix_tok_s']:.4g} tok/s", "streamer CPU": r["speedmatrix_streamer_cpu"]}
                 for r in d["ingest"]]
        out += ["## The client's own capacity on the GPU host's cores", "",
                f"From `client-capacity/client_capacity.json` (`bench/client_capacity.py --clients speedmatrix "
                f"--rounds {d['rounds']} --client-cores {d['client_core']}`: speedmatrix's client against the local "
                f"streamer on core {d['streamer_core']}, {d['cores']} cores, {d['cpu_model']}, Python "
                f"{d['python']}).", "", _table(pd.DataFrame(rows)), ""]
    pairs = []
    for folder, base, new in VERDICTS:
        csv = DEST / folder / "regress.csv"
        if not csv.exists():
            continue
        v = pd.read_csv(csv)
        judged = v[v["verdict"] != regress.NOT_COMPARABLE]
        cells = regress.cell_verdicts(judged)["verdict"]
        big = judged.loc[judged["change"].abs().idxmax()] if len(judged) else None
        pairs.append({"verdict": f"{folder}/", "base run": base, "new run": new, "cells judged": len(cells),
                      "cells slower": int((cells == regress.SLOWER).sum()),
                      "cells faster": int((cells == regress.FASTER).sum()),
                      "figures judged": len(judged),
                      "figures whose interval excludes no change": int(((judged["ci_low"] > 0)
                                                                         | (judged["ci_high"] < 0)).sum())
                      if len(judged) else 0,
                      "largest change": None if big is None else
                      f"{big['change']:+.1%} ({big['server_id']} {big['cell_id'].split('-')[2]} {big['figure']}, "
                      f"minimum effect {big['min_effect']:.1%})"})
    out += ["## The verdicts, and how often one fires between runs of one release", "",
            "From each verdict's `regress.csv` (`speedmatrix regress BASE NEW`, one row a cell's figure): a cell "
            "is slower if any of its figures is. `figures whose interval excludes no change` counts the figures "
            "a test of the 95 % interval alone would have called changed, without the minimum effect; "
            "`largest change` is the figure whose change was largest in size.", "",
            _table(pd.DataFrame(pairs)) if pairs else "(none)", ""]
    out += ["## Left out", "", f"Each run's folder here leaves out {SLIMMED}.", ""]
    path = DEST / "summary.md"
    path.write_text("\n".join(out))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("file")
    f.add_argument("tarball", type=Path)
    f.add_argument("--as", dest="given", action="append", default=[], metavar="FOLDER=NAME",
                   type=lambda v: tuple(v.split("=", 1)),
                   help="file the tarball's FOLDER as NAME (default: the experiment's usual name)")
    sub.add_parser("summary")
    sub.add_parser("judge", help="measure and file nothing: the verdicts again from the store (after a change of "
                   "the method), then the summary")
    ap.add_argument("--dest", type=Path, default=DEST, help="the folder (default docs/results/h200-round4)")
    ns = ap.parse_args()
    globals()["DEST"] = ns.dest.resolve()
    if ns.cmd == "file":
        packed = DEST / "history.sqlite.gz"  # the store is kept compressed: added to unpacked, packed again
        if packed.exists():
            subprocess.run(["gunzip", "-f", str(packed)], check=True)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / ns.tarball.name
            shutil.copyfile(ns.tarball, local)
            print(json.dumps(file_runs(local, dict(ns.given))))
        ids = run_ids()
        print(json.dumps({"runs": ids, "regress_exit": verdicts(ids)}))
        subprocess.run(["gzip", "-9", "-n", "-f", str(DEST / "history.sqlite")], check=True)
    if ns.cmd == "judge":
        print(json.dumps({"regress_exit": verdicts(run_ids())}))
    print(f"wrote {summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
