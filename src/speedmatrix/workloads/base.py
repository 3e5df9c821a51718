"""One interface for every kind of cell, and the table of kinds.

A workload kind (prefill, decode, ...) is a subclass of :class:`Workload`
registered with :func:`register`. It says how its cells expand from an
experiment's block, how a cell is measured against a running server, which
matrix columns it adds, its report table, label and order. Everything else
(cell ids, the workflow's rules, the report, the CLI) takes the list from
:data:`REGISTRY`; a new kind is one module in this package plus its block
in ``data/schemas/experiment.schema.yaml``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import pandas as pd

from ..core import fmt
from ..core.table import Table

if TYPE_CHECKING:  # types only: the client is imported where a cell runs
    from ..core.settings import ClientSettings
    from ..measure.client import RequestOptions, RequestRecord
    from ..measure.prompts import PromptSource

# name -> the kind; filled by @register as each module of this package is imported
REGISTRY: dict[str, Workload] = {}

# the part of a cell id after its kind that every kind shares: ctx<N>[-c<M>][-share<P>][-code | -data-<dataset>]
# [-temp<T>[-fp<F>]] (``Cell.id`` writes it); a kind's own ending follows (``Workload.id_pattern``,
# ``cell_key_pattern``)
BASE_KEY_PATTERN = r"ctx[0-9]+(-c[0-9]+)?(-share[0-9.]+)?(-code|-data-[a-z][a-z0-9_]*)?(-temp[0-9.]+(-fp-?[0-9.]+)?)?"


def _share_label(fraction: float) -> str:
    """0.875 -> '87.5', 0.25 -> '25' (percent, no trailing zeros)."""
    return f"{fraction * 100:.4f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Cell:
    """What the client varies against a running server (a server config is everything that needs a restart)."""

    server_id: str
    workload: str
    context_tokens: int
    concurrency: int
    max_tokens: int
    duration_s: float | None = None
    requests: int = 1  # prefill, capacity, latency, prefix_cache: how many requests the cell sends
    shared_prefix: float | None = None  # prefix_cache: fraction of the context shared by every request
    corpus: str = "prose"  # the repository text prompts are cut from (corpus.KINDS)
    repeats: int = 1  # measurements of the cell, one after another in its job (the interval and CV come from them)
    # a kind's own settings (canonical JSON; slo_search: its target and stopping rule): part of the cell's
    # definition, so a change measures the cell again
    options: str = ""
    # how its requests decode (canonical JSON of the block's ``sampling``: temperature, top_p, seed,
    # frequency_penalty); "" greedy
    sampling: str = ""
    # when it has measured enough (canonical JSON of ``measure.precision.Precision``: a sustained-decode cell's
    # stopping rule, the experiment's `precision` with its block's over it); "" a cell without one
    precision: str = ""

    @property
    def precision_settings(self) -> dict[str, Any]:
        return json.loads(self.precision) if self.precision else {}

    @property
    def opts(self) -> dict[str, Any]:
        return json.loads(self.options) if self.options else {}

    @property
    def sampling_params(self) -> dict[str, Any]:
        return json.loads(self.sampling) if self.sampling else {}

    @property
    def kind(self) -> Workload:
        return get(self.workload)

    @property
    def id(self) -> str:
        out = f"{self.workload}-ctx{self.context_tokens}"
        if self.kind.concurrency_in_id and not self.kind.one_at_a_time:
            out += f"-c{self.concurrency}"
        if self.shared_prefix is not None:
            out += f"-share{_share_label(self.shared_prefix)}"
        if self.corpus == "code":
            out += "-code"
        elif self.corpus != "prose":  # one of the experiment's datasets
            out += f"-data-{self.corpus}"
        if self.sampling:
            s = self.sampling_params
            out += f"-temp{s['temperature']:g}" + (f"-fp{s['frequency_penalty']:g}" if "frequency_penalty" in s else "")
        return out + self.kind.id_suffix(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "cell_id": self.id,
            "workload": self.workload,
            "context_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "max_tokens": self.max_tokens,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "shared_prefix": self.shared_prefix,
            "corpus": self.corpus,
            "repeats": self.repeats,
            # only where a kind has settings of its own (the other cells' definitions stay as they were)
            **({"options": self.opts} if self.options else {}),
                        **({"sampling": self.sampling_params} if self.sampling else {}),
            **({"precision": self.precision_settings} if self.precision else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        """The cell ``as_dict`` wrote (a rule hands its job the cell this way: the job expands nothing)."""
        return cls(d["server_id"], d["workload"], int(d["context_tokens"]), int(d["concurrency"]),
                   int(d["max_tokens"]), d["duration_s"], int(d["requests"]), d["shared_prefix"], d["corpus"],
                   int(d["repeats"]), json.dumps(d["options"], sort_keys=True) if "options" in d else "",
                                      json.dumps(d["sampling"], sort_keys=True) if "sampling" in d else "",
                   json.dumps(d["precision"], sort_keys=True) if "precision" in d else "")


@dataclass
class CellRun:
    """Everything a workload needs to measure one cell against a running server (speedmatrix.jobs.cells)."""

    cell: Cell
    url: str
    model: str
    opts: RequestOptions
    source: PromptSource
    # token-id prompts -> the prompts as sent (text checked by the server's tokenizer, or the ids)
    build: Callable[[list[list[int]]], Awaitable[list]]
    before_raw: dict[str, Any]  # the server's samples before the cell
    client: ClientSettings
    progress: Callable[[str], None]
    scrape: Callable[[], Awaitable[dict[str, Any]]]  # the server's samples now

    repeat: int = 1  # which of the cell's repeats this is (its prompts are its own)
    kv_tokens: int | None = None  # the live server's KV cache in tokens (None: unknown)
    # prompts wanted while the clock runs: made without calls to the server being measured where it can
    build_in_window: Callable[[list[list[int]]], Awaitable[list]] | None = None
    # the records of the dataset the cell names, where its kind reads them itself (a trace's requests)
    records: list | None = None
    # the figures of the cell's earlier repeats, in order (a decode window's stopping rule pools their windows)
    earlier: list[dict[str, Any]] = field(default_factory=list)
    # added to the prompts' salt: a step of a search that must not find the last step's blocks cached
    salt_extra: str = ""

    @property
    def salt(self) -> str:
        salt = f"{self.cell.server_id}/{self.cell.id}/{self.repeat}"
        return f"{salt}/{self.salt_extra}" if self.salt_extra else salt


@dataclass
class Measured:
    """What a workload's measurement returns: the cell's figures and its requests.

    ``passes`` holds each pass's figures where a cell sends its requests in
    several passes (prefix cache: cold, warm); the headline figures are then
    the last pass's."""

    figures: dict[str, Any]
    records: list[RequestRecord]
    passes: dict[str, dict[str, Any]] | None = None


class Column(NamedTuple):
    """One of a kind's own matrix columns, declared once on its kind: the name, the unit, where its value comes
    from (the cell JSON's key in backticks, or how it is made), ``vllm bench serve``'s key where it has one, and
    what it is. docs/metrics.md's rows of the kinds' columns are written from these (``bench/doc_blocks.py``)."""

    name: str
    unit: str
    source: str
    meaning: str
    vllm_key: str = "—"


class Workload:
    """A kind of cell. Subclasses set the class attributes and implement expand, prepare and measure."""

    name: ClassVar[str]
    # position among the kinds: cells expand, run and appear in reports in this order (the cheap
    # one-request kinds first, the long sustained-decode windows last)
    order: ClassVar[int]
    title: ClassVar[str]  # the report's section for this kind
    blurb: ClassVar[str] = ""  # a sentence under the section title
    footnote: ClassVar[str] = ""  # a paragraph under the table
    # one request at a time: the cell id has no concurrency, and its TTFT is a prompt-length figure
    one_at_a_time: ClassVar[bool] = False
    # a figure of output tok/s at a concurrency (throughput charts)
    throughput: ClassVar[bool] = False
    # the seeds' speed-test matrix (context x concurrency): the report's heatmap and the summary's first matrix,
    # and the kind ``speedmatrix measure`` measures unless told
    headline: ClassVar[bool] = False
    # how a published benchmark gives this kind's figures (``config/published/``, under the kind's name): "grid"
    # (each context's statuses across concurrencies) or "rows" (figures of named cells); None: not published
    published: ClassVar[str | None] = None
    # its requests are cut at a window's end: token counts per streamed event (usage_per_chunk: auto)
    cut_at_window_end: ClassVar[bool] = False
    # a decode roofline applies at concurrency 1 (speedmatrix.measure.telemetry.roofline)
    roofline: ClassVar[bool] = False
    # the matrix's tok/s figure of this kind for the all-measurements table
    headline_tok_s: ClassVar[str] = "total_tok_s"
    # vllm bench serve can measure the same cell (the reference rule)
    reference: ClassVar[bool] = False
    # its cells share part of their prompts (cell ids get -share<P>)
    shared_prefix: ClassVar[bool] = False
    # the figure whose spread over a cell's repeats decides Unstable (a key of the cell's result)
    stability_figure: ClassVar[str] = "output_throughput"
    # the prefix cache's state the cell starts from, as its result records it (the server's cache is not
    # reset: vLLM offers that only in its development mode; the prompts' nonces decide what can match)
    cache_state: ClassVar[str] = ("fresh: every prompt starts with its own nonce tokens, so no block cached "
                                  "before the cell (by other cells, runs or repeats) matches its prompts")
    # extra matrix columns this kind fills (matrix_fields), each with its unit and meaning
    matrix_columns: ClassVar[tuple[Column, ...]] = ()
    # its cells are judged against the experiment's latency targets (speedmatrix.measure.slo): goodput, attainment
    slo: ClassVar[bool] = True
    # it searches for a load (slo_search): its concurrency is the search's upper bound, not a load it held
    searches: ClassVar[bool] = False
    # the loads it measures follow from what it found in this run (a search, a sweep between measured ends): two
    # runs' requests are not the same load, so no regression verdict compares them request by request
    loads_follow_run: ClassVar[bool] = False
    # its cells are held at a concurrency, named in their ids (open-loop cells are not: their load is a rate)
    concurrency_in_id: ClassVar[bool] = True
    # it sends requests on a schedule (open loop): its requests have a scheduled send time and a lag
    open_loop: ClassVar[bool] = False
    # ``speedmatrix measure`` can make its cell from its options (kinds with settings of their own, such as a
    # schedule or turns, are written in an experiment)
    by_hand: ClassVar[bool] = True
    # the regular expression of what ``id_suffix`` adds to a cell id (the workflow's wildcards are made from it)
    id_pattern: ClassVar[str] = ""
    # its corpus is a trace (speedmatrix.measure.traces), not prompts: its cells get the trace's requests
    # (``CellRun.records``) and build prompts from the built-in corpus
    reads_trace: ClassVar[bool] = False

    # ---- the experiment ----------------------------------------------------
    def expand(self, server_id: str, block: dict[str, Any]) -> list[Cell]:
        """The cells of one block of ``workloads.<name>`` in an experiment."""
        raise NotImplementedError

    def request_max_tokens(self, cell: Cell) -> int:
        return cell.max_tokens

    def id_suffix(self, cell: Cell) -> str:
        """What this kind adds to the end of a cell id (``id_pattern`` matches it)."""
        return ""

    def longest_request(self, cell: Cell) -> int | None:
        """Tokens the cell's longest request holds, prompt and output at its cap, where the cell's definition
        fixes it (the check against max-model-len before a run); None where a trace's prompts are sent and only
        those that fit the context are (the context is a ceiling there, not a length)."""
        return None if self.reads_trace else cell.context_tokens + self.request_max_tokens(cell)

    def needed_kv_tokens(self, cell: Cell) -> int:
        """KV tokens the cell needs at once: every request at full context plus its output cap
        (more than the server has: the cell is over capacity and not sent). An open-loop cell holds no
        concurrency: one request's, and the server queues what does not fit."""
        return (1 if self.open_loop else cell.concurrency) * (cell.context_tokens + cell.max_tokens)

    def reference_load(self, cell: Cell) -> dict[str, Any]:
        """What the reference rule asks the other clients for (speedmatrix.peers.Load's fields beside the
        prompt and output lengths): N requests at the cell's concurrency."""
        return {"requests": cell.requests, "concurrency": cell.concurrency}

    def for_reference(self, cell: Cell) -> Cell:
        """The cell as the reference rule measures it with speedmatrix's client (as every client is asked)."""
        return cell

    def reference_problem(self, cell: Cell) -> str | None:
        """Why the other clients cannot measure this cell of a reference kind, or None."""
        return None

    def in_flight_bound(self, cell: Cell, sent: int) -> int:
        """The most requests of this cell the server may hold at once (running + waiting) when ``sent`` were
        sent: more means someone else's requests were served during the cell. An open loop holds no cap."""
        return sent if self.open_loop else cell.concurrency

    # ---- latency targets -----------------------------------------------------
    def slo_targets(self, cell: dict[str, Any], targets: list) -> list:
        """The experiment's targets this cell is judged on (speedmatrix.measure.slo.Target)."""
        return list(targets) if self.slo else []

    def slo_scope(self, result: dict[str, Any]) -> tuple[str | None, float | None]:
        """Which requests a target is judged on (a phase of the requests table, None: all) and the
        seconds they were measured in (None: the cell's ``measured_s``)."""
        return None, None

    def manual_cell(self, context: int, concurrency: int, requests: int, max_tokens: int, duration_s: float,
                    shared_prefix: float, corpus: str, repeats: int = 1, target: dict[str, Any] | None = None) -> Cell:
        """A cell from ``speedmatrix measure``'s options, keeping only what this kind uses (``target``: a latency
        target's block, for a kind that searches)."""
        cell = Cell("manual", self.name, context, 1 if self.one_at_a_time else concurrency, max_tokens,
                    duration_s if self.cut_at_window_end else None, requests,
                    shared_prefix if self.shared_prefix else None, corpus, repeats)
        return replace(cell, max_tokens=self.request_max_tokens(cell))

    # ---- a measurement -----------------------------------------------------
    async def prepare(self, run: CellRun) -> Any:
        """Build what the measurement sends (prompts), before its clock starts."""
        return await run.build([run.source.prompt(i, run.cell.context_tokens, run.salt)
                                for i in range(run.cell.requests)])

    async def measure(self, run: CellRun, prepared: Any) -> Measured:
        raise NotImplementedError

    # ---- aggregation and report --------------------------------------------
    @classmethod
    def column_names(cls) -> tuple[str, ...]:
        return tuple(c.name for c in cls.matrix_columns)

    def matrix_fields(self, cell: dict[str, Any], result: dict[str, Any],
                      provenance: dict[str, Any]) -> dict[str, Any]:
        """This kind's own matrix columns (``matrix_columns``) from a cell's JSON."""
        return {}

    def report_table(self, m: pd.DataFrame) -> Table | None:
        """This kind's table for one server config's rows (``m`` holds only this kind's rows)."""
        return None

    def rate_points(self, row: Any) -> list[dict[str, Any]]:
        """Its open-loop measurements of one matrix row as points of goodput against offered rate: dicts of
        series, offered_rate_rps, achieved_rate_rps, output_tok_s, goodput_tok_s, slo, status."""
        return []

    def phase(self, row: Any) -> str:
        """The row's label in the all-measurements table."""
        return self.title

    def cell_label(self, row: Any) -> str:
        """A short label of a cell for comparisons and sweep tables: ``1K-tok`` or ``c8 / 1K``."""
        ctx = fmt.ctx(int(row.context_tokens))
        return f"{ctx}-tok" if self.one_at_a_time else f"c{int(row.concurrency)} / {ctx}"


def sampling_of(block: dict[str, Any]) -> str:
    """A block's ``sampling`` as a cell keeps it (canonical JSON), or "" for greedy."""
    return json.dumps(block["sampling"], sort_keys=True) if block.get("sampling") else ""


def register(cls: type[Workload]) -> type[Workload]:
    if cls.name in REGISTRY:
        raise ValueError(f"workload {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> Workload:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(names())})") from None


def names() -> list[str]:
    """Every kind, in report order."""
    return [w.name for w in sorted(REGISTRY.values(), key=lambda w: w.order)]


def cell_key_pattern() -> str:
    """A cell id without its kind, as the kinds write it: the shared part, then one kind's own ending."""
    endings = sorted({w.id_pattern for w in REGISTRY.values() if w.id_pattern})
    return BASE_KEY_PATTERN + ("(" + "|".join(endings) + ")?" if endings else "")


def cell_id_pattern() -> str:
    return "(" + "|".join(names()) + ")-" + cell_key_pattern()


def order_of(name: str) -> int:
    return get(name).order
