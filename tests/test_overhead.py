"""`speedmatrix walltime` on a constructed run folder whose answer is known (nothing real is timed)."""

from __future__ import annotations

import json
import re

import pytest

from speedmatrix import cli
from speedmatrix.report import walltime as overhead


def write_log(path, *stamps):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"[{s}] line\n" for s in stamps))


def test_wall_time_splits_into_start_ups_windows_and_the_rest(tmp_path):
    run = tmp_path / "run"
    write_log(run / "logs/pin_runtime.log", "23:59:50", "23:59:51")  # the run crosses midnight
    write_log(run / "logs/cells/base/decode-a.log", "23:59:55", "00:01:04")  # 70 s: 40 start-up, 20 window
    write_log(run / "logs/cells/base/decode-b.log", "00:01:05", "00:01:34")  # 30 s: 20 window
    write_log(run / "logs/loops/base/decode-a.log", "00:01:05", "00:01:06")  # beside a cell: not counted again
    write_log(run / "logs/report.log", "00:01:40", "00:01:44")
    (run / "servers/base").mkdir(parents=True)
    (run / "servers/base/starts.jsonl").write_text(json.dumps({"startup_seconds": 40.0}) + "\n")
    for name in ("decode-a", "decode-b"):
        (run / "cells/base").mkdir(parents=True, exist_ok=True)
        (run / f"cells/base/{name}.json").write_text(json.dumps({"result": {"measured_s": 20.0}}))
    got = overhead.analyse(run)
    assert got["wall_s"] == 114 and got["cells"] == 2 and got["server_starts"] == 1
    parts = list(got["parts_s"].values())
    # start-ups 40, windows 40, cell jobs 100 s (70 + 30) less both, other jobs alone 2 + 5, gaps 3 + 5 - 0
    assert parts == [40.0, 40.0, 20.0, 0.0, 7.0, 8.0] and sum(parts) == got["wall_s"] + 1
    assert got["overhead_s"] == 34 and round(got["overhead_fraction"], 3) == 0.298


def test_reference_rounds_are_measurement_not_overhead(tmp_path):
    """The reference rule's rounds (other clients on the same server) are their own part, outside the overhead."""
    run = tmp_path / "run"
    write_log(run / "logs/cells/tp1/capacity-c1.log", "10:00:00", "10:01:39")  # 100 s: 60 start-up, 30 window
    write_log(run / "logs/reference/tp1/capacity-c1.log", "10:01:40", "10:03:19")  # 100 s of other clients
    write_log(run / "logs/report.log", "10:03:20", "10:03:24")
    (run / "servers/tp1").mkdir(parents=True)
    (run / "servers/tp1/starts.jsonl").write_text(json.dumps({"startup_seconds": 60.0}) + "\n")
    (run / "cells/tp1").mkdir(parents=True)
    (run / "cells/tp1/capacity-c1.json").write_text(json.dumps({"result": {"measured_s": 30.0}}))
    got = overhead.analyse(run)
    assert got["wall_s"] == 204 and got["reference_s"] == 100.0
    assert list(got["parts_s"].values()) == [60.0, 30.0, 10.0, 100.0, 5.0, 0.0]
    # wall 204 less start-up 60, window 30 and the reference rounds' 100 s: the cell job's other 10 s and the
    # report's 5, with a second of stamp resolution
    assert got["overhead_s"] == 14.0


def test_a_folder_without_logs_is_refused(tmp_path, capsys):
    assert cli.main(["walltime", str(tmp_path)]) == 2
    assert "no logs/ folder" in capsys.readouterr().err


def test_start_ups_and_windows_side_by_side_count_once(tmp_path):
    """Two configs on a GPU pool: their start-ups and windows overlap; the busy time is their union."""
    run = tmp_path / "run"
    write_log(run / "logs/cells/a/decode-1.log", "10:00:00", "10:01:30")
    write_log(run / "logs/cells/b/decode-1.log", "10:00:00", "10:01:30")
    for sid in ("a", "b"):
        (run / f"servers/{sid}").mkdir(parents=True)
        # both ready at 10:01:00 after 60 s; both windows 10:01:10-10:01:30
        (run / f"servers/{sid}/starts.jsonl").write_text(
            json.dumps({"at": "2026-12-01T10:01:00+0000", "startup_seconds": 60.0}) + "\n")
        (run / f"cells/{sid}").mkdir(parents=True)
        (run / f"cells/{sid}/decode-1.json").write_text(
            json.dumps({"result": {"measured_s": 20.0, "started_at": "2026-12-01T10:01:10+0000"}}))
    got = overhead.analyse(run)
    assert got["wall_s"] == 90 and got["busy_s"] == 80.0 and got["side_by_side_s"] == 80.0
    assert got["overhead_s"] == 10.0


def test_millisecond_stamps_split_to_the_millisecond(tmp_path):
    """A job's log stamps carry milliseconds: a cell job's time outside its window is read to them, not to a
    second a job."""
    from speedmatrix.core import logs

    run = tmp_path / "run"
    with logs.to_file(run / "logs/probe.log"):
        print("a line")
    assert re.match(r"^\[\d\d:\d\d:\d\d\.\d{3}\] a line$", (run / "logs/probe.log").read_text().strip())
    (run / "logs/probe.log").unlink()
    write_log(run / "logs/cells/base/decode-a.log", "10:00:00.250", "10:00:21.650")  # 21.4 s: 20 s window
    write_log(run / "logs/report.log", "10:00:22.000", "10:00:22.500")
    (run / "cells/base").mkdir(parents=True)
    (run / "cells/base/decode-a.json").write_text(json.dumps({"result": {"measured_s": 20.0}}))
    got = overhead.analyse(run)
    assert got["wall_s"] == pytest.approx(22.25)
    parts = list(got["parts_s"].values())  # each to the millisecond (a span ends a millisecond after its stamp)
    assert parts[2] == pytest.approx(1.4, abs=0.002) and parts[4] == pytest.approx(0.5, abs=0.002)
    assert sum(parts) == pytest.approx(22.25, abs=0.002)


def test_a_cell_jobs_own_work_is_told_apart_from_requests_sent_outside_its_window(tmp_path):
    """A prefix-cache cell's cold pass (or a prefill cell's requests) is sent outside the window it records:
    where cells say how long their kind sent requests (``requests_s``), that is not counted as the job's own
    work (prompts, drain waits, counters, writing)."""
    run = tmp_path / "run"
    write_log(run / "logs/cells/base/prefix_cache-a.log", "10:00:00.000", "10:00:12.000")  # 12 s
    write_log(run / "logs/cells/base/prefill-b.log", "10:00:12.500", "10:00:15.500")  # 3 s
    (run / "cells/base").mkdir(parents=True)
    (run / "cells/base/prefix_cache-a.json").write_text(json.dumps({"result": {"measured_s": 5.0, "requests_s": 10.5}}))
    (run / "cells/base/prefill-b.json").write_text(json.dumps({"result": {"requests_s": 2.0}}))
    got = overhead.analyse(run)
    assert got["parts_s"][overhead.SERVER_WORK] == pytest.approx(15.002 - 5.0, abs=0.002)
    assert got["cell_jobs_requests_outside_windows_s"] == pytest.approx(7.5, abs=0.002)
    assert got["cell_jobs_own_s"] == pytest.approx(2.5, abs=0.005)
    assert got["cell_jobs_own_s_per_cell"] == pytest.approx(1.25, abs=0.005)
    assert "the jobs' own work: 2.5 s, 1.25 s a cell" in overhead.text(got)


def test_a_server_started_inside_the_losslessness_check_is_counted_once(tmp_path):
    """The losslessness check's outputs are the first job to use a speculative config's server: its start-up
    happens inside that job, not inside a cell; it is counted once, as a start-up (on an H200 run the split
    gave 65 % start-ups and 73 % "other jobs" of the same wall time)."""
    run = tmp_path / "run"
    write_log(run / "logs/lossless/mtp2/outputs.log", "10:00:00", "10:01:10")  # a 60 s start, then outputs
    write_log(run / "logs/cells/mtp2/decode-a.log", "10:01:11", "10:01:21")
    write_log(run / "logs/report.log", "10:01:22", "10:01:25")
    (run / "servers/mtp2").mkdir(parents=True)
    (run / "servers/mtp2/starts.jsonl").write_text(json.dumps({"startup_seconds": 60.0}) + "\n")
    (run / "cells/mtp2").mkdir(parents=True)
    (run / "cells/mtp2/decode-a.json").write_text(json.dumps({"result": {"measured_s": 9.0}}))
    got = overhead.analyse(run)
    parts = got["parts_s"]
    assert parts["server start-ups"] == 60.0 and parts[overhead.SERVER_WORK] == pytest.approx(13.0, abs=0.01)
    assert parts["other jobs while no server was used (pin, models, loops, aggregate, report)"] == \
        pytest.approx(4.0, abs=0.01)
    assert sum(parts.values()) == pytest.approx(got["wall_s"] + 1, abs=0.01)  # one-second stamps: a second a span


def test_a_damaged_result_file_is_named_not_a_traceback(tmp_path, capsys):
    """A cell JSON cut short (a disk filled, a copy stopped) stops the analysis with the file named and what to do."""
    run = tmp_path / "run"
    write_log(run / "logs/cells/base/decode-a.log", "10:00:00", "10:00:30")
    (run / "cells/base").mkdir(parents=True)
    (run / "cells/base/decode-a.json").write_text('{"result": {"measured_s": 2')
    assert cli.main(["walltime", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cells/base/decode-a.json: not JSON" in err and "run the workflow again" in err
    assert "Traceback" not in err
    # a damaged line of a server's start record is named with its line
    (run / "cells/base/decode-a.json").write_text(json.dumps({"result": {"measured_s": 2.0}}))
    (run / "servers/base").mkdir(parents=True)
    (run / "servers/base/starts.jsonl").write_text(json.dumps({"startup_seconds": 4.0}) + "\n{\"startup_")
    assert cli.main(["walltime", str(run)]) == 2
    assert "servers/base/starts.jsonl: line 2 is not JSON" in capsys.readouterr().err
