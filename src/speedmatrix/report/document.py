"""A run's report: the blocks of the whole document, then report.md and report.html from the same blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .. import workloads
from ..core import atomic, fmt
from ..core.status import NEEDS_A_LOOK
from ..core.table import Block, Bullets, Contents, Figure, Heading, Image, Para, html_page, markdown
from ..history import reproduce
from ..jobs import aggregate
from ..judge import decide
from ..plan import experiment
from . import answer, charts, regression, sections


def _section(title: str, intro: str, body: Any, level: int = 2) -> list[Block]:
    """A heading, an intro paragraph, and a table or blocks; nothing when the body is empty."""
    if body is None:
        return []
    body = body if isinstance(body, list) else [body]
    return [Heading(level, title), *([Para(intro)] if intro else []), *body]


def server_section(sid: str, m: pd.DataFrame) -> list[Block]:
    """One server config: each workload kind's own table in report order, then all its measurements."""
    out: list[Block] = [Heading(2, f"Server config `{sid}`")]
    for name in workloads.names():
        rows = m[m["workload"] == name]
        if rows.empty:
            continue
        kind = workloads.get(name)
        table = kind.report_table(rows)
        if table is None:
            continue
        out += [Heading(3, kind.title), *([Para(kind.blurb)] if kind.blurb else []), table]
        if kind.footnote:
            out.append(Para(kind.footnote))
    out += [Heading(3, "All measurements"),
            Para("Latencies are medians. Total tok/s is output across all simultaneous requests. Where a cell "
                 "was measured several times (repeats), a figure is the median of its repeats with the 95 % "
                 "interval of their mean (Student's t) in brackets."),
            sections.full_table(m)]
    if "delivery" in m and (m["delivery"] == "batched").any():
        out.append(Para(sections.BATCHED_NOTE))
    if "delivery" in m and (m["delivery"] == "bursts").any():
        out.append(Para(sections.BURSTS_NOTE))
    return out


def summary_blocks(matrix: pd.DataFrame, decisions: pd.DataFrame | None, requests: pd.DataFrame | None = None,
                   plan: answer.Plan | None = None, trade_off: list[Block] = ()) -> list[Block]:
    """The answer first (what the first screen holds): the verdict, each speculative config's speed-up over its
    twin with the crossover named, each config's matrix against the targets; then the best config per target,
    each speculative config in one line, the cells to look at and the trade-off chart. The detail follows."""
    plan = plan or answer.Plan()
    look = by_look(matrix)
    # TPOT's ratio too where a target limits it
    tpot = any(t.tpot_ms is not None for t in plan.targets)
    ratios = answer.speedups(matrix, requests, plan, ("served_tok_s", "tpot_ms") if tpot else "served_tok_s")
    tok_s = ratios[ratios["figure"] == "served_tok_s"]
    best = decide.best_configs(decisions)  # once: the verdict, the stars and the table below read it
    said = answer.verdict(matrix, decisions, tok_s, plan, look, best)
    out: list[Block] = [Heading(2, "Summary"), said]
    speedup = answer.speedup_table(ratios)
    if speedup is not None:
        out += [Heading(3, "Where speculation pays"),
                Para("Speculation over its twin (same model and arguments, no speculation): ×ratio of output tok/s"
                     + (" (above 1 faster) and of TPOT (below 1 faster)" if tpot else "")
                     + " with its 95 % interval, and the verdict (the method: Each speculative config, below)."),
                speedup, Bullets(answer.crossover_lines(tok_s))]
    targets = answer.target_table(matrix, decisions, plan, best)
    if targets is not None:
        out += [Heading(3, "Each config against the targets"),
                Para(answer.matrices_intro(matrix, plan)), targets]
    out += [Contents(), Para(f"In all: {sections.status_counts(matrix)}")]
    out += _section("Best config per target", "The config with the highest goodput where the target holds, at "
                    "each kind and context; in brackets the 95 % interval of its repeats' mean, \"up to\" where "
                    "that interval reaches zero (Decisions, below, has the targets and every cell).",
                    sections.best_config_table(best), level=3)
    out += _section("Each speculative config", "Its sustained-decode cells against the same cells without "
                    "speculation (both Valid or Unstable), its acceptance, and whether its output stays the "
                    "target's (its losslessness check, per sampling setting). Where speculation pays, above: output "
                    "tok/s is each request's tokens over its whole time (the wait for the first included); the "
                    "interval is a bootstrap over the cells' requests, resampled within each repeat (as `speedmatrix "
                    "regress` judges two runs); faster or slower only where it excludes ×1.00 and the change is "
                    "beyond twice the cells' own noise, else within noise; a cell Looped, Lossy or Over capacity on "
                    "either side is not counted.",
                    sections.speculation_pays_table(matrix), level=3)
    out += _section("Cells to look at", "Not plain Valid measurements: Client-bound (the client, not the server, "
                    "set the figure), Saturated, Looped, Unstable, Lossy; each links to its row.",
                    sections.needs_a_look_table(matrix), level=3)
    out += _section("Trade-off", "Output tok/s per user against output tok/s per GPU (per server on the CPU), one "
                    "line per config and context through its concurrencies, the Pareto frontier dashed; Lossy and "
                    "Looped cells left out.", list(trade_off) or None, level=3)
    return out


def by_look(matrix: pd.DataFrame) -> pd.DataFrame:
    """The cells that are not plain Valid measurements (the Cells to look at table's rows)."""
    return matrix[matrix["status"].isin(NEEDS_A_LOOK)]


def decision_blocks(matrix: pd.DataFrame, decisions: pd.DataFrame | None, targets: list) -> list[Block]:
    """Targets, the best config per target, the best sweep point, the Pareto frontier, goodput per cell."""
    best = decide.best_configs(decisions)
    sweep_best = decide.best_sweep_points(matrix)
    points = decide.frontier(decide.pareto_points(matrix))
    per = decide.per_unit(matrix)
    body = [
        *_section("Latency targets", "A request meets a target when its TTFT, its time per output token after the "
                  "first (TPOT) and its end-to-end latency are within the limits; a cell holds the target when, "
                  "for each limit, that percentile of its requests is within it (MLPerf's rule; failed requests "
                  "count as late). Goodput: output tok/s of the requests that met it. A miss is a fact, not an "
                  "error.", sections.targets_table(targets), level=3),
        *_section("Best config per target", "Among the cells where the target holds, the server config with the "
                  "highest goodput at each context (and at which concurrency), with the 95 % interval of its repeats "
                  "where it has them, and the best other config.", sections.best_config_table(best), level=3),
        *_section("Best sweep point per concurrency", "For each sweep: the point with the highest output tok/s at "
                  "each context and concurrency, and the runner-up. Where their intervals overlap, the repeats "
                  "cannot tell them apart.", sections.sweep_best_table(sweep_best), level=3),
        *_section("Pareto frontier", f"Output tok/s per user (the cell's output rate over its mean number of "
                  f"requests in flight) against output tok/s per {per}, over every capacity and decode cell of "
                  "every server config: the frontier's points are those no other cell beats on both (chart: "
                  "Pareto frontier).", sections.pareto_table(points, per), level=3),
        *_section("Goodput per cell", "Each throughput and search cell against each target: whether it holds, the "
                  "share of its requests that met it, the goodput.", sections.goodput_table(decisions), level=3),
    ]
    return [Heading(2, "Decisions"), *body] if body else []


def lossless_blocks(checks: list[dict[str, Any]], matrix: pd.DataFrame, device: str,
                    enabled: bool = True) -> list[Block]:
    """Does each speculative config keep its target's output? The check's verdicts and what they mean."""
    notes = sections.lossless_notes(checks, matrix, device, enabled)
    return _section("Does speculation keep the output?", "Speculative decoding is a speed-up only if the output is "
                    "what the target alone gives. Each speculative config and its twin (the same model and arguments "
                    "without speculation) answered the same prompts, one at a time, with each sampling setting of "
                    "the config's cells and the same seeds; the twin scored every emitted token (the target's "
                    "log-probability of it). Greedy: the outputs must be token-identical. Sampled: the share of "
                    "tokens the target scores below the floor must be the twin's own, within the limit. A Lossy "
                    "setting's cells are Lossy: kept out of the decisions, the Pareto frontier and the best config, "
                    "as Looped cells are. Cells: the cells of the config that took the setting's verdict.",
                    [b for b in (sections.lossless_table(checks, matrix), Bullets(notes) if notes else None) if b]
                    or None, level=3)


def speculation_blocks(matrix: pd.DataFrame, requests: pd.DataFrame | None,
                       checks: list[dict[str, Any]] | None = None, device: str = "gpu",
                       check_enabled: bool = True) -> list[Block]:
    """Speculative decoding per cell, whether it keeps the output, and each dataset category's figures."""
    spec = _section("Speculative decoding", "Each decode cell of a config with a drafter: the server's acceptance "
                    "rate (accepted / drafted tokens), mean acceptance length (1 + accepted per step) and acceptance "
                    "per draft position; the client's reading of the same from each streamed event's tokens, over "
                    "the whole output and before each request's loop starts (a loop is easy to predict: acceptance "
                    "over it is inflated); output tok/s against the same cell of the model without a drafter.",
                    sections.speculative_table(matrix))
    return spec + lossless_blocks(checks or [], matrix, device, check_enabled) + _section(
        "By dataset category", "Cells whose prompts came from a dataset with categories: each "
                           "category's requests, their median time to first token and output rate, and the "
                           "speculative acceptance the client read from their streamed events (the server's "
                           "counters are per cell).", sections.category_table(matrix, requests))


def blocks(matrix: pd.DataFrame, startups: list[dict[str, Any]], lock: dict[str, Any],
           chart_links: dict[str, str] | list[Block],
           experiment_name: str, description: str = "", loop_settings: dict[str, Any] | None = None,
           sweeps: list[tuple[dict[str, Any], list[Any]]] | None = None, gates: list[dict[str, Any]] | None = None,
           models_lock: dict[str, Any] | None = None,
           references: list[dict[str, Any]] | None = None, decisions: pd.DataFrame | None = None,
           targets: list | None = None, requests: pd.DataFrame | None = None,
           checks: list[dict[str, Any]] | None = None, device: str = "gpu",
           check_enabled: bool = True, plan: answer.Plan | None = None) -> list[Block]:
    figures_ = list(chart_links) if isinstance(chart_links, list) else []
    trade_off = [f for f in figures_ if isinstance(f, Figure) and f.title == charts.TRADE_OFF]
    out: list[Block] = [Heading(1, experiment_name)]
    out += summary_blocks(matrix, decisions, requests, plan or answer.Plan(targets=list(targets or [])), trade_off)
    out += [Heading(2, "Run"), *([Para(" ".join(description.split()))] if description else []),
            Bullets(sections.runtime_lines(lock, models_lock) + sections.run_lines(matrix, startups)),
            Heading(2, "Servers"),
            sections.servers_table(matrix, startups)]
    if gates:
        out += _section("Quality gates", "Smoke (a short answer that ends by itself), structured JSON (an answer "
                        "under a JSON schema) and tool calls (every request calls the offered tool with valid "
                        "arguments), against each server config. A failed gate is shown here, never dropped.",
                        sections.gates_table(gates))
    for sweep, servers in sweeps or []:
        vary = "; ".join(f"`{k}` over {', '.join(map(str, (v if isinstance(v, list) else list(v))))}"
                         for k, v in sweep["vary"].items())
        out += _section(sweep.get("title") or f"Sweep {sweep['id']}", f"Sweep `{sweep['id']}`: {vary}.",
                        sections.sweep_tables(matrix, servers))
    out += speculation_blocks(matrix, requests, checks, device, check_enabled)
    out += decision_blocks(matrix, decisions, targets or [])
    synthesized = [n for n, m in ((models_lock or {}).get("models") or {}).items() if m.get("source") == "synthesize"]
    if synthesized:
        out.append(Para(f"Models with random weights ({', '.join(synthesized)}): the serving speed of their shape "
                        "is real; their output, quality gates and speculative acceptance mean nothing."))
    out += _section("Measured side by side", "A GPU pool ran server configs on disjoint GPUs at the same time: "
                    "these cells measured while the cells named beside them did (they share the host's CPU cores, "
                    "PCIe and memory bandwidth; docs/gpu.md gives the interference measured). `parallel: false` "
                    "in an experiment measures its cells alone.", sections.beside_table(matrix))
    out += _section("Precision", "How long each sustained-decode cell measured: its window ends at the first look "
                    "where output tok/s's interval is within the target (a repeat adds its window to the earlier "
                    "ones), and a cell that reaches its longest window or last repeat without it is Unstable "
                    "(`precision:` in the experiment; docs/decisions/0028-precision-instead-of-fixed-time.md). "
                    + (sections.precision_summary(matrix) or ""), sections.precision_table(matrix))
    out += _section("Run-to-run spread", "The same cell measured again (`repeats`), each run a new set of requests "
                    "on the same server.", sections.spread_table(matrix))
    if references:
        notes = sections.reference_notes(references)
        out += _section("Agreement with other clients", "The same shape measured on the same server by speedmatrix "
                        "and by independent clients (`vllm bench serve`, and where named AIPerf and GuideLLM), in "
                        "rotating order, every request greedy with EOS ignored; medians of each client's rounds with "
                        "their range; Δ = the client's median against speedmatrix's. TPOT is per request, (end − "
                        "first token) / (tokens − 1), the figure every client reports (AIPerf and GuideLLM call it "
                        "inter-token latency); ITL is every gap between streamed events (vLLM's and ours). The "
                        "client's CPU seconds and its process's wall time include its start-up.",
                        [sections.reference_table(references), *([Bullets(notes)] if notes else [])])
    out += _section("Roofline (decode, one request)", "Each decode step at concurrency 1 reads every weight once: "
                    "a token takes at least the weights on a GPU (vLLM's \"Model loading took\") over the GPU's peak "
                    "memory bandwidth (src/speedmatrix/data/gpu_peaks.yaml). The last column is that bound as a "
                    "share of the measured median time between tokens.", sections.roofline_table(matrix))
    out += _section("GPU telemetry", "NVML, sampled every 0.2 s during each cell's requests only; power and PCIe "
                    "summed over the server's GPUs, utilisation and clocks averaged.", sections.gpu_table(matrix))
    out += _section("Per GPU", "Each GPU of the tensor-parallel server, per cell (means over the cell's window; "
                    "PCIe from NVML's 20 ms throughput samples). NVML's NVLink data counters are recorded "
                    "(`gpu_nvlink_*`, `gpu_per_gpu` in matrix.parquet) but not shown: on two H200s their rates "
                    "exceeded the links' bandwidth, so their unit or meaning is not settled (docs/gpu.md). Cells "
                    "shorter than a second (prefill) have too few samples for these means.",
                    sections.per_gpu_table(matrix), level=3)
    out += [Heading(2, "Loops"), Para(sections.loop_policy_text(matrix, loop_settings or {}))]
    for sid in sorted(matrix["server_id"].unique()):
        out += server_section(sid, matrix[matrix["server_id"] == sid])
    if chart_links:
        out.append(Heading(2, "Charts"))
        out += ([b for b in chart_links if b not in trade_off] if isinstance(chart_links, list)
                else [Image(title, png) for title, png in chart_links.items()])
    return out


def render(*args: Any, **kw: Any) -> str:
    """The report as markdown (arguments as :func:`blocks`)."""
    return markdown(blocks(*args, **kw))


# label -> the key of its colour (report.table.STATUS_COLOURS)
STATUS_KEYS = {label: key for key, label in fmt.STATUS_LABEL.items()}


def page(doc: list[Block], title: str) -> str:
    """The self-contained HTML page: the Vega code inlined once, statuses coloured."""
    return html_page(doc, title, vega_js=charts.vega_js(), statuses=STATUS_KEYS)


def write(path_md: str | Path, path_html: str | Path, doc: list[Block], title: str) -> None:
    atomic.write_bytes(path_md, markdown(doc).encode())
    atomic.write_bytes(path_html, page(doc, title).encode())


def figures(matrix: pd.DataFrame, requests: pd.DataFrame | None, out: dict[str, str],
            captions_dir: str | Path | None = None) -> list[Block]:
    """Every chart the rule declared (``<name>_png`` in ``out``): its PNG saved, and a Figure where it has data."""
    found: list[Block] = []
    for chart in charts.CHARTS:
        png = out.get(f"{chart.name}_png")
        if png is None:
            continue
        drawn = chart.save(matrix, png, requests)
        if drawn is None:
            continue
        cap = Path(captions_dir) / f"{chart.name}.rst" if captions_dir else None
        caption = " ".join(cap.read_text().split()) if cap and cap.exists() else ""
        caption = caption.removeprefix(f"{chart.title}:").strip()  # the figure names itself
        found.append(Figure(chart.title, drawn.to_dict(), str(Path(png).relative_to(Path(out["md"]).parent)),
                            caption))
    return found


def build(experiment_name: str, experiments_dir: str, matrix_path: str, lock_path: str, launch_paths: list[str],
          out: dict[str, str], gate_paths: list[str] = (), models_lock_path: str | None = None,
          reference_paths: list[str] = (), loop_settings: dict[str, Any] | None = None,
          decisions_path: str | None = None, requests_path: str | None = None,
          captions_dir: str | None = None, lossless_paths: list[str] = (), published_path: str | None = None,
          history_path: str | None = None, against: str | None = None) -> None:
    """The report rule: the charts (HTML + PNG), report.md and report.html.

    ``loop_settings`` replaces the experiment's ``loops:`` in the text (a re-derivation under
    another policy: speedmatrix rederive --policy)."""
    exp = experiment.load(experiment_name, experiments_dir)
    matrix = aggregate.read_matrix(matrix_path)
    lock = atomic.read_json(lock_path)
    startups = [atomic.read_json(Path(p).parent / "startup.json") for p in launch_paths
                if (Path(p).parent / "startup.json").exists()]
    requests = pd.read_parquet(requests_path) if requests_path and Path(requests_path).exists() else None
    chart_links = figures(matrix, requests, out, captions_dir)
    sweeps = [(sw, [s for s in exp.servers if s.sweep == sw["id"]]) for sw in exp.sweeps]
    gates = [atomic.read_json(p) for p in gate_paths]
    models_lock = atomic.read_json(models_lock_path) if models_lock_path else None
    references = [atomic.read_json(p) for p in reference_paths]
    decisions = pd.read_parquet(decisions_path) if decisions_path and Path(decisions_path).exists() else None
    doc = blocks(matrix, startups, lock, chart_links, exp.name, exp.raw.get("description", ""),
                 exp.loops if loop_settings is None else loop_settings, sweeps, gates, models_lock, references,
                 decisions, exp.targets, requests, [atomic.read_json(p) for p in lossless_paths],
                 exp.runtime["device"], exp.lossless["enabled"], answer.Plan.of(exp))
    if published_path:  # the seed's table beside the run's
        doc += regression.reproduction_blocks(reproduce.compare(matrix, reproduce.load(published_path)), level=2)
    if against:  # the regression verdict against the run the user named
        doc += regression.against_blocks(against, history_path, Path(matrix_path).parent)
    if history_path and Path(history_path).exists():  # this run's cells in the stored runs before it
        doc += regression.earlier_runs_blocks(history_path, exp.name, Path(matrix_path).parent, matrix, out)
    write(out["md"], out["html"], doc, exp.name)
    print(f"report: {out['md']}")
