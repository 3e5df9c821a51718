"""The default run's record stays today's: docs/results/default/ (bench/default_record.py) was made from the
default experiment as it is now, and the front page and docs/running.md give its run time, from it."""

import importlib.util
import json
import os

from conftest import REPO
from speedmatrix.jobs import preflight
from speedmatrix.plan import experiment

RECORD = REPO / preflight.RECORD.parent


def record() -> dict:
    return json.loads((RECORD / "record.json").read_text())


def test_the_record_is_of_the_default_experiment_as_it_is():
    rec = record()
    cwd = os.getcwd()
    os.chdir(REPO)  # the dataset paths are relative to the repository
    try:
        digest = experiment.load(rec["experiment"], REPO / "config" / "experiments").digest()
    finally:
        os.chdir(cwd)
    assert digest == rec["experiment_digest"], (
        f"{rec['experiment_file']} (or a dataset file it names) changed since docs/results/default/ was recorded: "
        "run `python3 bench/default_record.py` on an idle machine and commit what it writes")
    assert (RECORD / "README.md").read_text().startswith("# The default experiment's last run")
    assert rec["cells"] == len(experiment.load(rec["experiment"], REPO / "config" / "experiments").cells())


def test_the_front_page_and_running_give_the_records_run_time():
    spec = importlib.util.spec_from_file_location("default_record", REPO / "bench" / "default_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    phrase = module.run_time_phrase(record())
    for doc in ("README.md", "docs/running.md"):
        text = " ".join((REPO / doc).read_text().split())
        assert phrase in text and "results/default/" in text, f"{doc} does not say '{phrase}' (docs/results/default)"


def test_a_run_says_what_its_recorded_run_took_only_for_the_same_experiment(tmp_path):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        exp = experiment.load("tiny-cpu", REPO / "config" / "experiments")
        rec = {"experiment": "tiny-cpu", "experiment_digest": exp.digest(), "jobs": 155, "first_run_s": 312.4,
               "install_s": 31.6, "machine": "a 2-core machine"}
        path = tmp_path / "record.json"
        path.write_text(json.dumps(rec))
        said = preflight.recorded_run(exp, path)
        assert said and "155 jobs and took 5 min 12 s on a 2-core machine, after an install of 32 s" in said
        path.write_text(json.dumps({**rec, "experiment_digest": "0" * 64}))  # another shape of the experiment
        assert preflight.recorded_run(exp, path) is None
    finally:
        os.chdir(cwd)
