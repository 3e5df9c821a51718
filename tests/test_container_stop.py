"""A container runtime's stop command runs after the server's process group ends, unless docker said
the container was not started (exit 125, e.g. a name already in use by someone else's container)."""

from __future__ import annotations

import sys

import pytest

from speedmatrix.serve import broker


@pytest.mark.parametrize("exit_code, removed", [(125, False), (1, True)])
def test_stop_argv_only_for_a_container_we_started(tmp_path, exit_code, removed):
    marker = tmp_path / "removed"
    args = broker.BrokerArgs(
        state_dir=tmp_path / "state", argv=[sys.executable, "-c", f"import sys; sys.exit({exit_code})"], env={},
        url="http://127.0.0.1:9", startup_timeout_s=10, idle_timeout_s=10, owner=None, server_id="s",
        experiment="e", stop_argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"])
    assert broker.run_broker(args) == 2  # the start failed
    assert "exited with code" in (tmp_path / "state" / "startup-error.json").read_text()
    assert marker.exists() == removed
