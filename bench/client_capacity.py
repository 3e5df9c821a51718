#!/usr/bin/env python3
"""Client capacity: the highest request rate each benchmark client completes with short outputs, and how many
streamed tokens a second it takes in with long ones. speedmatrix's client, `vllm bench serve`, AIPerf and GuideLLM
in alternating rounds, each against the same local streamer (tests/fast_streamer.py).

    .venv/bin/python bench/client_capacity.py [--rounds 3] [--out bench/results/client_capacity.json]

Needs `make peers` (AIPerf and GuideLLM in .peers/). The streamer runs pinned to one core, the client under test
to another (``taskset``), one client at a time; every client is run as its own process, as a user would run it
(speedmatrix through its client library with the client check on; the others through speedmatrix.peers, the
command lines the reference rule uses). Figures:

* closed loop, short outputs: ``--short-tokens`` (4) tokens a request, ``--levels`` requests in flight (16, 64, 256,
  1,024), max(2,000, 4 x in flight) requests; completed requests / the client's own duration (req/s);
* open loop, short outputs: Poisson arrivals stepped up through ``--rates`` until the client falls behind: its
  achieved rate (completed / its duration) under 95 % of the offered, or (speedmatrix, which records it) the
  send lag's p95 over 1 ms (``--no-lag-rule``: the achieved rate alone, as the others are judged); the highest
  rate it kept;
* ingest, long outputs: 2,048 tokens a request at 16 in flight, 48 requests: output tokens / duration (tok/s).

Each run also records the streamer's CPU share (its process's CPU seconds over the client's own duration): a
streamer near a full core is the ceiling, not the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from client_overhead import _start_streamer, two_cores  # noqa: E402

from speedmatrix import peers  # noqa: E402
from speedmatrix.core import host  # noqa: E402
from speedmatrix.serve.procs import free_port  # noqa: E402

OURS = "speedmatrix"
CLIENTS = (OURS, "vllm_bench_serve", "aiperf", "guidellm")
PROMPT_TOKENS = 16
TOKENIZER = REPO / "src/speedmatrix/data/models/tiny-gemma4-trained"  # the shipped target: its tokenizer
KEEP_SHARE = 0.95  # the open loop's achieved rate must be at least this share of the offered
LAG_LIMIT_MS = 1.0  # and speedmatrix's send lag p95 at most this


async def _ours(url: str, concurrency: int, requests: int, tokens: int, rate: float | None) -> dict:
    from speedmatrix.measure import arrivals, client, clientcheck, stats

    opts = client.RequestOptions(max_tokens=tokens, ignore_eos=True, usage_per_chunk=False)
    prompt = [1] * PROMPT_TOKENS
    async with clientcheck.ClientCheck() as check:
        if rate:
            schedule = arrivals.Arrival(rate, "poisson", duration_s=requests / rate, seed=1).schedule()
            _, records = await client.open_loop(url, "bench", [prompt] * len(schedule), schedule, opts)
        else:
            _, records = await client.fixed_count(url, "bench", lambda i: prompt, requests, concurrency, opts)
    ok = [r for r in records if not r.error]
    end = max(r.end for r in ok) if ok else check.wall_s
    first = min(r.start for r in records) if records else 0.0
    duration = end - first
    lags = [max(0.0, r.start - r.scheduled) * 1000 for r in records if r.scheduled is not None]
    out = {"completed": len(ok), "asked": len(records), "total_output_tokens": sum(r.output_tokens for r in ok),
           "duration": duration, **check.figures(records)}
    if lags:  # the p95 every figure of the product reads (the files recorded before took the nearest higher rank)
        out["send_lag_p95_ms"] = stats.percentile(lags, 95)
    return out


def worker(ns: argparse.Namespace) -> int:
    if ns.uvloop:
        import uvloop
        uvloop.install()
    r = asyncio.run(_ours(ns.url, ns.concurrency, ns.requests, ns.tokens, ns.rate))
    print(json.dumps(r))
    return 0


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(who: str, url: str, core: int | str, streamer_pid: int, concurrency: int, requests: int, tokens: int,
            rate: float | None, uvloop: bool = False) -> dict:
    """One client's run: its own figures, req/s and tok/s over its own duration, and the streamer's CPU share."""
    cpu0, t0 = _cpu_s(streamer_pid), time.monotonic()
    if who == OURS:
        cmd = ["taskset", "-c", str(core), sys.executable, __file__, "--worker", "--url", url, "--concurrency",
               str(concurrency), "--requests", str(requests), "--tokens", str(tokens),
               *(["--rate", str(rate)] if rate else []), *(["--uvloop"] if uvloop else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            return {"error": proc.stderr[-500:]}
        r = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        peer = peers.table()[who]
        load = peers.Load(url=url, model="bench", tokenizer=str(TOKENIZER), context=PROMPT_TOKENS, max_tokens=tokens,
                          requests=requests, concurrency=concurrency, seed=1, rate=rate)
        python = ["taskset", "-c", str(core), *peers.python_for(who, {})]
        with tempfile.TemporaryDirectory() as work:
            try:
                r = peers.run(peer, load, python, Path(work))
            except (RuntimeError, OSError, StopIteration, KeyError) as exc:
                return {"error": str(exc)[-500:]}
        r["asked"] = requests
    r["process_wall_s"] = round(time.monotonic() - t0, 3)
    done, duration = r.get("completed"), r.get("duration")
    # over the client's own duration (its start-up sends nothing): near 1.0, the streamer was the ceiling
    r["streamer_cpu_share"] = round((_cpu_s(streamer_pid) - cpu0) / duration, 3) if duration else None
    r["req_s"] = done / duration if done and duration else None
    r["tok_s"] = r["total_output_tokens"] / duration if r.get("total_output_tokens") and duration else None
    return r


def _core_set(spec: str) -> set[int]:
    """taskset's list ("0-7,12") as a set of cores."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None and not r.get("error")]
    return statistics.median(vals) if vals else None


def _order(rnd: int, clients: tuple[str, ...]) -> tuple[str, ...]:
    """A rotation of the clients per round, so that none always runs first."""
    k = rnd % len(clients)
    return clients[k:] + clients[:k]


def _kept(who: str, r: dict, rate: float, lag_rule: bool = True) -> bool:
    if r.get("error") or not r.get("req_s"):
        return False
    if r["completed"] < r["asked"]:
        return False
    if lag_rule and r.get("send_lag_p95_ms") is not None and r["send_lag_p95_ms"] > LAG_LIMIT_MS:
        return False
    return r["req_s"] >= KEEP_SHARE * rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=100, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--uvloop", action="store_true", help="speedmatrix's worker on uvloop's event loop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--levels", default="16,64,256,1024", help="requests in flight of the closed-loop test")
    ap.add_argument("--rates", default="250,500,1000,1500,2000,2500,3000,4000,6000",
                    help="the open loop's steps, req/s (stops at the first one a client does not keep)")
    ap.add_argument("--short-tokens", type=int, default=4)
    ap.add_argument("--no-lag-rule", action="store_true",
                    help="judge speedmatrix's open-loop steps by the achieved rate alone, as the others are (they "
                         "record no send lag)")
    ap.add_argument("--parts", default="closed,open,ingest")
    ap.add_argument("--client-cores", default="",
                    help="the cores every client runs on, as taskset takes them (e.g. 0-7 on a 16-core host; default: "
                         "the first core); the streamer runs on another")
    ap.add_argument("--label", default="", help="a name for this run's figures (before, after)")
    ap.add_argument("--out", default=str(REPO / "bench/results/client_capacity.json"))
    ns = ap.parse_args()
    if ns.worker:
        return worker(ns)
    cores = two_cores()
    clients = tuple(ns.clients.split(","))
    missing = [c for c in clients if c != OURS and peers.problems([c], {}, "bench")]
    if missing:
        raise SystemExit(f"not importable: {', '.join(missing)} (run `make peers`)")
    client_core = ns.client_cores or cores[0]
    taken = _core_set(ns.client_cores) if ns.client_cores else {cores[0]}
    streamer_core = next((c for c in cores if c not in taken), None)
    if streamer_core is None:
        raise SystemExit("no core left for the streamer: give the clients fewer (--client-cores)")
    parts = ns.parts.split(",")
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "label": ns.label, "host": platform.node(),
                 "cpu_model": host.cpu_model(), "cores": len(cores), "client_core": client_core,
                 "streamer_core": streamer_core, "python": platform.python_version(), "uvloop": ns.uvloop,
                 "versions": {c: (peers.table()[c].pin if c != OURS else host.commit()) for c in clients},
                 "short_tokens": ns.short_tokens, "prompt_tokens": PROMPT_TOKENS, "rounds": ns.rounds,
                 "closed": [], "open": [], "ingest": []}
    port = free_port("127.0.0.1")
    proc = _start_streamer(port, streamer_core)
    url = f"http://127.0.0.1:{port}"

    def log(row: dict) -> None:
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)

    try:
        if "closed" in parts:
            for c in (int(x) for x in ns.levels.split(",")):
                n = max(2000, 4 * c)
                runs: dict[str, list] = {w: [] for w in clients}
                for rnd in range(ns.rounds):
                    for who in _order(rnd, clients):
                        runs[who].append(run_one(who, url, client_core, proc.pid, c, n, ns.short_tokens, None,
                                                 ns.uvloop))
                row = {"in_flight": c, "requests": n, **{f"{w}_req_s": _median(runs[w], "req_s") for w in clients},
                       **{f"{w}_streamer_cpu": _median(runs[w], "streamer_cpu_share") for w in clients},
                       "rounds": runs}
                doc["closed"].append(row)
                log(row)
        if "open" in parts:
            rates = [float(x) for x in ns.rates.split(",")]
            best: dict[str, list] = {w: [] for w in clients}
            steps: dict[str, list] = {w: [] for w in clients}
            for rnd in range(ns.rounds):
                for who in _order(rnd, clients):
                    kept = None
                    for rate in rates:
                        r = run_one(who, url, client_core, proc.pid, 0, int(max(1000, 3 * rate)), ns.short_tokens,
                                    rate, ns.uvloop)
                        r.update(offered_rps=rate, round=rnd + 1, kept=_kept(who, r, rate, not ns.no_lag_rule))
                        steps[who].append(r)
                        if not r["kept"]:
                            break
                        kept = rate
                    best[who].append(kept)
                    print(json.dumps({"open": who, "round": rnd + 1, "highest_kept_rps": kept}), flush=True)
            row = {"rule": f"achieved >= {KEEP_SHARE:.0%} of offered, every request completed"
                           + ("" if ns.no_lag_rule else f"; speedmatrix also send lag p95 <= {LAG_LIMIT_MS:g} ms"),
                   **{f"{w}_highest_kept_rps": (statistics.median([b or 0 for b in best[w]])) for w in clients},
                   **{f"{w}_rounds_kept_rps": best[w] for w in clients}, "steps": steps}
            doc["open"].append(row)
            log({k: v for k, v in row.items() if k != "steps"})
        if "ingest" in parts:
            runs = {w: [] for w in clients}
            for rnd in range(ns.rounds):
                for who in _order(rnd, clients):
                    runs[who].append(run_one(who, url, client_core, proc.pid, 16, 48, 2048, None, ns.uvloop))
            row = {"in_flight": 16, "requests": 48, "tokens_per_request": 2048,
                   **{f"{w}_tok_s": _median(runs[w], "tok_s") for w in clients},
                   **{f"{w}_streamer_cpu": _median(runs[w], "streamer_cpu_share") for w in clients},
                   "rounds": runs}
            doc["ingest"].append(row)
            log(row)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    Path(ns.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
