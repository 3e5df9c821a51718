"""The precision rule's pieces against known answers: Student's t, the order-statistic interval of a percentile
and the samples it needs, batch means, and the sequential rule's error rate on streams whose true mean is known
(its repeated looks must not let the interval it stops on miss more often than its stated alpha)."""

from __future__ import annotations

import math
import random

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
