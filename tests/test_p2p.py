"""The P2P check's reading of NCCL logs, its verdicts, and "not applicable" without several GPUs."""

from __future__ import annotations

from conftest import REPO
from speedmatrix.serve import p2p

LOGS = REPO / "tests" / "data" / "nccl"


def test_direct_p2p_log_passes():
    nccl = p2p.parse_nccl_log((LOGS / "two-gpus-cumem.log").read_text())
    assert nccl["nccl_version"] == "2.27.5+cuda12.9"
    assert nccl["is_all_direct_p2p"] is True and nccl["is_all_cuda_p2p"] is True and nccl["p2p_type_lines"] == 2
    assert nccl["transports"] == {"P2P/CUMEM": 4} and nccl["only_p2p"]
    passed, reason = p2p.verdict({"0->1": True, "1->0": True}, nccl)
    assert passed, reason


def test_shm_fallback_fails_with_advice():
    nccl = p2p.parse_nccl_log((LOGS / "two-gpus-shm.log").read_text())
    assert nccl["is_all_cuda_p2p"] is False and nccl["transports"] == {"SHM": 4}
    passed, reason = p2p.verdict({"0->1": True, "1->0": True}, nccl)
    assert not passed and "isAllCudaP2p 0" in reason and "iommu" in reason.lower()


def test_missing_peer_access_fails_first():
    nccl = p2p.parse_nccl_log((LOGS / "two-gpus-cumem.log").read_text())
    passed, reason = p2p.verdict({"0->1": False, "1->0": True}, nccl)
    assert not passed and "0->1" in reason


def test_one_gpu_or_cpu_is_not_applicable():
    for gpus, device in ((1, "gpu"), (2, "cpu")):
        r = p2p.check_server(gpus, device)
        assert r["applicable"] is False and r["passed"] is True and "not applicable" in r["reason"]


def test_recorded_h200x2_log():
    """Recorded by the p2p_check rule on a host with two H200s (NV18), 2026-11-29."""
    nccl = p2p.parse_nccl_log((LOGS / "h200x2-recorded.log").read_text())
    assert nccl["nccl_version"] == "2.28.9+cuda13.0"
    assert nccl["is_all_direct_p2p"] is True and nccl["is_all_cuda_p2p"] is True
    assert set(nccl["transports"]) == {"P2P/CUMEM"} and nccl["transports"]["P2P/CUMEM"] >= 36
    assert p2p.verdict({"0->1": True, "1->0": True}, nccl)[0]
