"""Rule p2p_check: CUDA peer access and NCCL's P2P verdict before a tensor-parallel server starts."""

import json

from speedmatrix.core import atomic, logs
from speedmatrix.serve import p2p

with logs.to_file(snakemake.log[0]):
    result = p2p.check_server(snakemake.params.gpus, snakemake.params.device)
    result["server_id"] = snakemake.wildcards.server_id
    print(json.dumps(result, indent=1))
    if not result["passed"]:
        raise SystemExit(f"P2P check failed for server config {snakemake.wildcards.server_id}: {result['reason']} "
                         f"(its launch and cells do not run; details in {snakemake.log[0]})")
    atomic.write_json(snakemake.output[0], result)
