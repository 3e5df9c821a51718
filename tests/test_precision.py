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


@pytest.mark.parametrize("burst, repeats", [(False, 1), (True, 1), (True, 2)])
def test_the_rule_keeps_its_error_rate(burst, repeats):
    """The rule a decode cell runs (looks from steady state, each at its corrected level; batch means of the tokens
    as they arrived, a cell's windows pooled) stops on an interval that misses the stream's known rate in at most
    alpha of the cells; the same looks at the uncorrected level miss more, and the rule does stop early on most."""
    rule = precision.Precision.of({"output_tok_s": 0.08, "alpha": 0.1, "looks": 8, "min_window_s": 0.5})
    naive = dataclasses.replace(rule, alpha=rule.alpha * rule.looks * repeats)
    true_rate = 2 * (2.0 if burst else 1.0) / 0.01

    def misses(r: precision.Precision) -> tuple[float, float]:
        runs, missed, early = 400, 0, 0
        for seed in range(runs):
            windows = [synthetic_window(seed * repeats + k, burst=burst) for k in range(repeats)]
            stop, used = precision.after_the_fact([(w, max(rec.first_token for rec in w)) for w in windows], 5.0, r)
            lo, hi = stop["interval"]
            missed += not lo <= true_rate <= hi
            early += used < repeats or stop["at_s"] < 5.0
        return missed / runs, early / runs

    corrected, stopped_early = misses(rule)
    assert corrected <= rule.alpha + 3 * (rule.alpha * (1 - rule.alpha) / 400) ** 0.5
    assert stopped_early > 0.5
    assert misses(naive)[0] > corrected


def test_a_cell_pools_its_windows_and_says_why_it_stopped():
    """A second window adds its batch means to the first's (a window at another level widens the interval); the cell
    stops at its first precise look once it has its fewest repeats, else at its most with the reason."""
    rule = precision.Precision.of({"output_tok_s": 0.05, "min_repeats": 1})
    first = synthetic_window(1)
    t_s = max(r.first_token for r in first)
    one = precision.window_figures(rule, precision.window_look(first, t_s, 5.0, rule, 2), looks=1)
    assert len(one["precision_batches"]) == precision.BATCHES
    again = synthetic_window(2)
    pooled = precision.window_look(again, max(r.first_token for r in again), 5.0, rule, 2, [one])
    assert pooled["relative_half_width"] < one["precision_reached"]  # twenty batch means at one level
    assert pooled["ttft_samples"] == one["precision_ttft_samples"] + len(again)
    slower = [SimpleNamespace(chunk_times=[t * 1.5 for t in r.chunk_times], chunk_tokens=r.chunk_tokens,
                              first_token=r.first_token * 1.5) for r in again]
    shifted = precision.window_look(slower, max(r.first_token for r in slower), 5.0, rule, 2, [one])
    assert shifted["relative_half_width"] > pooled["relative_half_width"]  # the second window a third slower

    met = {**one, "precision_met": True, "precision_reached": 0.01}
    wide = {**one, "precision_met": False, "precision_reached": 0.2}
    assert precision.cell_stop(rule, [met], 2)["precision_stop"] == "precise"
    assert precision.cell_stop(rule, [wide], 2)["stop"] is False
    assert precision.cell_stop(rule, [wide], 1)["precision_stop"] == "max_window"
    got = precision.cell_stop(rule, [wide, wide], 2)
    assert got["precision_stop"] == "max_repeats" and got["repeats_measured"] == 2 and got["precision_reached"] == 0.2
    assert precision.cell_stop(dataclasses.replace(rule, min_repeats=2), [met], 2)["stop"] is False
    off = dataclasses.replace(rule, enabled=False)
    assert precision.cell_stop(off, [met], 1)["precision_stop"] == "fixed"
    assert precision.cell_stop(off, [met], 2)["stop"] is False
    assert rule.level(2) == pytest.approx(1 - rule.alpha / (rule.looks * 2)) and off.level(2) == 1 - rule.alpha


def test_a_percentile_needs_its_samples_before_the_rule_stops():
    rule = precision.Precision.of({"output_tok_s": 0.5, "percentile": 99, "looks": 1})
    assert rule.samples_needed(1) == precision.samples_for_percentile(0.99, rule.level(1))
    records = synthetic_window(0)
    look = precision.window_look(records, max(r.first_token for r in records), 5.0, rule, 1)
    assert look["relative_half_width"] <= 0.5 and not look["precise"]  # 2 requests, not the hundreds p99 needs
    got = precision.cell_stop(rule, [precision.window_figures(rule, look, 1)], 1)
    assert got["precision_stop"] == "too_few_requests"
    assert "too few requests" in precision.unmet(got, 5.0)
