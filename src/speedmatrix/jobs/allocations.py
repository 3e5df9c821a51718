"""What a cluster run asks its scheduler for, read from Snakemake's own plan: one allocation per server config.

``make plan PROFILE=slurm`` (a dry run) prints, per allocation, the server config, its jobs, the GPUs (and their
model), CPUs, memory and time asked, from the group jobs Snakemake submits (their resources as Snakemake merges
them for ``sbatch``: the time is the sum of the jobs', run one after another), and warns where the partition or
the account is empty. Nothing is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Allocation:
    group: str
    server_id: str
    jobs: int
    gpus: int
    gpu_model: str
    cpus: int
    mem_mb: int
    runtime_min: int
    partition: str
    account: str


def _res(resources: Any, key: str, default: Any = None) -> Any:
    value = resources.get(key, default) if hasattr(resources, "get") else getattr(resources, key, default)
    return default if value is None else value


def _cpus(job: Any) -> int:
    """A job's CPUs as a cluster job asks them: its rule's threads (after --set-threads; a function of the wildcards
    evaluated as Snakemake does), not a dry run's, which are capped at the local cores."""
    if "_cores" not in job.rule.resources:
        return int(job.threads)
    threads = job.rule.resources["_cores"]
    value = threads.evaluate(job.wildcards).value if hasattr(threads, "evaluate") else threads
    return int(value) if isinstance(value, int) else int(job.threads)


def of_dag(dag: Any) -> list[Allocation]:
    """The group jobs of a dry run's DAG (jobs that need to run), as Snakemake would submit them."""
    groups: dict[str, Any] = {}
    for job in dag.needrun_jobs():
        group = dag.get_job_group(job)
        if group is not None:
            groups[group.groupid] = group
    out = []
    for gid, group in sorted(groups.items()):
        members = list(group.jobs)
        res = group.resources
        first = members[0].resources
        out.append(Allocation(
            group=gid,
            server_id=str(dict(members[0].wildcards).get("server_id", gid)),
            jobs=len(members),
            gpus=int(_res(res, "gpu", 0) or 0),
            gpu_model=str(_res(first, "gpu_model", "") or ""),
            cpus=max(_cpus(j) for j in members),
            mem_mb=int(_res(res, "mem_mb", 0) or 0),
            runtime_min=int(_res(res, "runtime", 0) or 0),
            partition=str(_res(first, "slurm_partition", "") or ""),
            account=str(_res(first, "slurm_account", "") or ""),
        ))
    return out


def job_counts(dag: Any) -> str:
    """The jobs a dry run would run, per rule, in the DAG's order of rules."""
    counts = {rule.name: 0 for rule in dag.workflow.rules}
    for job in dag.needrun_jobs():
        counts[job.rule.name] = counts.get(job.rule.name, 0) + 1
    counts = {name: n for name, n in counts.items() if n}
    if not counts:
        return "speedmatrix: nothing to run: every output is up to date"
    width = max(len(n) for n in counts)
    lines = [f"speedmatrix: {sum(counts.values())} jobs would run:"]
    lines += [f"  {name.ljust(width)}  {n:>5}" for name, n in counts.items()]
    return "\n".join(lines)


def _time(minutes: int) -> str:
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def text(allocs: list[Allocation]) -> str:
    """The allocations as a table, their totals, and what is missing."""
    if not allocs:
        return "speedmatrix: no allocation to submit (every server config's jobs are done)"
    rows = [("server config", "jobs", "GPUs", "CPUs", "memory", "time asked", "partition", "account")]
    for a in allocs:
        gpus = f"{a.gpus} x {a.gpu_model}" if a.gpus and a.gpu_model else (str(a.gpus) if a.gpus else "none")
        rows.append((a.server_id, str(a.jobs), gpus, str(a.cpus), f"{a.mem_mb / 1000:g} GB",
                     _time(a.runtime_min), a.partition or "(empty)", a.account or "(empty)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["speedmatrix: the allocations this run would submit (one per server config; its jobs run one after "
             "another, so the time asked is the sum of theirs):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    total_min = sum(a.runtime_min for a in allocs)
    gpu_h = sum(a.gpus * a.runtime_min for a in allocs) / 60
    lines.append(f"  in all: {len(allocs)} allocation(s), {_time(total_min)} asked"
                 + (f", {gpu_h:,.1f} GPU-hours at most" if gpu_h else "")
                 + " (each job asks cluster.job_runtime_min: the first also starts the server)")
    if any(not a.partition for a in allocs):
        lines.append("  warning: the partition is empty: give it, e.g. SNAKEMAKE_ARGS=\"--default-resources "
                     "slurm_partition=<partition> slurm_account=<account>\" (docs/cluster.md)")
    if any(not a.account for a in allocs):
        lines.append("  warning: the account is empty: clusters that charge an account refuse the jobs "
                     "(--default-resources slurm_account=<account>)")
    if any(a.gpus and not a.gpu_model for a in allocs):
        lines.append("  note: any GPU model will do; to ask for one: --config cluster='{gpu_model: h100}'")
    return "\n".join(lines)
