"""The ``speedmatrix`` command: what a user may want by hand, without Snakemake."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

import aiohttp

from . import __version__, workloads
from .core import atomic, runfolder
from .core.errors import NoCellInCommon, SpeedmatrixError
from .core.runfolder import RunFolder
from .core.settings import ClientSettings, defaults_of, section_defaults

EPILOG = """\
The whole pipeline runs through Snakemake (`make run`, or
`snakemake --profile profiles/default --config experiment=NAME`);
these subcommands are the pieces a user wants by hand.
"""


def cmd_measure(ns: argparse.Namespace) -> int:
    from .core import atomic
    from .jobs import cells

    target = {k: v for k, v in (("preset", ns.slo_preset), ("ttft_ms", ns.slo_ttft_ms), ("tpot_ms", ns.slo_tpot_ms),
                                ("e2e_ms", ns.slo_e2e_ms), ("percentile", ns.slo_percentile)) if v is not None}
    try:
        cell = workloads.get(ns.workload).manual_cell(ns.context, ns.concurrency, ns.requests, ns.max_tokens,
                                                      ns.duration, ns.shared_prefix, ns.corpus, ns.repeats,
                                                      {**target, "margin": ns.slo_margin} if target else None)
    except (ValueError, SpeedmatrixError) as exc:
        print(f"speedmatrix measure: {exc}", file=sys.stderr)
        return 2
    if ns.temperature or ns.frequency_penalty is not None:
        given = {"temperature": ns.temperature, "top_p": ns.top_p, "seed": ns.sampling_seed,
                 "frequency_penalty": ns.frequency_penalty}
        sampling = defaults_of("sampling", {k: v for k, v in given.items() if v is not None})
        cell = dataclasses.replace(cell, sampling=workloads.sampling_of({"sampling": sampling}))
    given = {"stall_timeout_s": ns.stall_timeout, "ignore_eos": ns.ignore_eos, "seed": ns.seed,
             "busy_wait_s": ns.busy_wait, "prompt_format": ns.prompt_format, "stop_looping": ns.stop_looping,
             "api": ns.api, "usage_per_chunk": {"auto": "auto", "on": True, "off": False}[ns.usage_per_chunk],
             "chat_template_kwargs": {"enable_thinking": False} if ns.no_thinking else None}
    settings = ClientSettings.from_config({k: v for k, v in given.items() if v is not None})
    if settings.api == "chat" and settings.prompt_format != "text":
        print("speedmatrix measure: --api chat takes text prompts (drop --prompt-format token_ids)", file=sys.stderr)
        return 2
    inp = cells.MeasureInput(ns.url.rstrip("/"), ns.model, settings, eos_text=ns.eos_text, tokenizer_dir=ns.tokenizer,
                             progress=lambda m: print(m, file=sys.stderr))
    result, records = asyncio.run(cells.measure(cell, inp))
    # vllm bench serve's keys (output_throughput, median_ttft_ms, ...) at the top level, as tools that read
    # its result files expect; what speedmatrix adds beside them
    doc = {**result, "speedmatrix": {"cell": cell.as_dict(), "url": ns.url, "model": ns.model,
                                     "client": settings.as_dict()}}
    atomic.write_json(ns.out, doc)
    if records:
        requests_file = Path(ns.out).with_suffix(runfolder.CELL_REQUESTS_SUFFIX)
        cells.request_table(records, {"cell_id": cell.id}).to_parquet(requests_file)
    print(json.dumps({k: result.get(k) for k in ("status", "completed", "failed", "total_output_tokens",
                                                 "output_throughput", "median_ttft_ms", "median_itl_ms",
                                                 "prefix_cache_hit_rate", "spec_decode_acceptance_rate")}))
    return 0


def cmd_agree(ns: argparse.Namespace) -> int:
    from . import peers
    from .core import atomic, table
    from .jobs import reference
    from .measure.client import api_key
    from .report import sections

    names = [n for n in ns.clients.split(",") if n]
    settings = {"python": dict(kv.split("=", 1) for kv in ns.python)}
    found = peers.problems(names, settings, "--clients")
    if found:
        print("speedmatrix agree: " + "\n  ".join(found), file=sys.stderr)
        return 2
    # the load every client can send: N requests, C at once (the kind the reference rule measures closed-loop)
    shape = next(workloads.get(n) for n in workloads.names()
                 if workloads.get(n).reference and not workloads.get(n).open_loop)
    cell = shape.manual_cell(ns.context, ns.concurrency, ns.requests, ns.max_tokens, None, None, "prose", 1, None)
    client_cfg = ClientSettings.from_config({"ignore_eos": True, "stall_timeout_s": 300, "prompt_format": "text"})
    runs = reference.compare(cell, ns.url.rstrip("/"), ns.model, ns.tokenizer, client_cfg, names, settings,
                             ns.rounds, api_key(), progress=lambda m: print(m, file=sys.stderr))
    doc = reference.document(cell, runs, server_id="-", url=ns.url, rounds=ns.rounds)
    atomic.write_json(ns.out, doc)
    print(table.markdown([sections.reference_table([doc])]))
    return 0


def cmd_loops(ns: argparse.Namespace) -> int:
    from .measure import loops

    for f in ns.files:
        v = loops.detect(Path(f).read_text(errors="replace"))
        print(json.dumps({"file": f, **v.as_dict()}))
    return 0


def cmd_argv(ns: argparse.Namespace) -> int:
    from .plan import experiment
    from .serve import runtimes

    exp = experiment.load(ns.experiment, ns.experiments_dir)
    lock_path = RunFolder(Path(ns.results_dir) / exp.name).runtime_lock
    image = (atomic.read_json_if_there(lock_path) or {}).get("image_ref")
    if exp.runtime["kind"] != "local" and not image:
        print(f"# image not pinned yet ({lock_path} absent): shown as configured; the run uses its digest",
              file=sys.stderr)
    for srv in exp.servers:
        revisions = runtimes.pinned_revisions(srv, ns.models_dir)
        port = srv.port or runtimes.PORT_PLACEHOLDER
        argv = runtimes.launch_argv(exp, srv, ns.models_dir, port, revisions, image)
        print(f"{srv.id}\t{json.dumps(runtimes.redact_argv(argv))}")
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    from .history import regress
    from .history.gate import Outcome
    from .report import compare

    try:
        doc, table = compare.compare(ns.run_a, ns.run_b, ns.out, ns.match, ns.server_a, ns.server_b, ns.store,
                                     regress.parse_min_effect(ns.min_effect), ns.noise_multiple)
    except NoCellInCommon as exc:  # the status regress gives: nothing comparable
        print(f"speedmatrix compare: {exc} (exit 4)", file=sys.stderr)
        return Outcome.NOTHING_COMPARABLE
    except (FileNotFoundError, ValueError, SpeedmatrixError) as exc:
        print(f"speedmatrix compare: {exc}", file=sys.stderr)
        return Outcome.BAD_INPUT
    return _verdict_out(ns, "compare", table, {"run_id": ns.run_a}, {"run_id": ns.run_b}, doc)


def _verdict_out(ns: argparse.Namespace, command: str, table, base: dict, new: dict, doc: list,
                 causes: list[str] | None = None) -> int:
    """A verdict's outputs, as regress and compare give them: --json, --junit, the markdown (unless the JSON went
    to standard output), and the exit status with why on standard error."""
    from .core.table import markdown
    from .history import regress
    from .report import regression

    if ns.json:
        _write_or_print(ns.json, json.dumps(regression.verdict_json(table, base, new, causes), indent=1) + "\n")
    if ns.junit:
        _write_or_print(str(ns.junit), regression.verdict_junit(table, base, new, command))
    if ns.json != "-":
        print(markdown(doc))
    code = regress.exit_code(table)
    if code:
        print(f"speedmatrix {command}: {regress.failing(table)} (exit {code})", file=sys.stderr)
    return code


def cmd_history(ns: argparse.Namespace) -> int:
    from .history import store
    from .report import regression

    if ns.add:
        for run in ns.add:
            run_id, new = store.add(run, ns.store)
            print(f"{run}: run {run_id} {'added to' if new else 'already in'} {ns.store}")
        return 0
    if ns.id:  # a results folder's id (stored or not), else a stored run's (a tag, latest, a start of an id)
        print(store.run_id(ns.id) if Path(ns.id).is_dir() else store.resolve(ns.store, ns.id))
        return 0
    if ns.tag:
        print(f"{ns.tag[0]}: run {store.tag(ns.store, *ns.tag)}")
        return 0
    if ns.untag:
        store.untag(ns.store, ns.untag)
        print(f"{ns.untag}: removed")
        return 0
    if ns.remove:
        print(f"run {store.remove(ns.store, ns.remove)} removed from {ns.store}")
        return 0
    if not ns.trend:
        if ns.format == "markdown":
            print(regression.history_text(ns.store, ns.experiment))
        else:
            _print_rows(store.runs(ns.store, ns.experiment), ns.format)
        return 0
    return _trend(ns)


def _trend(ns: argparse.Namespace) -> int:
    """history --trend: one cell (SERVER/CELL) or an experiment's family across runs, read once, then narrowed
    (--machine, --same-config), drawn, printed."""
    from .core.table import Heading, markdown
    from .history import store
    from .report import charts, regression

    one = "/" in ns.trend
    rows = (store.cell_history(ns.store, *ns.trend.partition("/")[::2], ns.experiment) if one
            else store.family(ns.store, ns.trend))
    if rows.empty:
        if one:
            known = store.stored_cells(ns.store)
            listed = (f"the store's cells (SERVER/CELL): {', '.join(known[:40])}" + (" ..." if len(known) > 40 else "")
                      if known else f"{ns.store} holds no cell yet")
        else:
            names = sorted(set(store.runs(ns.store)["experiment"]))
            listed = f"the store's experiments: {', '.join(names)}" if names else f"{ns.store} holds no run yet"
        print(f"speedmatrix history: {ns.trend}: in no stored run" + (f" of {ns.experiment}" if ns.experiment and one
                                                                     else "") + f"; {listed}", file=sys.stderr)
        return 2
    selected = bool(ns.machine or ns.same_config)
    rows = regression.select_history(rows, ns.machine, ns.same_config)
    if ns.chart:
        chart = regression.trend_chart(rows, ns.trend)
        if ns.chart.suffix == ".html":
            chart.save(str(ns.chart))
        else:
            charts.save_png(chart, ns.chart)
        print(f"wrote {ns.chart}", file=sys.stderr)
    if ns.format != "markdown":
        _print_rows(rows, ns.format)
        return 0
    what = ns.trend if one else f"{ns.trend}'s cells (each with the server config of its newest stored run)"
    where = "the stored runs selected" if selected else "every stored run"
    print(markdown([Heading(1, f"{what} in {where}"), regression.cell_table(rows)]))
    return 0


def _print_rows(rows, form: str) -> None:
    """A table's rows as JSON records or CSV on standard output (history --format)."""
    sys.stdout.write(rows.to_json(orient="records", indent=1) + "\n" if form == "json" else rows.to_csv(index=False))


def cmd_regress(ns: argparse.Namespace) -> int:
    from .history import regress, store
    from .report import regression

    known = ns.store if Path(ns.store).exists() else None
    base, base_cells, base_reqs = regression.side(ns.base, known)
    new, new_cells, new_reqs = regression.side(ns.new, known)
    min_effect = regress.parse_min_effect(ns.min_effect)
    others = ([], []) if ns.alone else regression.siblings(ns.store, base, new)
    table = regress.regress(base_cells, base_reqs, new_cells, new_reqs, min_effect, ns.noise_multiple, others,
                            new_incomplete=new.get("status") in store.INCOMPLETE_STATUSES,
                            family_wise=ns.family_wise, min_runs=ns.min_runs)
    change = regress.machine_change(base, new)
    if change and not ns.across_machines:
        table = regress.withhold(table, change)
    causes = _run_causes(ns.new if Path(ns.new).is_dir() else new.get("source"))
    if ns.out:
        print(f"wrote {regression.write(ns.out, table, base, new, (base_cells, new_cells), causes)} (and "
              "regress.html, regress.csv)", file=sys.stderr)
    return _verdict_out(ns, "regress", table, base, new,
                        regression.blocks(table, base, new, cells=(base_cells, new_cells), causes=causes), causes)


def _run_causes(folder: str | None) -> list[str]:
    """A results folder's failed jobs' causes (its run summary), as lines (for a stored run, the folder it was
    added from, where it is still there)."""
    summary = atomic.read_json_if_there(RunFolder(folder).summary) if folder and Path(folder).is_dir() else None
    return [f"{c['cause']} ({len(c.get('jobs') or [])} job(s))" for c in (summary or {}).get("causes") or []]


def _write_or_print(where: str, text: str) -> None:
    if where == "-":
        sys.stdout.write(text)
    else:
        Path(where).parent.mkdir(parents=True, exist_ok=True)
        Path(where).write_text(text)


def cmd_reproduce(ns: argparse.Namespace) -> int:
    from .core.table import markdown
    from .history import reproduce
    from .report import compare, regression

    try:
        matrix = compare.load_matrix(ns.run)
    except (FileNotFoundError, ValueError) as exc:  # not a run: bad input, as for compare and regress
        print(f"speedmatrix reproduce: {exc}", file=sys.stderr)
        return 2
    published = reproduce.load(ns.published)
    if not ns.any_experiment:
        reproduce.check_experiment(matrix, published)
    found = reproduce.compare(matrix, published, ns.server, ns.gpu)
    code, why = reproduce.outcome(found, None if ns.min_agreement is None else ns.min_agreement / 100,
                                  ns.tolerance / 100)
    page = markdown(regression.reproduction_blocks(found))
    if ns.json:
        _write_or_print(ns.json, json.dumps(reproduce.verdict_json(found, code, why), indent=1) + "\n")
    if ns.junit:
        _write_or_print(str(ns.junit), reproduce.verdict_junit(found, ns.tolerance / 100))
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "reproduce.md").write_text(page)
        found["cells"].to_csv(ns.out / "reproduce-cells.csv", index=False)
        print(f"wrote {ns.out / 'reproduce.md'} and reproduce-cells.csv", file=sys.stderr)
    if ns.json != "-":
        print(page)
    print(f"speedmatrix reproduce: {why} (exit {int(code)})", file=sys.stderr)
    return int(code)


def cmd_rederive(ns: argparse.Namespace) -> int:
    from .report.rederive import rederive

    try:
        written = rederive(ns.results, ns.experiment, ns.experiments_dir, ns.out, ns.policy, ns.captions)
    except SpeedmatrixError as exc:
        print(f"speedmatrix rederive: {exc}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in written.values()))
    return 0


def cmd_pareto(ns: argparse.Namespace) -> int:
    from .report import compare

    try:
        print(compare.pareto(ns.runs, ns.out))
    except (FileNotFoundError, ValueError) as exc:
        print(f"speedmatrix pareto: {exc}", file=sys.stderr)
        return 2
    return 0


def _exit_statuses() -> str:
    from .history import gate

    return gate.exit_statuses()


def _doc(module: str) -> str:
    """A library module's docstring: the description of the command that runs it."""
    return importlib.import_module(f"speedmatrix.{module}").__doc__


def cmd_walltime(ns: argparse.Namespace) -> int:
    from .report import walltime

    if not (ns.run / "logs").is_dir():
        print(f"speedmatrix walltime: {ns.run}: no logs/ folder (give results/<experiment> of a finished run)",
              file=sys.stderr)
        return 2
    got = walltime.analyse(ns.run)
    print(walltime.text(got))
    if ns.out:
        ns.out.write_text(json.dumps(got, indent=2) + "\n")
    return 0


def cmd_interference(ns: argparse.Namespace) -> int:
    from .report import interference

    got = interference.compare(ns.alone, ns.beside, ns.again)
    print(interference.markdown(got))
    if ns.out:
        interference.write(got, ns.out)
    return 0


def cmd_train_pair(ns: argparse.Namespace) -> int:
    from .provision import training

    changes = {k: {"steps": v} for k, v in (("target", ns.target_steps), ("drafter", ns.drafter_steps),
                                            ("eagle", ns.eagle_steps)) if v}
    progress = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if ns.eagle_only:
        record = training.run_eagle_training(ns.out or training.SHIPPED, changes, progress=progress)
        print(json.dumps({k: record[k] for k in ("seconds", "eval", "parameters")}))
        return 0
    record = training.run_training(ns.out or training.SHIPPED, changes, progress=progress)
    print(json.dumps({k: record[k] for k in ("seconds", "target_eval_loss", "drafter_eval", "train_tokens")}))
    return 0


def cmd_bundle(ns: argparse.Namespace) -> int:
    from .provision import bundle

    host = bundle.host_has(ns.host_has) if ns.host_has else None
    manifest = bundle.build(ns.target, ns.out, without=tuple(ns.without), also=tuple(ns.also),
                            envs=tuple(ns.envs), host=host, log=lambda m: print(m, file=sys.stderr))
    print(f"{ns.out}: {bundle.summary(manifest)}")
    print(f"install a clone from it with no package index: make install WHEELS={ns.out}"
          + ("" if manifest["engine"] == "cpu" else f" ENGINE={manifest['engine']}"))
    return 0


def cmd_validate(ns: argparse.Namespace) -> int:
    from .jobs import enginecheck, preflight
    from .plan import experiment
    from .serve import pool

    exp = experiment.load(ns.experiment, ns.experiments_dir)
    gpus = len(pool.node_gpus(ns.gpus, exp)) or None if exp.runtime["device"] == "gpu" and not ns.cluster else None
    found = enginecheck.check(exp, ns.models_dir, gpus_here=gpus)
    # what the run's first step also checks on this machine (a command, a container engine, a reference client)
    found.errors[:0] = preflight.problems(exp, cluster=ns.cluster)
    for line in found.lines():
        print(f"  {line}", flush=True)
    if found.errors:
        print(f"{exp.path}: {len(found.errors)} error(s): fix them before the run (nothing was started or "
              "downloaded)", file=sys.stderr)
        return 1
    print(f"{exp.path}: ok ({len(exp.servers)} server configs, {len(exp.cells())} cells"
          + (f"; {len(found.warnings)} warning(s)" if found.warnings else "")
          + (f"; {len(found.skipped)} check(s) not run here" if found.skipped else "") + ")")
    return 0


def cmd_list(ns: argparse.Namespace) -> int:
    from .plan import experiment

    for name in experiment.available(ns.experiments_dir):
        print(name)
    return 0


def cmd_stop(ns: argparse.Namespace) -> int:
    from .serve import broker

    n = broker.stop_all(ns.results_dir)
    print(f"stopped {n} server(s) under {ns.results_dir}")
    return 0


def _add_measure(sub) -> None:
    client_defaults = section_defaults("client")
    b = sub.add_parser("measure", help="measure one cell against a running OpenAI-compatible server",
                       description="Measure one cell against a running server, with the code path the workflow "
                       "uses. An API key, if the server needs one, comes from SPEEDMATRIX_API_KEY or "
                       "OPENAI_API_KEY (never from the command line, so it stays out of shell history and logs).")
    b.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    b.add_argument("--model", required=True, help="served model name")
    b.add_argument("--workload", choices=[n for n in workloads.names() if workloads.get(n).by_hand],
                   default=next(n for n in workloads.names() if workloads.get(n).headline),
                   help="prefill: TTFT and prompt tok/s, one request at a time, prefix cache defeated; decode: a "
                   "closed loop of --concurrency requests for --duration seconds; capacity: --requests requests, "
                   "--concurrency at once; prefix_cache: --requests requests sharing --shared-prefix of the "
                   "context, a cold pass then a warm pass; latency: --requests requests one at a time; slo_search: "
                   "the highest concurrency up to --concurrency at which the --slo-* target holds. Open-loop, "
                   "sweep, session and replay cells have settings of their own (a schedule, turns, a trace): "
                   "write them in an experiment's workloads and run the workflow")
    b.add_argument("--context", type=int, required=True, help="prompt length in tokens (sized by the server's "
                   "/tokenize)")
    b.add_argument("--concurrency", type=int, default=1, help="requests in flight (decode)")
    b.add_argument("--requests", type=int, default=3, help="requests (prefill, capacity, latency; per pass for "
                   "prefix_cache)")
    b.add_argument("--shared-prefix", type=float, default=0.875, help="prefix_cache: fraction of the context "
                   "shared by every request (seed 000: 0.875 and 0.25)")
    b.add_argument("--corpus", choices=["prose", "code"], default="prose", help="text the prompts are cut from "
                   "(code: the coding-shaped set)")
    b.add_argument("--duration", type=float, default=30.0, help="measurement window in seconds (decode)")
    b.add_argument("--max-tokens", type=int, default=4096, help="output cap per request")
    b.add_argument("--repeats", type=int, default=1, help="measure the cell this many times; the result gives "
                   "the median, a 95 %% interval (Student's t) and the CV of the repeats")
    b.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (default 0: greedy)")
    b.add_argument("--top-p", type=float, help="with --temperature: nucleus sampling's top_p")
    b.add_argument("--frequency-penalty", type=float,
                   help="vLLM's frequency_penalty (deterministic: greedy stays greedy; a small model's loops end)")
    b.add_argument("--sampling-seed", type=int, help="with --temperature: request i is sent with seed SEED + i, so a "
                   f"rerun samples the same (default {defaults_of('sampling', {})['seed']})")
    b.add_argument("--out", required=True, help="result JSON (requests go beside it as .requests.parquet)")
    b.set_defaults(func=cmd_measure)
    c = b.add_argument_group("client settings (an experiment's client: block; defaults as there)")
    c.add_argument("--ignore-eos", action="store_true", help="generate past the model's end (recorded)")
    c.add_argument("--stall-timeout", type=float, help="end a request after this many seconds without a token "
                   f"(default {client_defaults['stall_timeout_s']:g})")
    c.add_argument("--seed", type=int, help=f"prompt selection seed (default {client_defaults['seed']})")
    c.add_argument("--eos-text", help="with --ignore-eos: the model's end-of-text token as text (e.g. <eos>), "
                   "to record where the model had ended before it was forced on")
    c.add_argument("--stop-looping", action="store_true", help="end a request as soon as its output loops "
                   "(speedmatrix.measure.loops thresholds; recorded per request)")
    c.add_argument("--api", choices=["completions", "chat"], default=client_defaults["api"],
                   help="/v1/completions (the prompt verbatim) or /v1/chat/completions (the prompt as one user "
                   "message through the model's chat template)")
    c.add_argument("--no-thinking", action="store_true",
                   help="chat API: send chat_template_kwargs {enable_thinking: false} (seed 003's thinking off)")
    c.add_argument("--prompt-format", choices=["text", "token_ids"], default=client_defaults["prompt_format"],
                   help="send prompts as text (checked by the server's /tokenize to be exactly --context tokens; "
                   "the server's tokenization is measured, as users see it) or as token ids")
    c.add_argument("--usage-per-chunk", choices=["auto", "on", "off"], default="auto",
                   help="ask for the token count in every streamed event (exact when an event carries several "
                   "tokens; costs the server per event); auto: only for decode, whose requests are cut at the "
                   "window's end")
    c.add_argument("--tokenizer", metavar="DIR", help="the served model's directory (its tokenizer.json): "
                   "prompts a decode window needs while it measures are made here, not by the server being "
                   "measured (without it they come from the server, and the result counts them)")
    c.add_argument("--busy-wait", type=float, help="seconds to wait for a server busy with other requests to "
                   f"drain before the cell fails (default {client_defaults['busy_wait_s']:g})")
    t = b.add_argument_group("slo_search: the latency target")
    t.add_argument("--slo-preset", help="an MLPerf server target (e.g. mlperf-llama3.1-8b-interactive; "
                   "speedmatrix.measure.slo.PRESETS)")
    t.add_argument("--slo-ttft-ms", type=float, help="TTFT limit (ms)")
    t.add_argument("--slo-tpot-ms", type=float, help="time per output token limit (ms)")
    t.add_argument("--slo-e2e-ms", type=float, help="end-to-end latency limit (ms)")
    t.add_argument("--slo-percentile", type=float, help="the percentile the limits hold at (default 99)")
    t.add_argument("--slo-margin", type=float, default=0.1, help="a step whose percentile is this close to a "
                   "limit (a fraction of it) is measured twice")


def _add_agree(sub) -> None:
    ag = sub.add_parser(
        "agree", help="the same load measured by speedmatrix and by other clients, in rotating rounds",
        description="Measure one shape (N requests of --context prompt tokens, --max-tokens out with EOS ignored, "
        "--concurrency at once, greedy, streamed) on a running server with speedmatrix's client and with each of "
        "--clients (vllm_bench_serve, aiperf, guidellm; `make peers` installs the last two), in rotating order, "
        "--rounds times each; prints each client's medians with their range and its difference from "
        "speedmatrix's, and writes every round to --out. The workflow's `reference` rule does the same for "
        "the cells an experiment names. An API key comes from SPEEDMATRIX_API_KEY or OPENAI_API_KEY.")
    ag.add_argument("--url", required=True, help="server base URL")
    ag.add_argument("--model", required=True, help="served model name")
    ag.add_argument("--tokenizer", required=True, help="the model's tokenizer (a local folder or a hub name)")
    ag.add_argument("--context", type=int, default=1024, help="prompt tokens")
    ag.add_argument("--max-tokens", type=int, default=256, help="output tokens per request (EOS ignored)")
    ag.add_argument("--requests", type=int, default=64)
    ag.add_argument("--concurrency", type=int, default=16)
    ag.add_argument("--rounds", type=int, default=2, help="measurements by each client")
    ag.add_argument("--clients", default="vllm_bench_serve,aiperf,guidellm", help="comma-separated")
    ag.add_argument("--python", action="append", default=[], metavar="CLIENT=PATH",
                    help="the Python that runs a client (default .peers/<client>/bin/python, else this one)")
    ag.add_argument("--out", required=True, help="every round, the medians and differences (JSON)")
    ag.set_defaults(func=cmd_agree)


def _add_experiment_commands(sub) -> None:
    for name, func, text in (
        ("argv", cmd_argv, "print each server config's id, a tab, and its launch argv as a JSON list (the docker "
         "or apptainer command included): exactly what the workflow runs. The image digest and model revisions "
         "appear once pinned (runtime.lock.json, the model manifests); {port} is the host port chosen at start "
         "unless the config fixes it"),
        ("validate", cmd_validate, "check an experiment before anything is downloaded, started or queued: the "
         "file against the schema, then every server config against the vLLM that will serve it, with that vLLM's "
         "own code run in its Python (its argument parser, its serve checks, its speculative config's methods and "
         "keys; no engine start, no GPU): each flag and value, the speculative method and its drafter, the device "
         "(runtime.device gpu needs a CUDA or ROCm vLLM; tensor x pipeline parallel within the GPUs here), each "
         "cell's prompt plus max_tokens within max-model-len, concurrency above max-num-seqs (a warning), Hub "
         "models that do not exist. vLLM's answer is cached under the runtime's pin "
         "(~/.cache/speedmatrix/engine-check/): a second validate starts no Python. What cannot be checked here "
         "is listed with why. Exit 1 on an error"),
    ):
        a = sub.add_parser(name, help=text.split(":")[0], description=text)
        a.add_argument("experiment")
        a.add_argument("--experiments-dir", default="config/experiments")
        a.add_argument("--models-dir", default="resources/models")
        a.add_argument("--results-dir", default="results")
        if func is cmd_validate:
            a.add_argument("--gpus", default=None,
                           help="the GPUs a run here may use (as config 'gpus'); default: what NVML counts")
            a.add_argument("--cluster", action="store_true",
                           help="the run goes to a cluster: the GPUs of this machine say nothing of the nodes'")
        a.set_defaults(func=func)
    ls = sub.add_parser("experiments", help="list the experiments in config/experiments")
    ls.add_argument("--experiments-dir", default="config/experiments")
    ls.set_defaults(func=cmd_list)
    st = sub.add_parser("stop", help="stop every server the workflow brought up under a results dir")
    st.add_argument("--results-dir", default="results")
    st.set_defaults(func=cmd_stop)
    lo = sub.add_parser("loops", help="loop verdict for text files, one JSON line each")
    lo.add_argument("files", nargs="+")
    lo.set_defaults(func=cmd_loops)


def _add_comparisons(sub) -> None:
    c = sub.add_parser(
        "compare", help="compare two runs cell by cell: regress's verdict per figure, the matrix's figures beside",
        description=_doc("report.compare") + " Exit status: regress's (speedmatrix.history.gate): "
        + _exit_statuses() + ".", formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("run_a", metavar="RUN_A", help="a results folder (results/<experiment>), its matrix.parquet, or a "
                   "stored run's id (a unique start of one, a tag, or latest)")
    c.add_argument("run_b", metavar="RUN_B", help="the same, for the run compared with A")
    c.add_argument("--match", choices=["server", "cell"], default="server",
                   help="match cells on server config and cell id (default), or on the cell id alone "
                        "(two runs of different server configs)")
    c.add_argument("--server-a", help="only this server config of run A")
    c.add_argument("--server-b", help="only this server config of run B")
    c.add_argument("--out", help="also write compare.md, compare.csv (every figure's row), compare.png and "
                   "compare-report.html (one self-contained page: the tables, the chart, both runs' provenance) in "
                   "this directory")
    _verdict_options(c)
    c.set_defaults(func=cmd_compare)

    pa = sub.add_parser(
        "pareto", help="the Pareto frontier of tok/s per user against tok/s per GPU over one or more runs",
        description="Every valid capacity and decode cell of the runs as a point (output tok/s per user, output "
                    "tok/s per GPU; per server on the CPU); prints the frontier's points (those no other cell beats "
                    "on both), named by run, server config and cell.")
    pa.add_argument("runs", nargs="+", metavar="RUN", help="a results directory (results/<experiment>) or its "
                    "matrix.parquet")
    pa.add_argument("--out", help="also write pareto.md, pareto-report.html (the page, with the chart) and "
                    "pareto.png here")
    pa.set_defaults(func=cmd_pareto)

    it = sub.add_parser(
        "interference", help="what measuring side by side on a GPU pool changed, cell by cell",
        description=_doc("report.interference"))
    it.add_argument("alone", type=Path, help="results/<experiment> of a run whose cells measured alone")
    it.add_argument("beside", type=Path, help="results/<experiment> of the same experiment on a pool")
    it.add_argument("--again", type=Path, help="a second lone run: the run-to-run spread to compare against")
    it.add_argument("--out", type=Path, help="write interference.md and interference.json here")
    it.set_defaults(func=cmd_interference)


def _verdict_options(p: argparse.ArgumentParser) -> None:
    """The options regress and compare share: the store run ids are looked up in, the minimum effect, the
    machine-readable verdict."""
    default_store = runfolder.history("results")
    p.add_argument("--store", type=Path, default=default_store, help=f"where run ids are looked up (default: "
                   f"{default_store}; a .sqlite.gz is read as it is)")
    p.add_argument("--min-effect", metavar="PCT", help="the smallest change that counts, in percent: one for every "
                   "figure (10 or 10%%) or one per figure (output_tok_s=5%%,ttft=10%%,p99_ttft=20%%; a figure not "
                   "named keeps the default); default: from each cell's own noise")
    p.add_argument("--noise-multiple", type=float, default=2.0,
                   help="without --min-effect: this many times the cell's noise (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the verdict as JSON (outcome, exit status, counts, "
                   "the cells of each outcome, every figure's row); '-' prints it instead of the markdown")
    p.add_argument("--junit", type=Path, metavar="FILE", help="also write the verdict as JUnit XML (a test case "
                   "per cell: slower or lost a failure, a measurement problem an error, not comparable skipped)")


def _add_history(sub) -> None:
    default_store = runfolder.history("results")
    hi = sub.add_parser(
        "history", help="the runs in the results store, a cell's or an experiment's trend across them, tags",
        description="Every finished or failed run of the workflow adds itself to the results store "
        "(results/history.sqlite: a SQLite file any SQLite client opens; tables runs, cells, requests, tags). "
        "Without options: the stored runs, oldest first, with their tags. --trend SERVER/CELL: that cell in every "
        "stored run; --trend EXPERIMENT: every cell of the experiment's newest stored run, in every run that "
        "measured it with the same server config (its extends: children and other releases line up). "
        "--add RESULTS: add a results folder by hand (one copied from another machine); adding a run twice adds "
        "nothing. Wherever a run is asked for (here, regress, compare): a unique start of its id, a tag, latest "
        "(the newest stored run), or the results folder it was added from.")
    hi.add_argument("--store", type=Path, default=default_store,
                    help=f"the store (default: {default_store}; a .sqlite.gz is read as it is)")
    hi.add_argument("--experiment", help="only this experiment's runs")
    hi.add_argument("--trend", "--cell", metavar="SERVER/CELL|EXPERIMENT", help="one cell across runs, e.g. "
                    "base/decode-ctx128-c1, or an experiment's family of cells: a table with each run's "
                    "experiment, runtime, GPU and CPU; --chart draws it, --format json|csv gives its rows")
    hi.add_argument("--add", nargs="+", metavar="RESULTS", help="add these results folders to the store")
    hi.add_argument("--id", metavar="RUN", help="print a run's id: a results folder's (stored or not), or a stored "
                    "run's by tag or latest, for a script: speedmatrix regress baseline \"$(speedmatrix history "
                    "--id results/X)\"")
    hi.add_argument("--tag", nargs=2, metavar=("NAME", "RUN"), help="name a stored run (e.g. baseline); the name "
                    "moves to it from the run it named before")
    hi.add_argument("--untag", metavar="NAME", help="remove a tag")
    hi.add_argument("--remove", metavar="RUN", help="take a run out of the store (its cells, requests and tags)")
    hi.add_argument("--machine", metavar="TEXT", help="with --trend: only the runs on a machine whose GPU (or CPU) "
                    "name holds TEXT, e.g. H100")
    hi.add_argument("--same-config", action="store_true", help="with --trend: only the runs whose server config "
                    "(flags, environment, models) is each cell's newest run's: its releases and extends: children "
                    "line up")
    hi.add_argument("--chart", type=Path, metavar="FILE", help="with --trend: the trend as a chart (.png or .html): "
                    "a point per run by runtime and machine (a family: each cell over its median), the run-to-run "
                    "band shaded")
    hi.add_argument("--format", choices=("markdown", "json", "csv"), default="markdown",
                    help="the runs or the trend's rows as a markdown table (default), JSON records or CSV")
    hi.set_defaults(func=cmd_history)


def _add_regress(sub) -> None:
    rg = sub.add_parser(
        "regress", help="per cell and figure: faster, slower, no change, inconclusive or not comparable, with "
        "statistics",
        description=_doc("history.regress") + " Exit status (speedmatrix.history.gate; the most severe found: "
        "lost, nothing comparable, slower, measurement): " + _exit_statuses() + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rg.add_argument("base", metavar="BASE", help="a results folder (results/<experiment>) or a stored run's id")
    rg.add_argument("new", metavar="NEW", help="the same, for the run judged against BASE")
    rg.add_argument("--alone", action="store_true",
                    help="judge from the two runs alone: no run-to-run noise from the store's other runs of each "
                    "side's runtime")
    rg.add_argument("--family-wise", action="store_true",
                    help="set the run-to-run part of each minimum effect so that a run of unchanged software fails "
                    "the check on any of its figures at most 5 %% of the time (Bonferroni over every figure of every "
                    "cell), not each figure 5 %% of the time: a nightly gate's level (docs/nightly.md)")
    rg.add_argument("--min-runs", type=int, default=0, metavar="N",
                    help="without --min-effect: no faster or slower verdict until the store holds N runs of the "
                    "base's runtime on this kind of machine, the base among them (the run-to-run spread is unknown "
                    "before; inconclusive instead); default 0")
    rg.add_argument("--across-machines", action="store_true",
                    help="judge runs on different kinds of machine (another GPU model, CPU model or core count); "
                    "without it their verdicts are withheld: not comparable, the change named")
    rg.add_argument("--out", type=Path, help="also write regress.md, regress.html and regress.csv here")
    _verdict_options(rg)
    rg.set_defaults(func=cmd_regress)


def _add_reproduce(sub) -> None:
    rp = sub.add_parser(
        "reproduce", help="a run against a published matrix: status agreement, figures as ratios, the boundary",
        description=_doc("history.reproduce") + " Exit status (speedmatrix.history.gate): 0 reproduced (or no "
        "minimum agreement asked), 1 agreement under --min-agreement, 2 bad input (a run of an experiment the file "
        "does not name: --any-experiment), 4 no published figure has a cell in the run.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("run", metavar="RUN", help="a results folder (results/<experiment>) or its matrix.parquet")
    rp.add_argument("published", metavar="PUBLISHED", type=Path,
                    help="a published matrix, e.g. config/published/seed002-speed-matrix.yaml")
    rp.add_argument("--server", help="the run's server config to compare with a published matrix (when it has "
                    "several)")
    rp.add_argument("--gpu", help="only the published rows of this GPU (as the file names it, e.g. 'RTX PRO 6000')")
    rp.add_argument("--out", type=Path, help="also write reproduce.md and reproduce-cells.csv here")
    rp.add_argument("--min-agreement", type=float, metavar="PCT", help="exit 1 when fewer than this share of the "
                    "matrix's statuses (or of the named figures) agree (default: report only)")
    rp.add_argument("--tolerance", type=float, default=10.0, metavar="PCT",
                    help="a named figure's output tok/s agrees within this much of the published (default 10)")
    rp.add_argument("--json", metavar="FILE", help="also write the reproduction as JSON (outcome, exit status, "
                    "counts, every cell and named figure); '-' prints it instead of the markdown")
    rp.add_argument("--junit", type=Path, metavar="FILE", help="also write it as JUnit XML (a test case per "
                    "published cell and named figure: one that disagrees a failure, one the run lacks skipped)")
    rp.add_argument("--any-experiment", action="store_true",
                    help="compare a run of an experiment the published file does not name")
    rp.set_defaults(func=cmd_reproduce)


def _add_run_commands(sub) -> None:
    rd = sub.add_parser(
        "rederive", help="a run's loop verdicts, matrix, decisions and report again from its cell files",
        description="For a results folder copied back from another machine, or to judge a run under another loop "
                    "policy: the loop stage, the aggregation and the report rule's code over "
                    "RESULTS/cells/<server>/<cell>.json and their .requests.parquet, with the run's locks, launch "
                    "specs, gates and reference files. No measurement is repeated.")
    rd.add_argument("results", metavar="RESULTS", help="the run's folder (results/<experiment>)")
    rd.add_argument("--experiment", help="the experiment's name (default: the folder's name)")
    rd.add_argument("--experiments-dir", default="config/experiments")
    rd.add_argument("--policy", choices=["any", "fraction", "flag_only"],
                    help="judge loops under this policy instead of the experiment's")
    rd.add_argument("--out", help="write loops/, the parquet files, the report and charts here (default: RESULTS)")
    rd.add_argument("--captions", help="the charts' captions folder (docs/captions in a checkout)")
    rd.set_defaults(func=cmd_rederive)

    wt = sub.add_parser(
        "walltime", help="where a finished run's wall time went: server start-ups, measurement windows, the rest",
        description=_doc("report.walltime"), formatter_class=argparse.RawDescriptionHelpFormatter)
    wt.add_argument("run", type=Path, help="a finished run's folder, results/<experiment>")
    wt.add_argument("--out", type=Path, help="also write the figures as JSON here")
    wt.set_defaults(func=cmd_walltime)


def _add_train_pair(sub) -> None:
    tp = sub.add_parser(
        "train-pair", help="train the tiny Gemma-4 target, its MTP drafter and its EAGLE head that the package "
        "ships (CPU)",
        description="Train the tiny models again from their recipe (speedmatrix.provision.training.RECIPE: the "
        "corpus, the tokenizer, the target, then the MTP drafter and the EAGLE head distilled from it), with fixed "
        "seeds. About three quarters of an hour on 2 cores; the result is close to, not bit-identical with, the "
        "shipped files (floating-point order differs between CPUs). Writes <out>/tiny-gemma4-trained, "
        "<out>/tiny-gemma4-trained-mtp, <out>/tiny-gemma4-trained-eagle and <out>/training.json (the log, losses "
        "and file hashes). --eagle-only trains the head alone for the target already in <out>.")
    tp.add_argument("--out", type=Path, help="where to write the pair (default: the package's own "
                    "data/models, which the `trained:` models of an experiment copy)")
    tp.add_argument("--target-steps", type=int, help="optimizer steps for the target (default: the recipe's)")
    tp.add_argument("--drafter-steps", type=int, help="optimizer steps for the drafter (default: the recipe's)")
    tp.add_argument("--eagle-steps", type=int, help="optimizer steps for the EAGLE head (default: the recipe's)")
    tp.add_argument("--eagle-only", action="store_true",
                    help="train only the EAGLE head, for the (frozen) target already in <out>")
    tp.set_defaults(func=cmd_train_pair)


def _add_bundle(sub) -> None:
    from .provision.bundle import TARGETS

    bu = sub.add_parser(
        "bundle", help="write every wheel an install needs into a folder, for a host with no package index",
        description="On a machine that reaches a package index: download the wheels of a target's pinned set "
        "(its lock file) into OUT/wheels, build wheels for packages published only as source, and describe them in "
        "OUT/bundle.json. Copy OUT to the host and install a clone there with `make install WHEELS=OUT` (no index "
        "is asked). `make bundle` runs this with the installer and the build backend the Makefile pins. Targets: "
        + "; ".join(f"{k}: {t.what} ({t.lock})" for k, t in TARGETS.items()) + ".")
    bu.add_argument("--target", choices=sorted(TARGETS), default="cpu", help="whom the bundle is for (default: cpu)")
    bu.add_argument("--out", type=Path, required=True, help="the bundle's folder (created)")
    bu.add_argument("--without", action="append", default=[], metavar="PACKAGE",
                    help="a package the host already has (its own torch, say; a pattern such as 'nvidia-*' too): left "
                    "out of the wheels and the constraints; repeat for more")
    bu.add_argument("--host-has", type=Path, metavar="FILE",
                    help="the host's `python3 -m pip list --format=freeze` output: a package it has at the lock's own "
                    "version is left out (the install uses the host's copy); one at another version is carried "
                    "(bundle.json lists both)")
    bu.add_argument("--also", action="append", default=[], metavar="REQUIREMENT",
                    help="a pinned requirement carried beside the lock (the installer, the build backend)")
    bu.add_argument("--env", "--peers", dest="envs", action="append", default=[], type=Path, metavar="LOCK",
                    help="another environment's lock file whose wheels go too: an independent client's "
                    "(envs/peers/*.lock: `make peers`) or another vLLM release's (envs/versions/*.lock: "
                    "`make version`); --peers is the same option")
    bu.set_defaults(func=cmd_bundle)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speedmatrix", description="Reproducible LLM-serving benchmark matrices on "
                                "vLLM.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"speedmatrix {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_measure(sub)
    _add_bundle(sub)
    _add_agree(sub)
    _add_experiment_commands(sub)
    _add_comparisons(sub)
    _add_history(sub)
    _add_regress(sub)
    _add_reproduce(sub)
    _add_run_commands(sub)
    _add_train_pair(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .core.errors import CellError

    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except BrokenPipeError:  # the reader went away (`speedmatrix experiments | head -1`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    except CellError as err:
        print(f"speedmatrix: cell failed: {err}", file=sys.stderr)
        return 1
    except SpeedmatrixError as err:
        print(f"speedmatrix: {err}", file=sys.stderr)
        return 2
    except (aiohttp.ClientError, ConnectionError, TimeoutError) as err:
        print(f"speedmatrix: the server did not answer as expected ({type(err).__name__}: {err}); check --url "
              "and that the server is up", file=sys.stderr)
        return 1
    except OSError as err:  # a file: missing, unreadable, not writable
        print(f"speedmatrix: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
