"""Rule datasets_lock: every dataset of the experiment with its source, revision, records and hash."""

from speedmatrix.core import atomic, logs
from speedmatrix.measure import datasets

with logs.to_file(snakemake.log[0]):
    entries = datasets.lock(snakemake.params.datasets)
    atomic.write_json(snakemake.output[0], entries)
    for name, e in entries.items():
        print(f"{name}: {e.get('path') or e.get('hf')} ({e['format']}, {e['records']} records)")
