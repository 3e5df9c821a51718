"""The idle watchdog never ends a server while a cell holds it."""

from __future__ import annotations

import fcntl

from speedmatrix import procs


def test_lease_held_only_while_a_cell_holds_it(tmp_path):
    (tmp_path / "lease").touch()
    assert not procs.lease_held(tmp_path)
    with open(tmp_path / "lease", "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        assert procs.lease_held(tmp_path)
    assert not procs.lease_held(tmp_path)
