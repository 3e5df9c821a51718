"""The idle watchdog never ends a server while a cell holds it."""

from __future__ import annotations

import fcntl

from speedmatrix.serve import state


def test_lease_held_only_while_a_cell_holds_it(tmp_path):
    (tmp_path / "lease").touch()
    assert not state.lease_held(tmp_path)
    with open(tmp_path / "lease", "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        assert state.lease_held(tmp_path)
    assert not state.lease_held(tmp_path)
