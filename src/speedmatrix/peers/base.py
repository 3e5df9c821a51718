"""The interface every peer implements, and the fields they share (no import of the implementations)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..measure.client import sampling_body

OURS = "speedmatrix"
# the figures the agreement table compares with speedmatrix's
COMPARED = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")
# The shared fields, vLLM's names (what `vllm bench serve --save-result` writes):
# - output_throughput: the client's own output tok/s over its own duration
# - median_ttft_ms: time to the first streamed token, per request, median
# - median_tpot_ms: (end - first token) / (tokens - 1), per request, median: every client reports this one
# - median_itl_ms: the gap between streamed events, over all gaps (vLLM's ITL); None where a client lacks it
FIELDS = ("completed", "total_output_tokens", "output_throughput", "median_ttft_ms", "mean_ttft_ms",
          "median_tpot_ms", "median_itl_ms", "duration")
@dataclass(frozen=True)
class Load:
    """What every client is asked to do: `requests` requests of `context` prompt tokens, `max_tokens` out (EOS
    ignored), `concurrency` at once, greedy unless `sampling` says, streamed, against /v1/completions."""

    url: str
    model: str
    tokenizer: str
    context: int
    max_tokens: int
    requests: int
    concurrency: int
    seed: int
    # the cell's sampling (temperature, top_p, seed, frequency_penalty); {} greedy
    sampling: dict[str, Any] = field(default_factory=dict)
    # open loop (a rate cell): requests a second, sent on gamma-distributed gaps of this shape (1: Poisson),
    # no cap on requests in flight; None: closed loop at `concurrency`
    rate: float | None = None
    burstiness: float = 1.0

    @property
    def body(self) -> dict[str, Any]:
        """What every client's requests carry beside the prompt and max_tokens, as speedmatrix's own
        (client.sampling_body): the cell's sampling (greedy unless it says), EOS ignored, special tokens
        streamed as text. The last matters where a model emits special tokens: the server then streams an
        event with empty text for each, which vLLM's client and ours count as a token and AIPerf and
        GuideLLM do not (their first token is the first event with text). On the H200 the 31B shape's random
        weights emit <pad> after <pad>: AIPerf counted every request failed, GuideLLM a TTFT of 0. A client
        sends one seed for all its requests (speedmatrix: seed + the request's index)."""
        s = self.sampling
        return sampling_body(True, s.get("temperature", 0), s.get("top_p"), s.get("seed"), s.get("frequency_penalty"))


class Peer:
    name: ClassVar[str]
    module: ClassVar[str]  # what `python -m` runs; checked importable before any server starts
    pin: ClassVar[str]  # the version this project measured with (make peers installs it)
    notes: ClassVar[str]
    # the open-loop arrivals it sends at a rate (Load.rate): "poisson" (burstiness 1), "gamma" (another shape)
    arrivals: ClassVar[tuple[str, ...]] = ()

    def can_send(self, load: dict[str, Any]) -> bool:
        """Whether it can send a load a cell asks for (``Workload.reference_load``): any closed loop; an open loop
        whose arrivals it draws."""
        if "rate" not in load:
            return True
        return ("poisson" if load.get("burstiness", 1.0) == 1.0 else "gamma") in self.arrivals

    def argv(self, python: list[str], load: Load, work: Path, api_key: str | None) -> list[str]:
        """The command line; `work` is a private temporary folder (a key a client can only read from a file
        goes there, and the folder is removed after the run)."""
        raise NotImplementedError

    def env(self, environ: dict[str, str], load: Load, api_key: str | None) -> dict[str, str]:
        """The client process's environment, from this process's."""
        return dict(environ)

    def parse(self, work: Path) -> dict[str, Any]:
        raise NotImplementedError
