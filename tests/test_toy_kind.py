"""A new workload kind is its module and its schema block: in a copy of the package, a toy kind is added by writing
one new module and adding its block to the experiment schema, and nothing else; it expands from an experiment,
measures against fault_server (a test fixture that streams at once, not a model), fills its own matrix column and
has its section in the report, through the same code the workflow's jobs and ``speedmatrix rederive`` run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pandas as pd
import yaml

from conftest import REPO

TOY = '''\
"""A toy kind (written by tests/test_toy_kind.py): requests one at a time, and the spread of their output rates."""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..core import fmt
from ..core.table import Table
from ..measure import client, stats
from .base import Cell, CellRun, Column, Measured, Workload, register


@register
class Toy(Workload):
    name = "toy"
    order = 99
    title = "Toy"
    blurb = "requests one at a time, with the spread of their output rates"
    one_at_a_time = True
    matrix_columns = (Column("toy_rate_spread", "tok/s", "`toy_rate_spread`", "the spread of its requests' rates"),)

    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        return [Cell(server_id, self.name, ctx, 1, block["max_tokens"], requests=block["requests"])
                for ctx in block["contexts"]]

    async def measure(self, run: CellRun, prompts: list) -> Measured:
        t0 = time.monotonic()
        records = await client.sequential(run.url, run.model, prompts, run.opts)
        figures = stats.fixed(records, time.monotonic() - t0)
        rates = [r for r in (stats.request_rate(x) for x in records) if r]
        figures["toy_rate_spread"] = statistics.pstdev(rates) if len(rates) > 1 else 0.0
        return Measured(figures, records)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any], provenance: dict[str, Any]) -> dict[str, Any]:
        return {"toy_rate_spread": result.get("toy_rate_spread")}

    def report_table(self, m) -> Table:
        t = Table(["Input tokens", "Toy spread"])
        for r in m.itertuples():
            t.add(fmt.integer(r.context_tokens), fmt.num(r.toy_rate_spread))
        return t
'''

SCHEMA_DEF = {"type": "object", "additionalProperties": False, "required": ["contexts", "requests", "max_tokens"],
              "properties": {"contexts": {"$ref": "#/$defs/contexts"}, "requests": {"type": "integer", "minimum": 1},
                             "max_tokens": {"type": "integer", "minimum": 1}}}

RUN = '''
import asyncio, sys
from pathlib import Path
from aiohttp.test_utils import TestServer
sys.path.insert(0, {tests!r})
from fault_server import app
import speedmatrix
from speedmatrix.core import atomic
from speedmatrix.jobs import cells
from speedmatrix.plan import experiment
from speedmatrix.report.rederive import rederive

assert speedmatrix.__file__.startswith({copy!r}), speedmatrix.__file__  # the copy, not the checkout
exp = experiment.load("toy", "experiments")
(cell,) = exp.cells()
results = Path("results/toy")

async def go():
    async with TestServer(app()) as srv:
        url = str(srv.make_url("")).rstrip("/")
        return await cells.measure(cell, cells.MeasureInput(url, "ok", exp.client, exp.loops, progress=print))

result, records = asyncio.run(go())
doc = {{"experiment": exp.name, "cell": cell.as_dict(), "client": exp.client.as_dict(), "result": result,
       "server": {{"server_id": cell.server_id, "model": "tiny-gemma4-trained", "spec_tokens": 0,
                  "served_model_name": "ok"}}, "provenance": {{}}}}
out = results / "cells" / cell.server_id / f"{{cell.id}}.json"
out.parent.mkdir(parents=True)
cells.write(str(out), str(out.with_name(cell.id + ".requests.parquet")), doc, records,
            {{"experiment": exp.name, "server_id": cell.server_id, "cell_id": cell.id}})
atomic.write_json(results / "runtime.lock.json", {{"kind": "local", "runtime_ref": "toy"}})
rederive(results, "toy", "experiments", captions_dir={captions!r})
print("TOY CELL", cell.id)
'''


def test_a_toy_kind_is_its_module_and_its_schema_block(tmp_path):
    copy = tmp_path / "src" / "speedmatrix"
    shutil.copytree(REPO / "src" / "speedmatrix", copy, ignore=shutil.ignore_patterns("__pycache__"))
    # the two changes: the kind's module, and its block in the schema (its definition and its key under workloads)
    (copy / "workloads" / "toy.py").write_text(TOY)
    schema_path = copy / "data" / "schemas" / "experiment.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    schema["$defs"]["toy"] = SCHEMA_DEF
    schema["$defs"]["workloads"]["properties"]["toy"] = {"$ref": "#/$defs/toy"}
    schema_path.write_text(yaml.safe_dump(schema, sort_keys=False))

    exp = yaml.safe_load((REPO / "config" / "experiments" / "tiny-cpu.yaml").read_text())
    exp = {k: exp[k] for k in ("runtime", "models", "server")} | {
        "description": "a toy kind on one server config",
        "servers": [{"id": "base"}], "workloads": {"toy": {"contexts": [32], "requests": 4, "max_tokens": 8}}}
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "toy.yaml").write_text(yaml.safe_dump(exp))
    script = RUN.format(tests=str(REPO / "tests"), copy=str(copy), captions=str(REPO / "docs" / "captions"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOY CELL toy-ctx32" in proc.stdout

    results = tmp_path / "results" / "toy"
    matrix = pd.read_parquet(results / "matrix.parquet")
    (row,) = matrix.itertuples()
    assert row.workload == "toy" and row.status == "valid" and row.completed_requests == 4
    assert "toy_rate_spread" in matrix.columns and row.toy_rate_spread >= 0
    report = (results / "report.md").read_text()
    assert "Toy" in report and "Toy spread" in report
    # the checkout's own package does not know the kind
    from speedmatrix import workloads

    assert "toy" not in workloads.names()
