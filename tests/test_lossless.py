"""The losslessness verdict on scored tokens written for the test (speedmatrix.judge.lossless), and the status
it gives a cell (speedmatrix.judge.loopcheck). The check on the real engine runs inside the default run's tests
(tests/test_engine_e2e.py)."""

import pandas as pd

from speedmatrix.judge import loopcheck, lossless
from speedmatrix.plan import experiment

SETTINGS = {"logprob_floor": -8.0, "max_excess_share": 0.02, "tie_logprob_gap": 0.01}
SAMPLED = {"seed": 0, "temperature": 0.7, "top_p": 0.95}
GREEDY_FP = {"frequency_penalty": 0.5, "seed": 0, "temperature": 0}


def scores_with(n_seq: int, length: int, low_every: int | None) -> list[list[float]]:
    """Scores of ``n_seq`` outputs: -2 each, and every ``low_every``-th token -12 (below the floor)."""
    return [[-12.0 if low_every and (k * length + j) % low_every == 0 else -2.0 for j in range(length)]
            for k in range(n_seq)]


def test_a_greedy_pair_with_identical_tokens_is_lossless():
    outs = [[5, 6, 7, 8], [9, 9, 4]]
    v = lossless.judge({}, outs, [list(o) for o in outs], scores_with(2, 4, None), scores_with(2, 4, None), SETTINGS)
    assert v["verdict"] == "lossless" and v["greedy"] and v["label"] == "greedy"
    assert v["identical"] == 2 and v["identical_share"] == 1.0 and v["differences"] == []


def test_a_greedy_mismatch_beyond_a_near_tie_is_lossy_with_its_first_position():
    ours, twins = [[5, 6, 7, 8], [1, 2, 3]], [[5, 6, 9, 8], [1, 2, 3]]
    # at position 2 the target gives the twin's token -1.0 and the config's -4.5: 3.5 apart
    our_scores = [[-1.0, -1.0, -4.5, -1.0], [-1.0] * 3]
    twin_scores = [[-1.0, -1.0, -1.0, -1.0], [-1.0] * 3]
    v = lossless.judge({}, ours, twins, our_scores, twin_scores, SETTINGS)
    assert v["verdict"] == "lossy" and v["identical"] == 1
    d = v["differences"][0]
    assert (d["request"], d["position"], d["token"], d["twin_token"]) == (0, 2, 7, 9)
    assert abs(d["gap"] - 3.5) < 1e-9 and not d["near_tie"]
    assert "request 0, token 2" in v["reason"]


def test_a_greedy_difference_at_a_near_tie_is_numerics_not_a_loss():
    ours, twins = [[5, 6, 7]], [[5, 6, 9]]
    v = lossless.judge({}, ours, twins, [[-1.0, -1.0, -2.004]], [[-1.0, -1.0, -2.0]], SETTINGS)
    assert v["verdict"] == "lossless" and v["near_ties"] == 1 and v["differences"][0]["near_tie"]
    assert "near tie" in v["reason"]


def test_the_frequency_penalty_enters_the_greedy_gap():
    # token 6 was emitted twice before the difference: greedy with penalty 0.5 scores it 1.0 lower than its
    # log-prob, so the config's 6 at -1.0 (penalised -2.0) against the twin's 9 at -2.0: a tie after the penalty
    ours, twins = [[6, 6, 6]], [[6, 6, 9]]
    assert lossless.penalised_gap(2, ours[0], twins[0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -2.0], 0.5) == 0.0
    v = lossless.judge(GREEDY_FP, ours, twins, [[-1.0, -1.0, -1.0]], [[-1.0, -1.0, -2.0]], SETTINGS)
    assert v["greedy"] and v["verdict"] == "lossless" and v["label"] == "greedy, frequency penalty 0.5"
    # without the penalty the same scores are a 1.0 gap the other way: a loss
    assert lossless.judge({}, ours, twins, [[-1.0, -1.0, -1.0]], [[-1.0, -1.0, -2.0]], SETTINGS)["verdict"] == "lossy"


def test_an_output_that_ends_early_differs():
    v = lossless.judge({}, [[5, 6]], [[5, 6, 7]], [[-1.0, -1.0]], [[-1.0, -1.0, -1.0]], SETTINGS)
    assert v["verdict"] == "lossy" and v["differences"][0]["position"] == 2 and v["differences"][0]["gap"] is None


def test_a_sampled_pair_with_the_twins_share_below_the_floor_is_lossless():
    ours, twins = scores_with(10, 50, 250), scores_with(10, 50, 200)  # 0.4 % and 0.6 %
    v = lossless.judge(SAMPLED, [[1] * 50] * 10, [[2] * 50] * 10, ours, twins, SETTINGS)
    assert not v["greedy"] and v["verdict"] == "lossless" and v["label"] == "temperature 0.7, top_p 0.95"
    assert v["tokens"] == v["twin_tokens"] == 500
    assert v["share_below_floor"] == 0.004 and v["twin_share_below_floor"] == 0.006
    assert v["identical"] == 0 and v["identical_share"] == 0.0 and "0 of 10 seeded outputs" in v["reason"]


def test_a_sampled_pair_says_how_many_seeded_outputs_are_the_twins_token_for_token():
    """Where seeded speculative sampling draws what the target alone draws, every output is the twin's: the verdict
    says so, and then the share test is not what decides."""
    outs = [[3, 1, 4, 1, 5]] * 4 + [[9, 2, 6, 5, 3]]
    twins = [list(o) for o in outs[:4]] + [[9, 2, 6, 5, 8]]
    v = lossless.judge(SAMPLED, outs, twins, scores_with(5, 5, None), scores_with(5, 5, None), SETTINGS)
    assert v["identical"] == 4 and v["identical_share"] == 0.8 and v["requests"] == 5
    assert "4 of 5 seeded outputs token-identical to the twin's" in v["reason"]


def test_a_sampled_pair_far_below_the_floor_is_lossy():
    ours, twins = scores_with(10, 50, 3), scores_with(10, 50, 200)  # a third against 0.6 %
    v = lossless.judge(SAMPLED, [[1] * 50] * 10, [[2] * 50] * 10, ours, twins, SETTINGS)
    assert v["verdict"] == "lossy" and v["excess_share"] > 0.3
    assert "more than sampling from the target gives" in v["reason"]
    assert v["mean_logprob"] < v["twin_mean_logprob"]


def cell_doc(sampling=None):
    cell = {"server_id": "mtp2", "cell_id": "decode-ctx128-c4", "workload": "decode", "repeats": 1,
            **({"sampling": sampling} if sampling else {})}
    return {"cell": cell, "server": {"spec_tokens": 2}, "result": {"status": "valid", "output_throughput": 100.0}}


def check_doc(verdict_sampled: str):
    return {"server_id": "mtp2", "twin": "base", "settings": [
        {"setting": lossless.setting_key(SAMPLED), "label": "temperature 0.7, top_p 0.95", "greedy": False,
         "verdict": verdict_sampled, "reason": "why", "share_below_floor": 0.2, "twin_share_below_floor": 0.005},
        {"setting": "", "label": "greedy", "greedy": True, "verdict": "lossless", "reason": "same",
         "identical_share": 1.0}]}


def test_a_cell_whose_setting_is_lossy_gets_the_status_lossy_and_the_columns():
    requests = pd.DataFrame({"request_index": [0], "text": ["def f(x):\n    return x\n"], "output_tokens": [8]})
    judged = loopcheck.judge_cell(cell_doc(SAMPLED), requests, {}, None, check_doc("lossy"))
    assert judged["cell_status"] == "lossy" and "not the target's" in judged["status_reason"]
    assert judged["lossless_verdict"] == "lossy" and judged["lossless_share_below_floor"] == 0.2
    # the same config's greedy cell took the greedy verdict: valid
    greedy = loopcheck.judge_cell(cell_doc(), requests, {}, None, check_doc("lossy"))
    assert greedy["cell_status"] == "valid" and greedy["lossless_verdict"] == "lossless"
    assert greedy["lossless_identical_share"] == 1.0
    # Lossy comes before the measurement's own verdict (the reason keeps it); over capacity sent nothing
    bound = cell_doc(SAMPLED)
    bound["result"].update(status="client_bound", status_reason="the client stood still 2.0 s")
    judged = loopcheck.judge_cell(bound, requests, {}, None, check_doc("lossy"))
    assert judged["cell_status"] == "lossy" and "also client-bound: the client stood still" in judged["status_reason"]
    assert judged["lossless_setting"] == "temperature 0.7, top_p 0.95"
    over = cell_doc(SAMPLED)
    over["result"]["status"] = "over_capacity"
    judged = loopcheck.judge_cell(over, requests.iloc[0:0], {}, None, check_doc("lossy"))
    assert judged["cell_status"] == "over_capacity"
    # no check (a config without speculation, or without a twin): no verdict, nothing changed
    plain = loopcheck.judge_cell(cell_doc(SAMPLED), requests, {}, None, None)
    assert plain["cell_status"] == "valid" and plain["lossless_verdict"] is None


def test_the_default_checks_each_speculative_config_against_its_twin_measured_last():
    exp = experiment.load("tiny-cpu-full")  # the default in full: three speculative configs, one twin
    assert exp.lossless_checks() == {"mtp2": "base", "ngram2": "base", "eagle2": "base"}
    assert exp.server_order() == ["mtp2", "ngram2", "eagle2", "base"]
    settings = exp.sampling_settings("mtp2")
    assert lossless.setting_key(SAMPLED) in settings and lossless.setting_key(GREEDY_FP) in settings
    assert all(lossless.is_greedy(lossless.sampling_of(k)) for k in exp.sampling_settings("ngram2"))
    assert all(lossless.is_greedy(lossless.sampling_of(k)) for k in exp.sampling_settings("eagle2"))
