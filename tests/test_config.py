"""Bad input fails before any server starts, naming the file and the key."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, run_snakemake, vllm_processes
from speedmatrix import cli, workloads
from speedmatrix.plan import experiment
from speedmatrix.serve import runtimes


@pytest.fixture
def exp_dir(tmp_path):
    d = tmp_path / "experiments"
    d.mkdir()
    shutil.copy(REPO / "config/experiments/tiny-cpu.yaml", d / "tiny-cpu.yaml")
    return d


def write(exp_dir, name, mutate):
    data = yaml.safe_load((exp_dir / "tiny-cpu.yaml").read_text())
    mutate(data)
    (exp_dir / f"{name}.yaml").write_text(yaml.safe_dump(data))


def first_decode(data: dict) -> dict:
    """The default experiment's first decode block (it has two: sampled, and one greedy cell)."""
    return data["workloads"]["decode"][0]


def test_unknown_key_names_file_and_key(exp_dir):
    write(exp_dir, "bad", lambda d: first_decode(d).update(concurency=[1]))
    with pytest.raises(experiment.ConfigError) as err:
        experiment.load("bad", exp_dir)
    msg = str(err.value)
    assert str(exp_dir / "bad.yaml") in msg
    assert "workloads.decode[0].concurency" in msg
    assert "unknown key" in msg and "concurrency" in msg  # says what is allowed


def test_wrong_type_names_file_and_key(exp_dir):
    write(exp_dir, "bad", lambda d: first_decode(d).update(duration_s="four"))
    with pytest.raises(experiment.ConfigError) as err:
        experiment.load("bad", exp_dir)
    assert "bad.yaml" in str(err.value) and "workloads.decode[0].duration_s" in str(err.value)


def test_dangling_model_reference(exp_dir):
    write(exp_dir, "bad", lambda d: d["servers"][1]["speculative"].update(model="nope"))
    with pytest.raises(experiment.ConfigError, match=r"servers\[1\]\.speculative\.model"):
        experiment.load("bad", exp_dir)


def test_unknown_experiment_lists_available(exp_dir):
    with pytest.raises(experiment.ConfigError) as err:
        experiment.load("nonesuch", exp_dir)
    assert "nonesuch" in str(err.value) and "tiny-cpu" in str(err.value)


def test_workflow_rejects_bad_experiment_before_any_server(exp_dir, tmp_path):
    write(exp_dir, "bad", lambda d: d["server"].update(porte=1))
    proc = run_snakemake(tmp_path, experiment="bad", experiments_dir=exp_dir, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "bad.yaml" in out and "server.porte" in out
    assert not (tmp_path / "results").exists()  # nothing ran: no pin, no model, no server
    assert not vllm_processes()


def test_workflow_unknown_experiment_lists_available(tmp_path):
    proc = run_snakemake(tmp_path, experiment="nonesuch", timeout=120)
    assert proc.returncode != 0
    assert "Available experiments" in proc.stderr + proc.stdout and "tiny-cpu" in proc.stderr + proc.stdout


def test_cli_reports_config_errors_cleanly(exp_dir, capsys):
    write(exp_dir, "bad", lambda d: d.update(extra=1))
    assert cli.main(["validate", "bad", "--experiments-dir", str(exp_dir)]) == 2
    assert "key 'extra': unknown key" in capsys.readouterr().err


def test_cli_validate_takes_a_file_path(exp_dir, capsys):
    # `speedmatrix validate config/experiments/x.yaml` as well as `validate x`: the path names the folder
    write(exp_dir, "bad", lambda d: d.update(extra=1))
    assert cli.main(["validate", str(exp_dir / "bad.yaml")]) == 2
    assert "bad.yaml" in (err := capsys.readouterr().err) and "key 'extra': unknown key" in err
    assert cli.main(["validate", "config/experiments/tiny-cpu.yaml"]) == 0
    assert "tiny-cpu.yaml: ok" in capsys.readouterr().out


def test_launch_argv_is_a_list_with_values_verbatim(exp_dir):
    # a value with shell metacharacters reaches the process as one argv item
    write(exp_dir, "odd", lambda d: d["server"].update(served_model_name="tiny; rm -rf $HOME"))
    exp = experiment.load("odd", exp_dir)
    argv = runtimes.launch_argv(exp, exp.server("mtp2"), "/models", 8000)
    assert argv[argv.index("--served-model-name") + 1] == "tiny; rm -rf $HOME"
    spec = argv[argv.index("--speculative-config") + 1]
    assert yaml.safe_load(spec) == {"model": "/models/tiny-gemma4-trained-mtp", "num_speculative_tokens": 2}
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "160"


def test_secrets_are_redacted():
    argv = ["python", "-m", "x", "--api-key", "sk-secret", "--hf-token=hf_abc", "--port", "1"]
    red = runtimes.redact_argv(argv)
    assert "sk-secret" not in " ".join(red) and "hf_abc" not in " ".join(red)
    assert red[-2:] == ["--port", "1"]
    assert runtimes.redact_env({"HF_TOKEN": "hf_x", "VLLM_X": "1"}) == {"HF_TOKEN": "<redacted>", "VLLM_X": "1"}


def test_workloads_take_one_block_or_a_list_and_name_every_cell_kind(exp_dir):
    path = exp_dir / "tiny-cpu.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["workloads"] = {
        "prefill": {"contexts": [256]},
        "latency": {"contexts": [128], "requests": 2, "max_tokens": 8},
        "capacity": {"contexts": [256], "concurrency": [4], "requests": 8, "max_tokens": 16},
        "prefix_cache": {"contexts": [1024], "concurrency": [4], "requests": 8, "max_tokens": 16,
                         "shared_prefix": [0.875, 0.25]},
        "decode": [{"contexts": [128], "concurrency": [1, 4], "duration_s": 2, "max_tokens": 32},
                   {"contexts": [128], "concurrency": [4], "duration_s": 2, "max_tokens": 32, "corpus": "code"}],
    }
    path.write_text(yaml.safe_dump(raw))
    exp = experiment.load("tiny-cpu", exp_dir)
    ids = [c.id for c in exp.cells("base")]
    assert ids == ["prefill-ctx256", "latency-ctx128", "capacity-ctx256-c4", "prefix_cache-ctx1024-c4-share87.5",
                   "prefix_cache-ctx1024-c4-share25", "decode-ctx128-c1", "decode-ctx128-c4",
                   "decode-ctx128-c4-code"]
    assert all(re.fullmatch(workloads.cell_id_pattern(), i) for i in ids)
    assert exp.cell("base", "prefix_cache-ctx1024-c4-share25").shared_prefix == 0.25


def test_a_bad_value_inside_a_list_of_blocks_names_its_key(exp_dir):
    path = exp_dir / "tiny-cpu.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["workloads"]["decode"] = [first_decode(raw), {**first_decode(raw), "corpus": "poetry"}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(experiment.ConfigError, match=r"tiny-cpu.yaml: key 'workloads.decode\[1\].corpus': 'poetry' "
                       r"is not a built-in corpus \(prose, code\) nor one of the experiment's datasets "
                       r"\(azure_small, mooncake_small, snippets\)"):
        experiment.load("tiny-cpu", exp_dir)


def test_a_stopping_rule_that_cannot_stop_is_refused_where_it_was_given(exp_dir):
    """The experiment's precision, a block's own over it: the cells carry the merged rule, and a rule that could
    never stop a window early (or asks more repeats than the block measures) names the file and the key."""
    def own(d: dict) -> None:
        first_decode(d)["precision"] = {"output_tok_s": 0.05}
    write(exp_dir, "own", own)
    cells = [c for c in experiment.load("own", exp_dir).cells("base") if c.workload == "decode"]
    rules = {c.precision_settings["output_tok_s"] for c in cells}
    assert rules == {0.05, 0.1}  # the first block's own, the other block's the experiment's
    assert all(c.precision_settings["min_window_s"] == 1 for c in cells)  # the experiment's, under the block's

    write(exp_dir, "bad", lambda d: d["precision"].update(min_window_s=3))
    with pytest.raises(experiment.ConfigError, match=r"bad.yaml: key 'precision.min_window_s': 3 s is not shorter "
                       r"than workloads.decode\[0\].duration_s \(3 s"):
        experiment.load("bad", exp_dir)
    write(exp_dir, "bad", lambda d: first_decode(d).update(precision={"min_repeats": 3}))
    with pytest.raises(experiment.ConfigError, match=r"key 'workloads.decode\[0\].precision.min_repeats': 3 is more "
                       r"than workloads.decode\[0\]'s repeats \(2"):
        experiment.load("bad", exp_dir)
    write(exp_dir, "off", lambda d: d["precision"].update(enabled=False, min_window_s=3))
    assert experiment.load("off", exp_dir)  # a rule that is off stops nothing


def test_the_schemas_defaults_are_applied_once_when_an_experiment_loads(exp_dir):
    """Every default lives in the schema: a loaded experiment has them filled, the client's typed settings
    carry them, and nothing else repeats them."""
    write(exp_dir, "bare", lambda d: [d.pop(k, None) for k in ("client", "loops", "stability")])
    exp = experiment.load("bare", exp_dir)
    assert exp.raw["loops"]["policy"] == "any" and exp.raw["stability"]["max_cv"] == 0.1
    assert exp.client.stall_timeout_s == 60 and exp.client.api == "completions" and exp.client.seed == 0
    assert first_decode(exp.raw)["corpus"] == "prose" and exp.raw["workloads"]["prefill"]["requests"] == 3
    assert exp.measured_with == {"client": exp.client.as_dict(), "loops": None}


def test_a_sampled_block_gives_cells_that_ask_for_it(exp_dir):
    """`sampling` in a block: its cells' ids end in -temp<T> (then -fp<F> with a frequency penalty), the cell
    records it, and request i asks for the temperature, top_p and seed + i (a greedy cell asks for temperature 0
    and no seed; greedy with a frequency penalty asks for both)."""
    from speedmatrix.jobs import cells

    write(exp_dir, "sampled", lambda d: first_decode(d).update(sampling={"temperature": 0.8, "top_p": 0.9}))
    exp = experiment.load("sampled", exp_dir)
    sampled = [c for c in exp.cells("base") if c.workload == "decode" and c.id.endswith("-temp0.8")]
    block = first_decode(yaml.safe_load((exp_dir / "sampled.yaml").read_text()))
    assert len(sampled) == len(block["contexts"]) * len(block["concurrency"])
    assert all(re.fullmatch(workloads.cell_id_pattern(), c.id) for c in sampled)
    assert sampled[0].as_dict()["sampling"] == {"temperature": 0.8, "top_p": 0.9, "seed": 0}
    body = cells.request_options(sampled[0], exp.client).payload("m", [1, 2], index=3)
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.8, 0.9, 3) and "frequency_penalty" not in body
    greedy = exp.cell("base", "decode-ctx128-c4")
    body = cells.request_options(greedy, exp.client).payload("m", [1, 2], index=3)
    assert body["temperature"] == 0 and "seed" not in body and "sampling" not in greedy.as_dict()
    penalised = exp.cell("base", "latency-ctx128-temp0-fp0.5")
    assert re.fullmatch(workloads.cell_id_pattern(), penalised.id)
    body = cells.request_options(penalised, exp.client).payload("m", [1, 2], index=3)
    assert (body["temperature"], body["frequency_penalty"], body["seed"]) == (0, 0.5, 3)


def test_a_cell_handed_to_its_job_is_the_cell_the_experiment_expands():
    """A cell rule hands its job the cell as a dict (the job expands nothing): for every cell of every shipped
    experiment, the dict gives back the same cell, with the same id (its outputs' names)."""
    from speedmatrix.workloads import Cell

    seen = []
    for path in sorted((REPO / "config" / "experiments").glob("*.yaml")):
        exp = experiment.load(path.stem, str(path.parent))
        for cell in exp.cells():
            again = Cell.from_dict(cell.as_dict())
            assert again == cell and again.id == cell.id, (path.name, cell.id)
            seen.append(cell)
    # kinds' own options and sampled cells went through the dict too
    assert len({c.workload for c in seen}) >= 10 and any(c.options for c in seen) and any(c.sampling for c in seen)


def test_the_gates_are_one_table():
    """The gates' names come from jobs/gates.py's table (the rules' wildcard, the report's columns); the schema's
    ``gates`` block has a key for each and no other."""
    from speedmatrix.core.settings import schema
    from speedmatrix.jobs import gates

    assert set(schema("experiment")["properties"]["gates"]["properties"]) == set(gates.GATES)
    assert all(g.label and callable(g.check) for g in gates.GATES.values())


def test_an_experiment_extends_another_key_by_key(exp_dir):
    """`extends: NAME`: the other experiment's keys with this file's over them (mappings merged key by key); the
    digest covers both files; a missing parent or a cycle names the file and the key."""
    (exp_dir / "other-vllm.yaml").write_text(
        "extends: tiny-cpu\nruntime:\n  command: [/opt/other/bin/python, -m, vllm.entrypoints.openai.api_server, "
        "--model]\n")
    base, other = experiment.load("tiny-cpu", exp_dir), experiment.load("other-vllm", exp_dir)
    assert other.runtime["command"][0] == "/opt/other/bin/python" and other.runtime["device"] == "cpu"
    assert [c.id for c in other.cells()] == [c.id for c in base.cells()]
    before = other.digest()
    (exp_dir / "tiny-cpu.yaml").write_text((exp_dir / "tiny-cpu.yaml").read_text() + "\n# changed\n")
    assert experiment.load("other-vllm", exp_dir).digest() != before  # the parent is part of what it is
    (exp_dir / "orphan.yaml").write_text("extends: nowhere\n")
    with pytest.raises(experiment.ConfigError, match=r"orphan.yaml: key 'extends'.*nowhere"):
        experiment.load("orphan", exp_dir)
    (exp_dir / "a.yaml").write_text("extends: b\n")
    (exp_dir / "b.yaml").write_text("extends: a\n")
    with pytest.raises(experiment.ConfigError, match="comes back to itself"):
        experiment.load("a", exp_dir)


def test_a_reader_that_goes_away_ends_the_listing_quietly(tmp_path):
    # `speedmatrix experiments | head -1`: the rest of the output has nowhere to go; no error about a server
    for i in range(6000):
        (tmp_path / f"experiment-{i:05d}-with-a-long-name-to-fill-the-pipe.yaml").touch()
    proc = subprocess.run(f"{sys.executable} -m speedmatrix.cli experiments --experiments-dir {tmp_path} | head -1",
                          shell=True, capture_output=True, text=True, cwd=REPO, executable="/bin/bash")
    assert proc.stdout.startswith("experiment-00000") and proc.stdout.count("\n") == 1
    assert proc.stderr == ""


def test_the_cluster_plan_of_a_gpu_experiment_with_settings_from_the_command_line(tmp_path):
    """`make plan PROFILE=slurm` as a GPU user runs it (no SLURM needed for a dry run): cluster settings given on the
    command line are typed as the schema says, the GPU model is asked once per allocation, the jobs are listed
    once and each allocation's GPUs, CPUs, memory and time are printed, with a warning for the empty partition."""
    from conftest import one_server_experiment

    exp_dir = one_server_experiment(tmp_path, "gpu", {"decode": {"contexts": [128], "concurrency": [1, 4],
                                                                 "duration_s": 5, "max_tokens": 16}},
                                    servers=[{"id": "a"}, {"id": "b", "args": {"tensor-parallel-size": 2}}],
                                    runtime={"device": "gpu"})
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--workflow-profile", "profiles/slurm", "--config", "experiment=gpu",
         f"experiments_dir={exp_dir}", f"results_dir={tmp_path / 'results'}", f"models_dir={tmp_path / 'models'}",
         "cluster={gpu_model: h100, job_runtime_min: 5, job_mem_mb: 16000}", "--dry-run", "--quiet", "rules",
         "progress"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("jobs would run:") == 1 and "Job stats" not in out + proc.stderr
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("  a ", "  b "))}
    # server config, jobs, GPUs, CPUs (cluster.job_threads), memory, time (5 minutes a job, summed)
    assert rows["a"][:8] == ["a", "2", "1", "x", "h100", "4", "16", "GB"], rows
    assert rows["b"][2:5] == ["2", "x", "h100"] and rows["a"][8:10] == ["10", "min"], rows
    assert "warning: the partition is empty" in out and "warning: the account is empty" in out


def test_a_measurement_archived_under_the_archives_earlier_name_is_found(tmp_path):
    """A run folder made before the measurement archive was named `archive/` kept it in `store/`: a cell whose
    outputs were removed is still restored from there, and a new measurement goes to `archive/`."""
    from speedmatrix.jobs import cells as cell_job

    new_json, _ = cell_job.archived(tmp_path, "base", "decode-ctx128-c1", "k1")
    assert new_json == tmp_path / "archive" / "base" / "decode-ctx128-c1" / "k1.json"
    old = tmp_path / "store" / "base" / "decode-ctx128-c1"
    old.mkdir(parents=True)
    (old / "k1.json").write_text('{"result": {}}')
    (old / "k1.requests.parquet").write_bytes(b"rows")
    got_json, got_requests = cell_job.archived(tmp_path, "base", "decode-ctx128-c1", "k1")
    assert got_json == old / "k1.json"
    assert cell_job.restore(got_json, got_requests, str(tmp_path / "c.json"), str(tmp_path / "c.requests.parquet"))
    assert (tmp_path / "c.requests.parquet").read_bytes() == b"rows"
