"""Traces and sessions: the loaders of the trace formats, prompts that share exactly a trace's shared blocks, the
theoretical prefix-hit rate, and a session's turns sending their history again.

The traces are the small files of ``tests/data/traces/`` (written for the tests by ``make_traces.py`` there, in
the published formats); the measurements run against ``fault_server`` (a test fixture that streams at once and
reports token ids); the default run's test replays them and holds sessions on the real CPU vLLM.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_client_faults import _measure

from fault_server import app
from speedmatrix import workloads
from speedmatrix.measure import datasets, traces

DATA = Path(__file__).parent / "data" / "traces"


def load(fmt: str, name: str):
    return datasets.load(name, {"path": str(DATA / name), "format": fmt})


def test_both_trace_formats_load_with_their_lock_entry():
    moon, lock = load("mooncake", "mooncake-small.jsonl")
    assert len(moon) == 40 and lock["format"] == "mooncake" and lock["records"] == 40 and len(lock["sha256"]) == 64
    assert moon[0].t_s == 0 and all(a.t_s <= b.t_s for a, b in zip(moon, moon[1:])) and lock["shared_blocks"]
    assert moon[0].hash_ids and lock["span_s"] == pytest.approx(moon[-1].t_s, abs=1e-3)
    azure, alock = load("azure", "azure-small.csv")
    assert len(azure) == 40 and not any(q.hash_ids for q in azure) and not alock["shared_blocks"]
    # the same arrivals and lengths written in both formats
    assert [q.input_tokens for q in azure] == [q.input_tokens for q in moon]
    assert [q.t_s for q in azure] == pytest.approx([q.t_s for q in moon], abs=1e-6)
    with pytest.raises(traces.TraceError, match="x.jsonl: row 0 has no 'input_length'"):
        traces.mooncake([{"timestamp": 0}], {"_where": "x.jsonl"})


def test_requests_sharing_a_hash_id_share_exactly_those_tokens():
    moon, _ = load("mooncake", "mooncake-small.jsonl")
    corpus = list(range(1000, 6000))
    scale, size = 0.25, traces.block_tokens(0.25)
    assert size == 128
    ids = [traces.prompt_ids(q, i, scale, corpus, "salt") for i, q in enumerate(moon)]
    assert [len(p) for p in ids] == [traces.scaled(q, scale)[0] for q in moon]
    for i, (a, qa) in enumerate(zip(ids, moon)):
        for b, qb in zip(ids[i + 1:], moon[i + 1:]):
            common = 0
            while common < min(len(qa.hash_ids), len(qb.hash_ids)) and qa.hash_ids[common] == qb.hash_ids[common]:
                common += 1
            shared = min(common * size, len(a), len(b))
            assert a[:shared] == b[:shared]
            if common * size < min(len(a), len(b)):  # past the shared blocks they differ at once
                assert a[common * size] != b[common * size] or a[common * size:common * size + 8] != b[
                    common * size:common * size + 8]
    # another cell's salt: other tokens (no earlier run's cache matches)
    assert traces.prompt_ids(moon[0], 0, scale, corpus, "other") != ids[0]
    with pytest.raises(traces.TraceError, match="whole number"):
        traces.block_tokens(0.3)


def test_theoretical_prefix_hits_by_hand_and_under_a_small_cache():
    q = traces.TraceRequest
    reqs = [q(0, 1024, 1, (1, 2)), q(1, 1024, 1, (1, 2)), q(2, 1536, 1, (1, 5, 6)), q(3, 1024, 1, (9, 2))]
    # second: both blocks hit (1,024); third: block 1 hits, 5 misses (512); fourth: 9 misses first, nothing
    assert traces.prefix_hits(reqs, 1.0, None) == {"hit_rate": 1536 / 4608, "hit_tokens": 1536,
                                                    "prompt_tokens": 4608}
    # a cache of one block: the second request finds only block 2 cached, not the leading 1
    assert traces.prefix_hits(reqs, 1.0, 512)["hit_tokens"] == 0
    moon, _ = load("mooncake", "mooncake-small.jsonl")
    unbounded = traces.prefix_hits(moon, 0.25, None)["hit_rate"]
    assert 0.3 < unbounded < 1 and traces.prefix_hits(moon, 0.25, 1024)["hit_rate"] < unbounded
    azure, _ = load("azure", "azure-small.csv")
    assert traces.prefix_hits(azure, 0.25, None)["hit_rate"] == 0


def test_a_window_a_sample_and_a_time_scale():
    moon, _ = load("mooncake", "mooncake-small.jsonl")
    w = traces.window(moon, 4.0, 6.0)
    assert w and all(0 <= x.t_s < 6 for x in w)
    assert len(w) == sum(1 for x in moon if 4 <= x.t_s < 10)
    half = traces.window(moon, sample=0.5, seed=1)
    assert half == traces.window(moon, sample=0.5, seed=1) and 8 < len(half) < 32


def replay_cell(trace: str, scale: float, ctx: int = 2048):
    block = {"trace": trace, "contexts": [ctx], "time_scale": [scale], "token_scale": 0.25, "start_s": 0.0,
             "sample": 1.0, "seed": 0, "lag_limit_ms": 100, "min_achieved": 0.5, "max_tokens": 4}
    return workloads.get("replay").expand("manual", block)[0]


def test_a_replay_sends_the_trace_on_its_scaled_schedule():
    moon, _ = load("mooncake", "mooncake-small.jsonl")
    cell = replay_cell("moon", 8)
    assert cell.id == "replay-ctx2048-data-moon-x8" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    result, records = _measure(cell, app(), dataset=moon)
    assert result["trace_requests"] == 40 and result["trace_prompts_skipped"] == 0
    assert [r.scheduled for r in records] == pytest.approx([q.t_s / 8 for q in moon])
    assert [r.prompt_tokens for r in records] == [traces.scaled(q, 0.25)[0] for q in moon]
    assert all(r.prompt_format == "token_ids" for r in records)
    assert result["theoretical_prefix_hit_rate_unbounded"] >= result["theoretical_prefix_hit_rate"] > 0
    assert result["offered_rate_rps"] == pytest.approx(40 / (moon[-1].t_s / 8), rel=0.01)
    # a context too short for some prompts: they are skipped and counted, never cut
    short = replay_cell("moon", 8, ctx=512)
    result, records = _measure(short, app(), dataset=moon)
    assert result["trace_prompts_skipped"] > 0 and all(r.prompt_tokens <= 512 for r in records)
    assert result["trace_requests"] + result["trace_prompts_skipped"] == 40


def test_a_session_sends_its_history_and_the_answer_again():
    block = {"contexts": [64], "users": [3], "turns": 3, "turn_tokens": 16, "think_s": 0.05, "think": "exponential",
             "ramp_s": 0.0, "seed": 0, "max_tokens": 4, "corpus": "prose"}
    cell = workloads.get("sessions").expand("manual", block)[0]
    assert cell.id == "sessions-ctx64-c3-turns3" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    result, records = _measure(cell, app())
    assert len(records) == 9 and result["sessions"] == 3 and result["sessions_completed"] == 3
    for s in range(3):
        turns = sorted((r for r in records if r.session == s), key=lambda r: r.turn)
        assert [r.turn for r in turns] == [1, 2, 3]
        # each turn: the previous prompt, its answer's tokens, and a new 16-token message
        for a, b in zip(turns, turns[1:]):
            assert b.prompt_tokens == a.prompt_tokens + len(a.output_ids) + 16 and a.output_ids
            assert b.start >= a.end
    by_turn = result["session_turns"]
    assert [t["turn"] for t in by_turn] == [1, 2, 3] and by_turn[2]["prompt_tokens"] > by_turn[0]["prompt_tokens"]
    json.dumps(result)


def test_a_session_search_finds_the_most_users_under_a_target():
    """On fault_server every turn is quick: the search doubles its users to the bound, each step whole sessions."""
    block = {"contexts": [64], "max_users": 4, "turns": 2, "turn_tokens": 8, "think_s": 0.0, "think": "fixed",
             "ramp_s": 0.0, "seed": 0, "max_tokens": 4, "corpus": "prose", "slo": "loose",
             "target": {"ttft_ms": 60_000, "percentile": 90}, "margin": 0.1}
    cell = workloads.get("session_search").expand("manual", block)[0]
    assert cell.id == "session_search-ctx64-c4-for-loose-turns2" and re.fullmatch(workloads.cell_id_pattern(), cell.id)
    result, records = _measure(cell, app())
    steps = result["slo_search_steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4] and all(s["holds"] for s in steps)
    assert result["slo_max_concurrency"] == 4 and [s["requests"] for s in steps] == [2, 4, 8]
    assert {r.phase for r in records} == {"step1", "step2", "step3"} and len({r.session for r in records}) == 7
    assert all(r.turn in (1, 2) for r in records)


def test_a_replay_search_finds_the_fastest_scale_with_its_interval():
    moon, _ = load("mooncake", "mooncake-small.jsonl")
    block = {"trace": "moon", "contexts": [2048], "slo": "loose", "target": {"ttft_ms": 60_000, "percentile": 90},
             "start_scale": 4, "max_scale": 16, "resolution": 0.1, "token_scale": 0.25, "start_s": 0.0,
             "duration_s": 8.0, "sample": 1.0, "seed": 0, "lag_limit_ms": 200, "min_achieved": 0.5, "max_tokens": 4}
    cell = workloads.get("replay_search").expand("manual", block)[0]
    assert cell.id == "replay_search-ctx2048-data-moon-for-loose"
    result, records = _measure(cell, app(), dataset=moon)
    steps = result["slo_replay_search_steps"]
    assert [s["time_scale"] for s in steps][:1] == [4] and result["slo_max_time_scale"] >= 4
    n = len(traces.window(moon, 0.0, 8.0))
    assert all(s["requests"] == n for s in steps) and len(records) == n * len(steps)
    held = [s["time_scale"] for s in steps if s["holds"]]
    assert result["slo_max_time_scale"] == max(held) and result["slo_max_time_scale_interval"][0] == max(held)
    # every step sends fresh prompts: requests sharing a hash id share tokens within a step, not across steps
    by_step = {}
    for r in records:
        by_step.setdefault(r.phase, []).append(r)
    assert len(by_step) == len(steps)


def test_sessions_from_a_conversation_dataset_send_its_user_turns():
    from speedmatrix.measure import datasets as ds

    records, _ = ds.load("chats", {"path": str(Path(__file__).parent / "data" / "datasets" / "sharegpt.json"),
                                    "format": "sharegpt"})
    first = records[0]
    assert first.prompt.startswith("How do I read a file") and first.turns == ("And skip blank lines?",)
    block = {"contexts": [256], "users": [2], "turns": 3, "turn_tokens": 64, "think_s": 0.0, "think": "fixed",
             "ramp_s": 0.0, "seed": 0, "max_tokens": 4, "corpus": "chats"}
    cell = workloads.get("sessions").expand("manual", block)[0]
    result, recs = _measure(cell, app(), dataset=records)
    # a session has as many turns as its conversation's user turns (at most the block's): its second turn is the
    # first prompt, the answer and the conversation's next user turn, in the server's tokens
    assert result["sessions_completed"] == 2
    for s in {r.session for r in recs}:
        mine = sorted((r for r in recs if r.session == s), key=lambda r: r.turn)
        assert 1 <= len(mine) <= 3
        for a, b in zip(mine, mine[1:]):
            assert b.prompt_tokens > a.prompt_tokens + len(a.output_ids)
