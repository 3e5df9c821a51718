"""Rule loops: loop verdicts for every saved text of one cell, and the cell's status."""

import pandas as pd

from speedmatrix.core import atomic, logs
from speedmatrix.judge import loopcheck

with logs.to_file(snakemake.log[0]):
    cell = atomic.read_json(snakemake.input.cell)
    check = atomic.read_json(snakemake.input.lossless) if snakemake.input.lossless else None
    verdict = loopcheck.judge_cell(cell, pd.read_parquet(snakemake.input.requests), snakemake.params.settings,
                                   snakemake.params.stability, check)
    atomic.write_json(snakemake.output[0], verdict)
    print(f"loop fraction {verdict['loop_fraction']}, cell status {verdict['cell_status']} "
          f"{verdict['status_reason'] or ''}")
