"""Prompts from datasets: every format loads offline from the small files in tests/data/datasets (written for the
tests), a dataset is pinned by its hash, bad input is named before any server starts, and a dataset cell sends the
records that fit its context with their categories and output caps (against ``fault_server``, a test fixture)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from test_client_faults import _measure

from conftest import REPO
from fault_server import PROMPTS, app
from speedmatrix import workloads
from speedmatrix.measure import datasets
from speedmatrix.plan import experiment
from speedmatrix.workloads import Cell

DATA = REPO / "tests" / "data" / "datasets"
SPECS = {
    "questions": {"path": str(DATA / "questions.jsonl"),
                  "columns": {"prompt": "question", "category": "topic", "output": "answer"}},
    "csv": {"path": str(DATA / "questions.csv"), "columns": {"prompt": "text", "output_tokens": "max_out"}},
    "pq": {"path": str(DATA / "questions.parquet"), "columns": {"prompt": "text", "output_tokens": "max_out"}},
    "chats": {"path": str(DATA / "sharegpt.json"), "format": "sharegpt"},
    "spec": {"path": str(DATA / "specbench.jsonl"), "format": "specbench"},
}


def test_every_format_loads_offline_with_what_it_has():
    q, lock = datasets.load("questions", SPECS["questions"])
    assert len(q) == 6 and {r.category for r in q} == {"code", "explain"} and q[0].output.startswith("def fib")
    assert lock["records"] == 6 and lock["categories"] == ["code", "explain"] and len(lock["sha256"]) == 64
    csv, _ = datasets.load("csv", SPECS["csv"])
    pq, _ = datasets.load("pq", SPECS["pq"])
    assert [r.output_tokens for r in csv] == [8, 12, 16, 20, 24, 28] and csv == pq  # the same rows as Parquet
    chats, _ = datasets.load("chats", SPECS["chats"])
    # the first human turn (after a system turn too); a conversation without one gives no prompt
    assert [r.prompt for r in chats] == ["How do I read a file line by line in Python?", "Name three built-in types.",
                                         "What is a generator?"]
    assert [r.output for r in chats] == ["Open it with open() and iterate over the file object.", "int, str and list.",
                                         None]
    spec, lock = datasets.load("spec", SPECS["spec"])
    assert spec[1].prompt == "Write a function that reverses a string." and spec[1].category == "coding"
    assert lock["categories"] == ["coding", "math_reasoning", "writing"]


def test_a_hub_dataset_loads_through_the_datasets_library(tmp_path, monkeypatch):
    """``hf:`` goes through ``datasets.load_dataset`` at the pinned revision; a local dataset folder stands in for
    the Hub here (nothing is downloaded in the tests), and the lock pins the rows' hash."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = {"hf": str(DATA / "hub"), "revision": "main", "columns": {"prompt": "prompt", "category": "category"}}
    records, lock = datasets.load("hub", spec)
    assert len(records) == 4 and records[1].category == "explain"
    assert lock["hf"] == str(DATA / "hub") and lock["revision"] == "main" and len(lock["rows_sha256"]) == 64
    with pytest.raises(datasets.DatasetError, match="nonesuch/not-cached.*pre-fetch it"):
        datasets.load("gone", {"hf": "nonesuch/not-cached", "revision": "0123abc"})


def test_a_wrong_column_names_the_file_and_the_key():
    with pytest.raises(datasets.DatasetError, match=r"questions.jsonl\).*no column 'prompt' \(columns.prompt"):
        datasets.load("questions", {"path": str(DATA / "questions.jsonl")})


def _experiment(tmp_path: Path, change) -> Path:
    data = yaml.safe_load((REPO / "config/experiments/tiny-cpu.yaml").read_text())
    data["datasets"] = {"questions": copy.deepcopy(SPECS["questions"])}
    data["workloads"] = {"capacity": {"contexts": [128], "concurrency": [2], "requests": 6, "max_tokens": 16,
                                      "corpus": "questions"}}
    for server in data["servers"]:  # every config measures the experiment's own workloads
        server.pop("workloads", None)
    change(data)
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


def test_dataset_cells_are_named_and_bad_references_are_refused_before_any_server(tmp_path):
    exp = experiment.load("d", _experiment(tmp_path, lambda d: None))
    cell = exp.cells("base")[0]
    assert cell.id == "capacity-ctx128-c2-data-questions" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    assert exp.dataset_of(cell) == SPECS["questions"] | {"format": "table", "split": "train"}
    cases = [
        (lambda d: d["workloads"]["capacity"].update(corpus="poems"),
         r"key 'workloads.capacity.corpus': 'poems' is not"),
        (lambda d: d["datasets"]["questions"].update(path=str(tmp_path / "missing.jsonl")),
         r"key 'datasets.questions.path': no file .*missing.jsonl"),
        (lambda d: d["workloads"].update(prefix_cache={"contexts": [1024], "concurrency": [4], "requests": 8,
                                                       "max_tokens": 8, "shared_prefix": [0.5], "corpus": "questions"}),
         r"key 'workloads.prefix_cache.corpus': prefix_cache cells build a shared prefix"),
    ]
    for change, message in cases:
        with pytest.raises(experiment.ConfigError, match=message):
            experiment.load("d", _experiment(tmp_path, change))


def test_a_dataset_cell_sends_the_records_that_fit_with_their_category_and_cap():
    """fault_server counts a character a token: a 64-token context fits the records of up to 55 characters (with
    the 8-token nonce and the BOS); the longer ones are skipped, and each request keeps its record's category and
    is capped at its reference answer's length."""
    records, _ = datasets.load("questions", SPECS["questions"])
    fits = [r for r in records if len(r.prompt) + 8 + 1 <= 64]
    assert 0 < len(fits) < len(records)
    cell = Cell("manual", "capacity", context_tokens=64, concurrency=2, max_tokens=40, requests=4, corpus="questions")
    fixture = app()
    result, recs = _measure(cell, fixture, dataset=records)
    assert result["dataset_prompts_skipped"] == len(records) - len(fits)
    sent = fixture[PROMPTS]
    assert len(sent) == 4 and all(any(s.endswith(r.prompt) for r in fits) for s in sent)
    caps = {len(r.output) for r in fits}
    assert all(r.max_tokens in caps and r.output_tokens == min(r.max_tokens, 40) for r in recs)
    assert {r.category for r in recs} <= {"code", "explain"} and len({r.prompt_tokens for r in recs}) > 1
