"""A run's loop verdicts, matrix, decisions and report again, from its cell files, without the workflow.

For a results folder copied back from another machine (a GPU host, a cluster) or a run to judge under other
loop settings: the code of the loop stage, the aggregation and the report rule over
``<results>/cells/<server>/<cell>.json`` (+ ``.requests.parquet``), with the run's locks, launch specs, gates
and reference files. No measurement is repeated. ``speedmatrix rederive`` runs it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core import atomic
from ..core.errors import RederiveError
from ..core.runfolder import RunFolder
from ..jobs import aggregate
from ..judge import loopcheck
from ..plan import experiment
from . import charts, document


def rederive(results: str | Path, experiment_name: str | None = None,
             experiments_dir: str | Path = "config/experiments", out: str | Path | None = None,
             policy: str | None = None, captions_dir: str | Path | None = None) -> dict[str, Path]:
    """Judge every cell's texts again, aggregate, and write the report into ``out`` (default: ``results``).

    ``experiment_name`` defaults to the folder's name (``results/<experiment>``); ``policy`` replaces the
    experiment's loop policy. Returns the paths written (matrix, requests, decisions, report)."""
    results = Path(results)
    out = Path(out) if out else results
    exp = experiment.load(experiment_name or results.name, experiments_dir)
    settings = {**exp.loops, **({"policy": policy} if policy else {})}
    cells, loops, reqs = [], [], []
    run, derived = RunFolder(results), RunFolder(out)
    for cell_json in run.cell_files():
        req = run.cell_requests(cell_json.parent.name, cell_json.stem)
        if not req.exists():
            raise RederiveError(f"{cell_json}: its requests file {req.name} is missing (each cell JSON needs the "
                                ".requests.parquet its job wrote beside it)")
        checks = sorted(results.glob(f"lossless/*/verdict-{cell_json.parent.name}.json"))
        verdict = loopcheck.judge_cell(atomic.read_json(cell_json), pd.read_parquet(req), settings, exp.stability,
                                       atomic.read_json(checks[0]) if checks else None)
        loop_out = derived.loop(cell_json.parent.name, cell_json.stem)
        atomic.write_json(loop_out, verdict)
        cells.append(cell_json), loops.append(loop_out), reqs.append(req)
    if not cells:
        raise RederiveError(f"{results}: no cell results (cells/<server_id>/<cell_id>.json) to re-derive from")
    if not run.runtime_lock.exists():
        raise RederiveError(f"{results}: {run.runtime_lock.name} is missing (the run's runtime pin, which the report "
                            "shows)")
    paths = {"matrix": derived.matrix, "requests": derived.requests, "decisions": derived.decisions}
    aggregate.build(cells, loops, reqs, paths["matrix"], paths["requests"], paths["decisions"], targets=exp.targets,
                    gpus={s.id: s.gpus for s in exp.servers})
    md = write_report(exp, experiments_dir, results, out, paths, settings, captions_dir)
    return {**paths, "report": md}


def write_report(exp: experiment.Experiment, experiments_dir: str | Path, src: Path, out: Path,
                 paths: dict[str, Path], loop_settings: dict, captions_dir: str | Path | None = None) -> Path:
    """The report rule's code over a run's files: locks, launch specs, gates and reference JSONs from ``src``,
    the matrix, decisions and requests from ``paths``; report.md, report.html and the charts into ``out``.
    Returns report.md's path."""
    derived, run = RunFolder(out), RunFolder(src)
    derived.charts.mkdir(parents=True, exist_ok=True)
    report = {"md": str(derived.report_md), "html": str(derived.report_html)}
    for chart in charts.applicable(exp):
        report[f"{chart.name}_png"] = str(derived.chart(chart.name))
    models_lock = run.models_lock
    document.build(exp.name, str(experiments_dir), str(paths["matrix"]), str(run.runtime_lock),
                   [str(p) for p in sorted(src.glob("servers/*/launch.json"))], report,
                   gate_paths=[str(p) for p in sorted(src.glob("gates/*/*.json"))],
                   models_lock_path=str(models_lock) if models_lock.exists() else None,
                   reference_paths=[str(p) for p in sorted(src.glob("reference/*/*.json"))],
                   loop_settings=loop_settings, decisions_path=str(paths["decisions"]),
                   requests_path=str(paths["requests"]), captions_dir=str(captions_dir) if captions_dir else None,
                   lossless_paths=[str(p) for p in sorted(src.glob("lossless/*/verdict-*.json"))])
    return Path(report["md"])
