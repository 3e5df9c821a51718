"""The results store and the regression verdict, on a recorded run (docs/results/h200-tiny-trained-spec: CUDA vLLM
0.25.1 on an H200, every cell's JSON and requests kept): no engine runs here."""

import gzip
import io
import json
import shutil
import sqlite3
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import yaml

from conftest import REPO
from speedmatrix.cli import main
from speedmatrix.core.errors import ConfigError, StoreError
from speedmatrix.core.table import markdown
from speedmatrix.history import regress, store

RECORDED = REPO / "docs" / "results" / "h200-tiny-trained-spec"
SLOWED = ("mtp2", "decode-ctx128-c16-temp0.7")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The recorded run, a second run of it with one cell 40 % slower (its requests take 1.4 times as long), and a
    third whose one cell was measured with another client seed."""
    root = tmp_path_factory.mktemp("runs")
    base = root / "base"
    shutil.copytree(RECORDED, base, ignore=shutil.ignore_patterns("first-run", "logs", "servers", "charts"))
    slow = root / "slow"
    shutil.copytree(base, slow)
    sid, cid = SLOWED
    reqs_path = slow / "cells" / sid / f"{cid}.requests.parquet"
    reqs = pd.read_parquet(reqs_path)
    reqs["ttft_ms"] *= 1.4
    reqs["end_s"] = reqs["start_s"] + (reqs["end_s"] - reqs["start_s"]) * 1.4
    reqs.to_parquet(reqs_path)
    for doc_path in (slow / "cells").glob("*/*.json"):  # a later run: each cell started later
        doc = json.loads(doc_path.read_text())
        doc["result"]["started_at"] = "2026-12-03T10:00:00+0000"
        doc_path.write_text(json.dumps(doc))
    other = root / "other"
    shutil.copytree(base, other)
    doc_path = other / "cells" / "base" / "decode-ctx128-c1-temp0.7.json"
    doc = json.loads(doc_path.read_text())
    doc["client"]["seed"] = 7
    doc_path.write_text(json.dumps(doc))
    return base, slow, other


def test_a_run_is_stored_once_with_its_manifest_and_any_sqlite_client_reads_it(recorded, tmp_path):
    base, slow, _ = recorded
    db = tmp_path / "history.sqlite"
    first, added = store.add(base, db)
    assert added and store.add(base, db) == (first, False)  # the same run twice adds nothing
    second, added = store.add(slow, db)
    assert added and second != first
    runs = store.runs(db)
    assert list(runs["run_id"]) == [first, second]
    row = runs.iloc[0]
    assert row["vllm_version"] == "0.25.1" and row["gpu_name"] == "NVIDIA H200" and row["cells"] == 15
    assert row["status"] == "unknown"  # kept without its run summary
    with sqlite3.connect(db) as con:  # a plain SQLite client: every matrix figure, one row per cell per run
        n, tok_s = con.execute("SELECT count(*), max(total_tok_s) FROM cells WHERE run_id = ?", (first,)).fetchone()
        reqs = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", (first,)).fetchone()[0]
    matrix = pd.read_parquet(base / "matrix.parquet")
    assert n == len(matrix) and tok_s == pytest.approx(matrix["total_tok_s"].max())
    assert reqs == sum(len(pd.read_parquet(p)) for p in (base / "cells").glob("*/*.requests.parquet"))
    history = store.cell_history(db, *SLOWED)
    assert list(history["run_id"]) == [first, second] and history["total_tok_s"].notna().all()
    assert store.resolve(db, first[:6]) == first and store.resolve(db, str(slow)) == second
    with pytest.raises(StoreError, match="speedmatrix history"):
        store.resolve(db, "ffffff")
    # an archived store kept compressed reads the same, and refuses to be added to
    packed = tmp_path / "archived" / "history.sqlite.gz"
    packed.parent.mkdir()
    with db.open("rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert store.runs(packed).equals(runs) and store.resolve(packed, first[:6]) == first
    with pytest.raises(StoreError, match="read-only; `gunzip -k"):
        store.add(base, packed)
    assert list(packed.parent.iterdir()) == [packed]


def test_a_failed_run_is_stored_as_failed(recorded, tmp_path):
    base, _, _ = recorded
    failed = tmp_path / "failed"
    shutil.copytree(base, failed)
    (failed / "matrix.parquet").unlink()  # it stopped before its matrix: the cells it judged are what it has
    shutil.rmtree(failed / "cells" / "mtp4")
    (failed / "run-summary.json").write_text(json.dumps({"succeeded": False, "failed": 3, "jobs": 40}))
    row, cells, _ = store.manifest(failed)
    assert row["status"] == "failed" and row["failed_jobs"] == 3
    with pytest.raises(StoreError, match="not a run's results folder"):
        store.manifest(tmp_path / "failed" / "cells" / "base")
    # a run whose server never started: no cell at all, only its summary; stored as failed, and runs after it too
    early = tmp_path / "early"
    early.mkdir()
    (early / "run-summary.json").write_text(json.dumps({"succeeded": False, "failed": 2, "jobs": 12,
                                                        "written_at": "2026-12-03T06:00:00+0000"}))
    db = tmp_path / "history.sqlite"
    first, added = store.add(early, db)
    assert added and store.runs(db).iloc[0]["status"] == "failed" and store.runs(db).iloc[0]["cells"] == 0
    second, added = store.add(base, db)
    assert added and len(store.cells(db, second)) == 15 and store.cells(db, first).empty


def test_a_run_that_finished_without_measuring_a_cell_is_empty_not_complete(tmp_path):
    # every job it had succeeded, but it had no cell (it only pinned the runtime: `--until pin_runtime`)
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    (pinned / "run-summary.json").write_text(json.dumps({"succeeded": True, "failed": 0, "jobs": 1}))
    db = tmp_path / "history.sqlite"
    store.add(pinned, db)
    row = store.runs(db).iloc[0]
    assert row["status"] == "empty" and row["cells"] == 0


def test_a_new_run_that_measured_nothing_is_no_pass(recorded, tmp_path, capsys):
    """A release whose servers never started (vLLM 0.26.0 on an H200: a kernel package of its environment did not
    match) has no cell: every cell is "only in base", and the check must not read that as "no cell slower"."""
    base, _, _ = recorded
    early = tmp_path / "early"
    early.mkdir()
    (early / "run-summary.json").write_text(json.dumps({"succeeded": False, "failed": 5, "jobs": 18}))
    db = tmp_path / "history.sqlite"
    store.add(base, db)
    store.add(early, db)
    assert main(["regress", str(base), str(early), "--store", str(db)]) == 3  # lost: the release did not start
    out = capsys.readouterr()
    assert "**Nothing compared**" in out.out and "No cell slower" not in out.out and "lost**" in out.out
    assert "the new run lost" in out.err and "nothing to judge" in out.err and "(exit 3)" in out.err


def test_a_new_run_that_lost_a_cell_is_no_pass(recorded, tmp_path, capsys):
    """A release that fails one cell the base measured, or whose incomplete run lacks it, is no pass even where no
    other cell is slower; a cell only in base of a complete run (another experiment's cells) is not lost."""
    base, _, _ = recorded
    _, bc, br = store.manifest(base)
    failed = bc.copy()
    failed.loc[(failed["server_id"] == "mtp2") & (failed["cell_id"] == SLOWED[1]), "status"] = "failed"
    table = regress.regress(bc, br, failed, br)
    assert regress.lost_cells(table) == ["/".join(SLOWED)] and regress.exit_code(table) == 3
    assert not (table["verdict"] == regress.SLOWER).any()
    fewer = bc[bc["server_id"] != "mtp4"]
    assert regress.exit_code(regress.regress(bc, br, fewer, br)) == 0  # complete: it measured other cells
    lost = regress.lost_cells(regress.regress(bc, br, fewer, br, new_incomplete=True))
    assert lost and all(c.startswith("mtp4/") for c in lost)
    # the command: a run folder whose summary says a job failed, one server's cells gone
    partial = tmp_path / "partial"
    shutil.copytree(base, partial)
    shutil.rmtree(partial / "cells" / "mtp4")
    matrix = pd.read_parquet(partial / "matrix.parquet")
    matrix[matrix["server_id"] != "mtp4"].to_parquet(partial / "matrix.parquet")
    (partial / "run-summary.json").write_text(json.dumps({"succeeded": False, "failed": 1, "jobs": 40}))
    assert main(["regress", str(base), str(partial), "--store", str(tmp_path / "none.sqlite")]) == 3
    assert "the new run lost" in (err := capsys.readouterr().err) and "mtp4/" in err


def test_each_outcome_has_its_exit_status_words_json_and_junit(recorded, tmp_path, capsys):
    """A Client-bound cell in the new run is a measurement problem (5), not a lost cell; runs that share no cell
    are nothing comparable (4); a folder that is not a run is bad input (2); the headline names every outcome;
    --json and --junit say the same for machines."""

    from speedmatrix.history.gate import Outcome
    from speedmatrix.report import regression

    base, slow, _ = recorded
    _, bc, br = store.manifest(base)
    client = bc.copy()
    client.loc[(client["server_id"] == "mtp2") & (client["cell_id"] == SLOWED[1]), "status"] = "client_bound"
    table = regress.regress(bc, br, client, br)
    assert regress.outcome(table) == Outcome.MEASUREMENT and regress.lost_cells(table) == []
    assert regress.measurement_cells(table) == ["/".join(SLOWED)]
    head = regression.answer(table)
    assert "**No cell slower**" in head and "**1 not judged for a measurement problem**" in head
    assert "0 lost" in head and "Outcome: measurement (exit 5)" in head
    # a cell whose new run kept three of the base's requests: a measurement problem, said with both counts; the
    # same three in both runs (a cell that sends three): the cell's design, no verdict and no problem
    key = (br["server_id"] == SLOWED[0]) & (br["cell_id"] == SLOWED[1])
    short = pd.concat([br[~key], regress.counted(br[key]).head(3)])
    cut = regress.regress(bc, br, bc, short)
    assert regress.measurement_cells(cut) == ["/".join(SLOWED)] and regress.outcome(cut) == Outcome.MEASUREMENT
    assert cut["reason"].str.contains("the new run has 3 requests with this figure").any()
    both = regress.regress(bc, short, bc, short)
    assert regress.measurement_cells(both) == [] and regress.outcome(both) == Outcome.PASS
    # nothing in common: another experiment's cells
    apart = regress.regress(bc[bc["server_id"] == "base"], br, bc[bc["server_id"] == "mtp4"], br)
    assert regress.outcome(apart) == Outcome.NOTHING_COMPARABLE
    # the command: a slower cell, its JSON and JUnit beside the markdown
    js, junit = tmp_path / "verdict.json", tmp_path / "junit.xml"
    code = main(["regress", str(base), str(slow), "--json", str(js), "--junit", str(junit),
                 "--store", str(tmp_path / "none.sqlite")])
    doc = json.loads(js.read_text())
    assert code == doc["exit_status"] == 1 and doc["outcome"] == "slower"
    assert doc["found"] == {"slower": ["/".join(SLOWED)]} and doc["counts"]["slower"] == 1
    assert doc["headline"].startswith("1 cell slower") and len(doc["rows"]) == len(regress.regress(
        bc, br, *store.manifest(slow)[1:]))
    suite = ET.parse(junit).getroot()
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [SLOWED]
    assert suite.get("failures") == "1" and int(suite.get("tests")) == sum(
        doc["counts"][v] for v in ("slower", "faster", "inconclusive", "no change", "not comparable"))
    capsys.readouterr()
    assert main(["regress", str(base), str(base), "--json", "-", "--store", str(tmp_path / "none.sqlite")]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "pass"  # only the JSON on stdout
    # bad input: a folder that is not a run
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    assert main(["regress", str(base), str(empty), "--store", str(tmp_path / "none.sqlite")]) == Outcome.BAD_INPUT
    assert "not a run's results folder" in capsys.readouterr().err


def test_a_run_against_itself_changes_nothing(recorded):
    base, _, _ = recorded
    _, cells, reqs = store.manifest(base)
    table = regress.regress(cells, reqs, cells, reqs)
    judged = table[table["verdict"] != regress.NOT_COMPARABLE]
    assert len(judged) >= 3 * 12 and (judged["change"] == 0).all() and regress.exit_code(table) == 0
    # the medians and means: no change; a tail percentile of a few hundred requests may be too wide to tell, never
    # a change
    tails = judged["figure"].str.startswith("p9")
    assert (judged.loc[~tails, "verdict"] == regress.SAME).all()
    assert judged.loc[tails, "verdict"].isin(regress.NO_VERDICT).all() and tails.sum() >= 12
    few = table[table["figure"].isin(["p99_ttft_ms"]) & (table["verdict"] == regress.NOT_COMPARABLE)]
    assert len(few) and not few["measurement"].any() and few["reason"].str.contains("percentile").all()


def test_a_slower_cell_is_found_and_the_exit_code_says_so(recorded, tmp_path, capsys):
    base, slow, other = recorded
    _, bc, br = store.manifest(base)
    _, sc, sr = store.manifest(slow)
    table = regress.regress(bc, br, sc, sr)
    per_cell = regress.cell_verdicts(table).set_index(["server_id", "cell_id"])["verdict"]
    assert per_cell[SLOWED] == regress.SLOWER
    assert (per_cell.drop(SLOWED).isin([*regress.NO_VERDICT, regress.NOT_COMPARABLE])).all()
    rate = table[(table["cell_id"] == SLOWED[1]) & (table["server_id"] == SLOWED[0])
                 & (table["figure"] == "request_tok_s")].iloc[0]
    assert rate["change"] == pytest.approx(1 / 1.4 - 1, abs=0.01) and rate["ci_high"] < 0
    assert table.iloc[0]["verdict"] == regress.SLOWER  # the changed cells first
    # a measurement made differently is never compared
    _, oc, orq = store.manifest(other)
    mixed = regress.regress(bc, br, oc, orq)
    row = mixed[(mixed["server_id"] == "base") & (mixed["cell_id"] == "decode-ctx128-c1-temp0.7")].iloc[0]
    assert row["verdict"] == regress.NOT_COMPARABLE and "measured differently" in row["reason"]
    # the command: exit 1 on a slowdown, the table and its files written
    out = tmp_path / "verdict"
    assert main(["regress", str(base), str(slow), "--out", str(out), "--store", str(tmp_path / "none.sqlite")]) == 1
    printed = capsys.readouterr().out
    assert "**1 cell slower**" in printed and SLOWED[1] in printed
    assert (out / "regress.csv").exists() and "Against run" in (out / "regress.md").read_text()
    # the report's section when the config names a run to judge against (a folder here; a store id works too)
    from speedmatrix.report import regression

    section = markdown(regression.against_blocks(str(base), None, slow))
    assert section.startswith("## Against run ") and "**1 cell slower**" in section
    # a minimum effect above the slowdown: no verdict of slower
    assert main(["regress", str(base), str(slow), "--min-effect", "60", "--store", str(tmp_path / "x.sqlite")]) == 0


def test_a_run_against_a_published_matrix(tmp_path, capsys):
    """`speedmatrix reproduce` on the recorded seed 002 twin: every published decode cell beside the twin's, status
    agreement counted from those rows, each context row's boundary; a published file that is the run's own statuses
    agrees everywhere; a bad file names itself and the key."""
    from speedmatrix.history import reproduce
    from speedmatrix.report import compare

    run = REPO / "docs" / "results" / "seed002-tiny-reproduce"
    published = reproduce.load(REPO / "config" / "published" / "seed002-speed-matrix.yaml")
    found = reproduce.compare(compare.load_matrix(run), published)
    cells, rows = found["cells"], found["rows"]
    assert len(cells) == 48 and len(rows) == 6 and found["summary"]["measured"] == 48
    assert found["summary"]["agree"] == int((cells["status_run"] == cells["status_published"]).sum())
    over = cells[cells["status_run"] == "over_capacity"]
    assert (over["kv_multiple"] > 1).all()  # over capacity is where a cell needs more than the KV cache
    assert (cells.loc[cells["status_run"] != "over_capacity", "kv_multiple"] <= 1).all()
    assert len(found["prefill"]) == 7 and found["prefill"]["prompt_tok_s_ratio"].notna().sum() == 6
    # the run's own statuses as a published matrix: agreement everywhere, every boundary the same
    matrix = compare.load_matrix(run)
    dec = matrix[matrix["workload"] == "decode"]
    own = {"source": "this run", "decode": {"concurrency": sorted(int(c) for c in dec["concurrency"].unique()),
                                            "status": {}}}
    for ctx, g in dec.groupby("context_tokens"):
        own["decode"]["status"][int(ctx)] = [str(reproduce.AS_PUBLISHED.get(s, "valid")) for s in
                                             g.sort_values("concurrency")["status"]]
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(own))
    mine = reproduce.compare(matrix, reproduce.load(path))
    agreeing = mine["cells"]["status_run"].isin(reproduce.STATUSES)
    assert mine["cells"].loc[agreeing, "agree"].all() and mine["rows"]["same_boundary"].all()
    # the exit status: report only by default; under a minimum agreement, 1; a run of an experiment the file does
    # not name, bad input unless --any-experiment; nothing to compare, 4
    seed = str(REPO / "config" / "published" / "seed002-speed-matrix.yaml")
    share = found["summary"]["agree"] / found["summary"]["measured"]
    assert main(["reproduce", str(run), seed]) == 0
    assert main(["reproduce", str(run), seed, "--min-agreement", f"{share * 100 + 1:.3f}"]) == 1
    assert main(["reproduce", str(run), seed, "--min-agreement", f"{share * 100 - 1:.3f}"]) == 0
    js, junit = tmp_path / "reproduce.json", tmp_path / "reproduce.xml"  # the same for machines
    assert main(["reproduce", str(run), seed, "--min-agreement", f"{share * 100 + 1:.3f}", "--json", str(js),
                 "--junit", str(junit)]) == 1
    doc = json.loads(js.read_text())
    assert doc["exit_status"] == 1 and doc["outcome"] == "slower" and len(doc["cells"]) == 48
    suite = ET.parse(junit).getroot()
    assert int(suite.get("tests")) == 48 and int(suite.get("failures")) == 48 - found["summary"]["agree"]
    other = REPO / "docs" / "results" / "h200-tiny-trained-spec"
    assert main(["reproduce", str(other), seed, "--server", "base"]) == 2  # h200-tiny-trained-spec: not named
    capacity = pd.read_parquet(other / "matrix.parquet").query("workload == 'capacity' and server_id == 'base'")
    capacity.to_parquet(tmp_path / "matrix.parquet")  # no decode cell: nothing the matrix can be compared with
    assert main(["reproduce", str(tmp_path / "matrix.parquet"), seed, "--any-experiment"]) == 4
    assert main(["reproduce", str(tmp_path / "no-run"), seed]) == 2  # not a run: bad input
    # compare: the same statuses for bad input and for runs with no cell in common; a run kept with its matrix
    # only has no requests to judge: nothing comparable, its matrix's figures shown
    assert main(["compare", str(run), str(tmp_path / "matrix.parquet")]) == 4
    assert main(["compare", str(run), str(tmp_path / "no-run")]) == 2
    assert main(["compare", str(run), str(run)]) == 4
    assert "neither run kept the cell's requests" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: x\ndecode:\n  concurrency: [1, 2]\n  status:\n    128: [valid, maybe]\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: key 'decode.status.128': 'maybe'"):
        reproduce.load(bad)


def test_a_report_shows_its_cells_in_earlier_runs(recorded, tmp_path):
    """With the store holding an earlier run of the experiment, the report's section gives each cell's output tok/s
    in it beside this run's, and a chart of the ratios; this run itself is not counted as earlier."""
    from speedmatrix.report import regression

    base, slow, _ = recorded
    db = tmp_path / "history.sqlite"
    store.add(base, db)
    store.add(slow, db)
    out = {"md": str(tmp_path / "report" / "report.md")}
    blocks = regression.earlier_runs_blocks(db, "h200-tiny-trained-spec", slow, pd.read_parquet(slow /
                                            "matrix.parquet"), out)
    text = markdown(blocks)
    earlier = store.runs(db)["run_id"].iloc[0]
    assert "This run's cells in earlier runs" in text and earlier in text
    assert store.runs(db)["run_id"].iloc[1] not in text.split("|", 1)[1].split("\n")[0]  # not a column of its own
    assert (tmp_path / "report" / "charts" / "earlier_runs.png").stat().st_size > 0
    # the selection is history --trend's: the same cells and server config on a machine of this run's kind, whatever
    # the experiment's name; this run on another kind of machine has no earlier run
    assert regression.earlier_runs_blocks(db, "another-name", slow, pd.read_parquet(slow / "matrix.parquet"), out)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(slow, elsewhere, ignore=shutil.ignore_patterns("requests.parquet", "*.requests.parquet"))
    matrix = pd.read_parquet(elsewhere / "matrix.parquet").assign(gpu_name="NVIDIA H100 80GB HBM3")
    matrix.to_parquet(elsewhere / "matrix.parquet")
    assert regression.earlier_runs_blocks(db, "h200-tiny-trained-spec", elsewhere, matrix, out) == []


def test_published_figures_of_named_cells_beside_the_runs():
    """Seed 003's tables name a server config, context and concurrency: each published figure is set beside the
    run's cell of the same three (a ratio where the run has it), per GPU when asked."""
    from speedmatrix.history import reproduce
    from speedmatrix.report import regression

    published = reproduce.load(REPO / "config" / "published" / "seed003-capacity.yaml")
    run = pd.DataFrame([{"server_id": "capacity-qat-12b-v1", "context_tokens": 8192, "concurrency": 128,
                         "status": "valid", "total_tok_s": 1053 * 1.1, "p95_ttft_ms": 1580.0, "workload": "capacity"}])
    found = reproduce.compare(run, published, gpu="RTX PRO 6000")
    named = found["named"]
    assert set(named["gpu"]) == {"RTX PRO 6000"} and found["summary"]["named_measured"] == 1
    hit = named[named["status"].notna()].iloc[0]
    assert hit["total_tok_s_ratio"] == pytest.approx(1.1) and hit["p95_ttft_ms_ratio"] == pytest.approx(1.0)
    assert "**1 of " in markdown(regression.reproduction_blocks(found))


def test_acceptance_and_energy_stand_side_by_side_beside_the_verdict():
    from speedmatrix.report import regression

    cell = {"server_id": "mtp2", "cell_id": "decode-ctx128-c1"}
    base = pd.DataFrame([{**cell, "spec_acceptance_rate": 0.61, "total_tok_s": 200.0,
                          "gpu_energy_per_output_token_j": 0.5, "gpu_energy_per_goodput_token_j": 0.625}])
    new = pd.DataFrame([{**cell, "spec_acceptance_rate": 0.64, "total_tok_s": 210.0,
                         "gpu_energy_per_output_token_j": 0.45, "gpu_energy_per_goodput_token_j": None}])
    t = regression.beside_table(base, new)
    assert t.columns[:4] == ["Server config", "Cell", "acceptance (base)", "acceptance (new)"]
    assert "above idle (base)" not in t.columns  # neither run recorded it
    assert t.rows == [["mtp2", "decode-ctx128-c1", "61.0%", "64.0%", "200.0", "210.0", "0.5 J", "0.45 J",
                       "0.625 J", "—"]]
    # no speculation and no GPU in either run: nothing to put beside the verdict
    plain = pd.DataFrame([{**cell, "total_tok_s": 200.0}])
    assert regression.beside_table(plain, plain) is None


def test_the_verdict_says_where_each_run_ran():
    """Two runs on hosts whose cores ran Python at another pace compare the hosts as well as the software (a tiny
    model on a GPU is bound by the host's CPU side): the verdict says whether they shared a host and a boot, and how
    far apart their host probes were. Runs stored before the probe say nothing."""
    one = {"machine_id": "a" * 12, "boot_id": "b" * 12, "host_probe_ms": 12.0}
    assert regress.hosts({}, {}) is None and regress.hosts({"host_probe_ms": float("nan")}, {}) is None
    assert regress.hosts(one, dict(one)).startswith("one host, one boot; host probe 12 ms against 12 ms (the same pace")
    other = {"machine_id": "c" * 12, "boot_id": "d" * 12, "host_probe_ms": 15.0}
    said = regress.hosts(one, other)
    assert said.startswith("two machines; ") and "the new host slower by 25%" in said
    reboot = {**one, "boot_id": "e" * 12, "host_probe_ms": 11.0}
    assert "one machine id, two boots" in regress.hosts(one, reboot)
    assert "the new host faster by 8%" in regress.hosts(one, reboot)
    from speedmatrix.report import regression

    printed = markdown(regression.blocks(pd.DataFrame(columns=["server_id", "cell_id", "verdict"]),
                                         {"run_id": "x", "status": "complete", **one},
                                         {"run_id": "y", "status": "complete", **other}))
    assert "- Where: two machines; host probe 12 ms against 15 ms" in printed


def test_run_to_run_noise_is_read_only_from_runs_on_a_machine_of_the_same_kind(recorded, tmp_path):
    """The minimum effect counts the spread of a cell over the store's other runs of the same runtime; a run of
    that runtime on another kind of machine (here another GPU) differs by the machine, not by noise, and is left
    out. A run of a release on an H100 once widened an H200 verdict's minimum effect past the slowdown it judged."""
    from speedmatrix.report import regression

    base, slow, _ = recorded
    again = tmp_path / "again"  # the same runtime measured once more: another run of the store
    shutil.copytree(base, again)
    for doc_path in (again / "cells").glob("*/*.json"):
        doc = json.loads(doc_path.read_text())
        doc["result"]["started_at"] = "2026-12-04T10:00:00+0000"
        doc_path.write_text(json.dumps(doc))
    db = tmp_path / "history.sqlite"
    ids = [store.add(run, db)[0] for run in (base, slow, again)]
    assert len(set(ids)) == 3
    rows = store.runs(db).set_index("run_id")
    b, n = ({**rows.loc[i].to_dict(), "run_id": i} for i in ids[:2])
    assert regress.machine_kind(b) == regress.machine_kind(rows.loc[ids[2]].to_dict())
    assert [len(side) for side in regression.siblings(db, b, n)] == [1, 1]
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET gpu_name = 'NVIDIA H100 80GB HBM3' WHERE run_id = ?", (ids[2],))
    assert regression.siblings(db, b, n) == ([], [])


def test_per_figure_minimum_effects_and_a_change_of_machine(recorded, tmp_path, capsys):
    """--min-effect takes one percentage or one per figure ("10%" accepted); runs on another kind of machine have
    their verdicts withheld, the change named, unless --across-machines."""
    assert regress.parse_min_effect("10%") == regress.parse_min_effect("10") == pytest.approx(0.10)
    assert regress.parse_min_effect("output_tok_s=5%, ttft=10") == {"request_tok_s": 0.05, "ttft_ms": 0.10}
    for bad in ("fast", "ttfb=5", "tpot=-3"):
        with pytest.raises(StoreError, match="--min-effect"):
            regress.parse_min_effect(bad)
    base, slow, _ = recorded
    _, bc, br = store.manifest(base)
    _, sc, sr = store.manifest(slow)
    # a minimum effect for request_tok_s above the slowdown, none for the latencies: TTFT still judges it slower
    table = regress.regress(bc, br, sc, sr, {"request_tok_s": 0.6})
    rows = table[(table["server_id"] == SLOWED[0]) & (table["cell_id"] == SLOWED[1])].set_index("figure")
    assert rows.loc["request_tok_s", "verdict"] == regress.INCONCLUSIVE  # a change the minimum effect hides
    assert rows.loc["ttft_ms", "verdict"] == regress.SLOWER
    assert rows.loc["request_tok_s", "min_effect"] == pytest.approx(0.6)
    db = tmp_path / "none.sqlite"
    assert main(["regress", str(base), str(slow), "--min-effect", "abc", "--store", str(db)]) == 2
    # another GPU: withheld, named, exit 4 (nothing comparable); judged with --across-machines
    h200, h100 = {"gpu_name": "NVIDIA H200", "cpu_model": "x", "cpu_count": 16}, {"gpu_name": "NVIDIA H100"}
    assert regress.machine_change(h200, {**h200, **h100}) == "GPU NVIDIA H200 → NVIDIA H100"
    assert regress.machine_change(h200, {}) is None  # a run that recorded no machine: not a change
    held = regress.withhold(regress.regress(bc, br, sc, sr), regress.machine_change(h200, {**h200, **h100}))
    from speedmatrix.history.gate import Outcome
    from speedmatrix.report import regression

    assert regress.outcome(held) == Outcome.NOTHING_COMPARABLE
    assert regression.answer(held).startswith("**Another kind of machine**: (GPU NVIDIA H200 → NVIDIA H100)")


def test_the_store_and_history_say_what_to_do(recorded, tmp_path, capsys):
    """An unknown cell is bad input with the store's cells listed; a store no run was added to answers in words;
    a missing store names the option that adds a run; the verdict's files get the mode a plain open() gives."""
    base, slow, _ = recorded
    db = tmp_path / "history.sqlite"
    store.add(base, db)
    assert main(["history", "--store", str(db), "--cell", "base/no-such-cell"]) == 2
    err = capsys.readouterr().err
    assert "base/no-such-cell: in no stored run" in err and "base/decode-ctx128-c1-temp0.7" in err
    assert main(["history", "--store", str(db), "--cell", "base/decode-ctx128-c1-temp0.7"]) == 0
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    assert store.cell_history(empty, "base", "x").empty and store.stored_cells(empty) == []
    assert main(["history", "--store", str(empty), "--cell", "base/x"]) == 2
    assert "holds no cell yet" in capsys.readouterr().err
    with pytest.raises(StoreError, match="speedmatrix history --add"):
        store.runs(tmp_path / "missing.sqlite")
    # for a script: the folder's run id, the runs and a cell's rows as JSON or CSV
    rid, _ = store.add(base, db)
    assert main(["history", "--id", str(base)]) == 0 and capsys.readouterr().out.strip() == rid
    assert main(["history", "--id", str(tmp_path / "nowhere")]) == 2
    capsys.readouterr()
    assert main(["history", "--store", str(db), "--format", "json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [rid]
    assert main(["history", "--store", str(db), "--cell", "base/decode-ctx128-c1-temp0.7", "--format", "csv"]) == 0
    assert pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))["run_id"].tolist() == [rid]
    out = tmp_path / "verdict"
    main(["regress", str(base), str(slow), "--out", str(out), "--store", str(db)])
    from speedmatrix.core import atomic

    for name in ("regress.md", "regress.html"):  # as a plain open() makes them: 0644 under the usual umask
        assert (out / name).stat().st_mode & 0o777 == atomic.MODE == 0o666 & ~atomic._umask(), name


def test_a_cells_trend_names_each_runs_machine_and_selects_by_machine_and_config(recorded, tmp_path, capsys):
    """history --cell: each run's experiment, runtime and machine in its row; --machine and --same-config narrow
    the runs (a run on another GPU, a run of another server config left out); --chart draws the trend."""
    base, slow, _ = recorded
    other = tmp_path / "other-gpu"
    shutil.copytree(slow, other)
    child = "h200-tiny-trained-spec-next"  # the same cells measured later on another card, by an extends: child
    for doc_path in (other / "cells").glob("*/*.json"):
        doc = json.loads(doc_path.read_text())
        doc["result"]["started_at"] = "2026-12-04T10:00:00+0000"
        doc["experiment"] = child
        doc_path.write_text(json.dumps(doc))
    matrix = pd.read_parquet(other / "matrix.parquet")
    matrix["gpu_name"] = "NVIDIA H100 80GB HBM3"
    matrix["experiment"] = child
    matrix.to_parquet(other / "matrix.parquet")
    db = tmp_path / "history.sqlite"
    for run in (base, slow, other):
        store.add(run, db)
    cell = "base/decode-ctx128-c1-temp0.7"
    assert main(["history", "--store", str(db), "--cell", cell]) == 0
    table = capsys.readouterr().out
    assert "| GPU | CPU |" in table and "NVIDIA H100 80GB HBM3" in table and child in table
    assert main(["history", "--store", str(db), "--cell", cell, "--machine", "h200", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all("H200" in r["run_gpu_name"] for r in rows)
    png = tmp_path / "trend.png"
    assert main(["history", "--store", str(db), "--cell", cell, "--same-config", "--chart", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    # an experiment's family: every cell of its newest run, in each run of the same server config, the child's too
    capsys.readouterr()
    assert main(["history", "--store", str(db), "--trend", "h200-tiny-trained-spec", "--format", "csv"]) == 0
    fam = pd.read_csv(io.StringIO(capsys.readouterr().out))
    cells = fam[["server_id", "cell_id"]].drop_duplicates()
    assert len(fam) == 3 * len(cells) and set(fam["run_experiment"]) == {"h200-tiny-trained-spec", child}
    assert main(["history", "--store", str(db), "--trend", "h200-tiny-trained-spec", "--machine", "H200",
                 "--chart", str(png)]) == 0
    assert "| Server config | Cell |" in (out := capsys.readouterr().out) and "H100" not in out
    assert main(["history", "--store", str(db), "--trend", "no-such-experiment"]) == 2
    assert "the store's experiments: " in capsys.readouterr().err
    # a run of another server config (a flag changed) is left out; an extends: child of the same config is not
    from speedmatrix.report import regression

    found = store.cell_history(db, "base", "decode-ctx128-c1-temp0.7")
    found.loc[found.index[0], "config_sha256"] = "another"
    assert len(regression.select_history(found, same_config=True)) == len(found) - 1


def test_tags_latest_and_removal_name_runs_for_a_script(recorded, tmp_path, capsys):
    """history --tag names a run (the name moves on a second --tag), latest is the newest run, either is a run id
    for regress and compare; --remove takes a run out whole; a bad tag name says what a tag is."""
    base, slow, _ = recorded
    db = tmp_path / "history.sqlite"
    first, _ = store.add(base, db)
    second, _ = store.add(slow, db)
    assert main(["history", "--store", str(db), "--tag", "baseline", str(base)]) == 0
    assert store.resolve(db, "baseline") == first and store.resolve(db, "latest") == second
    assert main(["history", "--store", str(db), "--id", "latest"]) == 0 and capsys.readouterr().out.split()[-1] \
        == second
    assert main(["regress", "baseline", "latest", "--store", str(db), "--json", "-"]) == 1  # the slowed cell
    assert json.loads(capsys.readouterr().out)["base"] == first
    assert main(["compare", "baseline", "latest", "--store", str(db), "--json", "-"]) == 1
    assert json.loads(capsys.readouterr().out)["found"]["slower"] == ["/".join(SLOWED)]
    store.tag(db, "baseline", second)  # the baseline moves forward
    assert store.runs(db).set_index("run_id").loc[second, "tags"] == "baseline"
    capsys.readouterr()
    assert main(["history", "--store", str(db)]) == 0 and f"| {second} | baseline |" in capsys.readouterr().out
    with pytest.raises(StoreError, match="a tag is a letter"):
        store.tag(db, "latest", first)
    assert main(["history", "--store", str(db), "--remove", "baseline"]) == 0
    assert list(store.runs(db)["run_id"]) == [first] and store.tag_names(db) == {}
    assert store.cells(db, second).empty and store.requests(db, second).empty


def test_a_run_cut_short_stacks_its_requests_without_pandas_warnings():
    """A cell whose requests all failed has every timing column missing: stacking it with the others keeps its rows
    and takes no column's type from it, with no FutureWarning (a run cut short printed one per file)."""
    import warnings

    from speedmatrix.core import frames

    good = pd.DataFrame({"server_id": ["a", "a"], "ttft_ms": [10.0, 12.0], "error": [None, None]})
    failed = pd.DataFrame({"server_id": ["a"], "ttft_ms": [None], "error": ["ServerDisconnected"]}).astype(object)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = frames.stack([good, failed, good.iloc[:0]])
    assert list(got.columns) == ["server_id", "ttft_ms", "error"] and len(got) == 3
    assert got["ttft_ms"].dtype == float and got["error"].tolist()[2] == "ServerDisconnected"


def test_the_run_to_run_part_is_a_prediction_interval_and_can_be_family_wise(recorded):
    """One more run differs from the stored runs' mean by chance within Student's t times sqrt(1 + 1/m) of their
    spread (none known under two runs); --family-wise widens it to the level of the whole run (Bonferroni), so a
    minimum effect is never smaller with it."""
    assert regress.prediction_factor(1) == 0.0
    assert regress.prediction_factor(2) == pytest.approx(12.706 * 1.5 ** 0.5, rel=1e-3)
    assert regress.prediction_factor(6) == pytest.approx(2.571 * (7 / 6) ** 0.5, rel=1e-3)
    assert regress.prediction_factor(6, 1 - 0.05 / 100) > 3 * regress.prediction_factor(6)
    base, slow, other = recorded
    _, bc, br = store.manifest(base)
    _, sc, sr = store.manifest(slow)
    _, oc, orq = store.manifest(other)
    sib = ([(oc, orq), (sc, sr)], [(oc, orq)])
    each = regress.regress(bc, br, bc, br, siblings=sib).set_index(["server_id", "cell_id", "figure"])
    whole = regress.regress(bc, br, bc, br, siblings=sib, family_wise=True).set_index(
        ["server_id", "cell_id", "figure"])
    judged = each["min_effect"].notna()
    assert (whole.loc[each.index[judged], "min_effect"] >= each.loc[judged, "min_effect"] - 1e-12).all()
    assert (whole.loc[each.index[judged], "min_effect"] > each.loc[judged, "min_effect"]).any()
    # before the store holds --min-runs runs of the base's side, a change is inconclusive, said why
    early = regress.regress(bc, br, sc, sr, min_runs=3)
    slowed = early[(early["server_id"] == SLOWED[0]) & (early["cell_id"] == SLOWED[1])
                   & (early["figure"] == "request_tok_s")].iloc[0]
    assert slowed["verdict"] == regress.INCONCLUSIVE and "--min-runs" in slowed["reason"]
    assert regress.outcome(regress.regress(bc, br, sc, sr, siblings=([(oc, orq), (bc, br)], []), min_runs=3)) == 1
