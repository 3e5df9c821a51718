"""Before a tensor-parallel server starts: do its GPUs reach each other directly, and does NCCL use it?

Seed 000 checks this by hand on a dual-GPU box (CUDA peer access for every
pair; NCCL's ``isAllDirectP2p 1`` / ``isAllCudaP2p 1``; the all-reduce
bandwidth). The ``p2p_check`` rule does it for every server config with
tensor x pipeline parallelism above 1 and writes ``p2p.json``:

- ``torch.cuda.can_device_access_peer`` for every ordered pair;
- an NCCL all-reduce across the GPUs (one process a GPU) with ``NCCL_DEBUG=INFO``,
  whose log is parsed for NCCL's P2P verdict and the transport of every channel
  (``via P2P/...``, ``via SHM/...``, ``via NET/...``), and timed for the bus
  bandwidth (nccl-tests' definition: algorithm bandwidth x 2(n-1)/n);
- a verdict: passed, or failed with what to do (docs/gpu.md: GRUB/IOMMU).

A failed check fails the rule, so that server config's launch and cells do
not run; the others go on. One GPU (or the CPU): "not applicable".

    python -m speedmatrix.serve.p2p --gpus 2 --out p2p.json     # the check by hand
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..core import atomic

# NVLink multicast stays off: on a host whose GPUs others share, a multicast fault can take every GPU down
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
P2P_TYPE_RE = re.compile(r"isAllDirectP2p (\d+)(?: directMode (\d+))? isAllCudaP2p (\d+)")
CHANNEL_RE = re.compile(r"Channel (\d+)(?:/\d+)? : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\]"
                        r"(?: \[(?:send|receive)\])? via (\S+)")
VERSION_RE = re.compile(r"NCCL version (\S+)")
ADVICE = ("CUDA peer-to-peer is not available between these GPUs, so NCCL would bounce every all-reduce through "
          "host memory. On AMD hosts seed 000 needed kernel parameters (GRUB: amd_iommu=on iommu=pt) and the "
          "nvidia-uvm option uvm_disable_iommu=1; check also that ACS is off on the PCIe switches and that "
          "the GPUs share a root complex. See docs/gpu.md.")


def parse_nccl_log(text: str) -> dict[str, Any]:
    """NCCL's own P2P verdict and each channel's transport, from an NCCL_DEBUG=INFO log."""
    types = [tuple(int(x) if x is not None else None for x in m.groups()) for m in P2P_TYPE_RE.finditer(text)]
    transports: dict[str, int] = {}
    for m in CHANNEL_RE.finditer(text):
        base = m.group(4).split("/")[0]  # P2P, SHM, NET, ...
        kind = "/".join(m.group(4).split("/")[:2]) if base == "P2P" else base
        transports[kind] = transports.get(kind, 0) + 1
    version = VERSION_RE.search(text)
    return {
        "nccl_version": version.group(1) if version else None,
        "p2p_type_lines": len(types),
        "is_all_direct_p2p": (all(t[0] == 1 for t in types) if types else None),
        "is_all_cuda_p2p": (all(t[2] == 1 for t in types) if types else None),
        "transports": transports,
        "only_p2p": bool(transports) and all(k.startswith("P2P") for k in transports),
    }


def verdict(peer: dict[str, bool], nccl: dict[str, Any]) -> tuple[bool, str]:
    missing = [pair for pair, ok in peer.items() if not ok]
    if missing:
        return False, f"no CUDA peer access for {', '.join(missing)}. {ADVICE}"
    if nccl.get("is_all_cuda_p2p") is False:
        return False, f"NCCL reports isAllCudaP2p 0. {ADVICE}"
    if nccl["transports"] and not nccl["only_p2p"]:
        others = sorted(k for k in nccl["transports"] if not k.startswith("P2P"))
        return False, (f"NCCL uses {', '.join(others)} between these GPUs, not P2P (isAllDirectP2p "
                       f"{int(bool(nccl.get('is_all_direct_p2p')))}). {ADVICE}")
    if not nccl["transports"]:
        return False, "the NCCL log shows no channel transports (was NCCL_DEBUG=INFO honoured?)"
    return True, "every GPU pair has CUDA peer access and NCCL's channels all run over P2P"


def _worker(rank: int, world: int, port: int, size_mb: int, iters: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.ones(size_mb * 2**20 // 2, dtype=torch.bfloat16, device=f"cuda:{rank}")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) / iters
    if rank == 0:
        nbytes = x.numel() * x.element_size()
        algbw = nbytes / elapsed / 1e9
        Path(out_dir, "bw.json").write_text(json.dumps({
            "size_bytes": nbytes, "iterations": iters, "time_us": elapsed * 1e6, "algbw_gb_s": algbw,
            "busbw_gb_s": algbw * 2 * (world - 1) / world}))
    dist.destroy_process_group()


def run_check(gpus: int, size_mb: int = 256, iters: int = 20) -> dict[str, Any]:
    """The whole check on this machine's first ``gpus`` visible GPUs."""
    import torch

    found = torch.cuda.device_count()
    if found < gpus:
        return {"applicable": True, "passed": False, "gpus": gpus,
                "reason": f"the server config needs {gpus} GPUs; {found} are visible"}
    peer = {f"{i}->{j}": bool(torch.cuda.can_device_access_peer(i, j))
            for i in range(gpus) for j in range(gpus) if i != j}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **SAFE_ENV, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET,GRAPH",
               "NCCL_DEBUG_FILE": f"{tmp}/nccl.%h.%p.log"}
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, "-m", "speedmatrix.serve.p2p", "--worker", str(r),
                                   "--gpus", str(gpus),
                                   "--port", str(port), "--size-mb", str(size_mb), "--iters", str(iters),
                                   "--out", tmp], env=env) for r in range(gpus)]
        rcs = [p.wait(timeout=600) for p in procs]
        log = "\n".join(p.read_text(errors="replace") for p in sorted(Path(tmp).glob("nccl.*.log")))
        bw = atomic.read_json(Path(tmp, "bw.json")) if Path(tmp, "bw.json").exists() else None
    nccl = parse_nccl_log(log)
    passed, reason = verdict(peer, nccl)
    if any(rcs):
        passed, reason = False, f"the NCCL all-reduce failed (exit codes {rcs}); see the log excerpt"
    return {"applicable": True, "passed": passed, "reason": reason, "gpus": gpus,
            "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
            "can_access_peer": peer, "nccl": nccl, "all_reduce": bw,
            "nccl_log_excerpt": [line for line in log.splitlines()
                                 if "P2P Type" in line or " via " in line or "NCCL version" in line][:40]}


def check_server(gpus_needed: int, device: str) -> dict[str, Any]:
    if device == "cpu" or gpus_needed <= 1:
        return {"applicable": False, "passed": True,
                "reason": "not applicable: the server config uses one GPU or none"}
    return run_check(gpus_needed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ns = ap.parse_args(argv)
    if ns.worker is not None:
        _worker(ns.worker, ns.gpus, ns.port, ns.size_mb, ns.iters, ns.out)
        return 0
    result = run_check(ns.gpus, ns.size_mb, ns.iters)
    Path(ns.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result.get(k) for k in ("passed", "reason")}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
