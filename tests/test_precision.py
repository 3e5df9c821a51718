"""The precision rule's pieces against known answers: Student's t, the order-statistic interval of a percentile
and the samples it needs, batch means, and the sequential rule's error rate on streams whose true mean is known
(its repeated looks must not let the interval it stops on miss more often than its stated alpha)."""

from __future__ import annotations

import dataclasses
import math
import random
from types import SimpleNamespace

import pytest

from speedmatrix.measure import precision, stats


def test_t_quantiles_are_students():
    # the two-sided 95 % critical values the repeats' intervals have used (stats._T95), df 1 to 30
    for df, want in enumerate(stats._T95, 1):
        assert precision.t_quantile(0.975, df) == pytest.approx(want, abs=1e-3)
    assert precision.t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-6)


def test_a_percentiles_interval_is_between_binomial_ranks():
    assert precision.percentile_ranks(100, 0.5, 0.95) == (40, 61)  # the median's, as tables give it
    assert precision.percentile_ranks(50, 0.99, 0.95) is None  # p99 of 50 samples: no interval exists
    n = precision.samples_for_percentile(0.99, 0.95)
    assert precision.percentile_ranks(n, 0.99, 0.95) is not None
    assert precision.percentile_ranks(n - 1, 0.99, 0.95) is None
    # coverage, counted: how often the interval of 400 draws from a known distribution holds its true p90
    rng, q, runs = random.Random(7), 0.9, 400
    lo, hi = precision.percentile_ranks(400, q, 0.9)
    true_q = -math.log(1.0 - q)  # the 0.9 quantile of an exponential of rate 1
    misses = 0
    for _ in range(runs):
        xs = sorted(rng.expovariate(1.0) for _ in range(400))
        misses += not xs[lo - 1] <= true_q <= xs[hi - 1]
    assert misses / runs <= 0.1 + 3 * (0.1 * 0.9 / runs) ** 0.5


def test_batch_means_of_a_steady_stream_are_equal():
    times = [i * 0.01 for i in range(1000)]  # one token every 10 ms for 10 s
    rates = precision.batch_means(times, [1.0] * 1000, 0.0, 10.0, 10)
    assert rates == pytest.approx([100.0] * 10)
    assert precision.relative_half_width(precision.mean_interval(rates, 0.95)) == pytest.approx(0.0)


@pytest.mark.parametrize("draw", ["normal", "lognormal"])
def test_the_sequential_rule_keeps_its_error_rate(draw):
    """Over many streams with a known mean, the share whose stopping interval misses it stays within alpha; a rule
    that looks as often at the uncorrected level misses more."""
    rule = precision.Rule(target=0.03, alpha=0.1, looks=8, min_n=3, max_n=40)
    naive = precision.Rule(target=0.03, alpha=0.1 * 8, looks=8, min_n=3, max_n=40)  # each look at 1 - alpha
    true_mean = {"normal": 100.0, "lognormal": 100.0 * 2.718281828459045 ** (0.05 ** 2 / 2)}[draw]

    def stream(seed: int):
        rng = random.Random(seed)
        if draw == "normal":
            return lambda: rng.gauss(100.0, 5.0)
        return lambda: 100.0 * rng.lognormvariate(0.0, 0.05)

    def miss_rate(r: precision.Rule) -> float:
        runs, misses = 1500, 0
        for seed in range(runs):
            got = precision.run_sequentially(r, stream(seed))
            lo, hi = got["interval"]
            misses += not lo <= true_mean <= hi
        return misses / runs

    corrected = miss_rate(rule)
    assert corrected <= rule.alpha + 3 * (rule.alpha * (1 - rule.alpha) / 1500) ** 0.5
    assert miss_rate(naive) > corrected


def synthetic_window(seed: int, streams: int = 2, gap_s: float = 0.01, sigma: float = 0.5, duration_s: float = 5.0,
                     burst: bool = False) -> list[SimpleNamespace]:
    """A decode window's requests with a known rate: each stream's events arrive after lognormal gaps of mean
    ``gap_s`` (with ``burst``, each event carries 1-3 tokens, as speculative decoding delivers them, 2 on
    average): the true rate is ``streams`` x tokens per event / ``gap_s``."""
    rng = random.Random(seed)
    mu = math.log(gap_s) - sigma ** 2 / 2
    out = []
    for _ in range(streams):
        t, times, tokens = 0.0, [], []
        while t < duration_s:
            t += rng.lognormvariate(mu, sigma)
            times.append(t)
            tokens.append(rng.choice((1, 2, 3)) if burst else 1)
        out.append(SimpleNamespace(chunk_times=times, chunk_tokens=tokens, first_token=times[0]))
    return out


@pytest.mark.parametrize("burst", [False, True])
def test_the_window_rule_keeps_its_error_rate(burst):
    """The rule a decode window runs (looks from steady state, each at its corrected level, batch means of the
    tokens as they arrived) stops on an interval that misses the stream's known rate in at most alpha of the
    windows; the same looks at the uncorrected level miss more, and the rule does stop early on most."""
    rule = precision.Precision.of({"output_tok_s": 0.08, "alpha": 0.1, "looks": 8, "min_window_s": 0.5})
    naive = dataclasses.replace(rule, alpha=rule.alpha * rule.looks)
    true_rate = 2 * (2.0 if burst else 1.0) / 0.01

    def misses(r: precision.Precision) -> tuple[float, float]:
        runs, missed, early = 500, 0, 0
        for seed in range(runs):
            records = synthetic_window(seed, burst=burst)
            t_steady = max(rec.first_token for rec in records)
            stop, _ = precision.after_the_fact(records, t_steady, 5.0, r)
            lo, hi = stop["interval"]
            missed += not lo <= true_rate <= hi
            early += stop["at_s"] < 5.0
        return missed / runs, early / runs

    corrected, stopped_early = misses(rule)
    assert corrected <= rule.alpha + 3 * (rule.alpha * (1 - rule.alpha) / 500) ** 0.5
    assert stopped_early > 0.5
    assert misses(naive)[0] > corrected


def test_the_repeats_rule_stops_when_precise_and_says_why_not():
    rule = precision.Precision.of({"output_tok_s": 0.02, "min_repeats": 1})
    window = {"precision_target": 0.02, "precision_ttft_samples": 10}
    precise = {**window, "precision_stop": "precise", "precision_reached": 0.01, "output_throughput": 100.0}
    wide = {**window, "precision_stop": "max_window", "precision_reached": 0.05, "output_throughput": 100.0}
    assert precision.repeats_look(rule, [precise], "output_throughput", 3)["precision_stop"] == "precise"
    assert precision.repeats_look(rule, [wide], "output_throughput", 3)["stop"] is False
    assert precision.repeats_look(rule, [wide], "output_throughput", 1)["precision_stop"] == "max_window"
    spread = [wide, {**wide, "output_throughput": 120.0}, {**wide, "output_throughput": 90.0}]
    got = precision.repeats_look(rule, spread, "output_throughput", 3)
    assert got["precision_stop"] == "max_repeats" and got["precision_reached"] > 0.02 and got["repeats_measured"] == 3
    steady = [wide, {**wide, "output_throughput": 100.1}, {**wide, "output_throughput": 99.9}]
    assert precision.repeats_look(rule, steady, "output_throughput", 3)["precision_stop"] == "precise"
    off = dataclasses.replace(rule, enabled=False)
    assert precision.repeats_look(off, [precise], "output_throughput", 1)["precision_stop"] == "fixed"
    assert precision.repeats_look(off, [precise], "output_throughput", 2)["stop"] is False


def test_a_percentile_needs_its_samples_before_the_rule_stops():
    rule = precision.Precision.of({"output_tok_s": 0.5, "percentile": 99, "looks": 1})
    assert rule.samples_needed == precision.samples_for_percentile(0.99, rule.level)
    records = synthetic_window(0)
    look = precision.window_look(records, max(r.first_token for r in records), 5.0, rule)
    assert look["relative_half_width"] <= 0.5 and not look["precise"]  # 2 requests, not the hundreds p99 needs
    assert precision.window_stop(rule, look, closed_early=False) == "too_few_requests"
