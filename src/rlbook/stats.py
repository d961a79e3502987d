"""The book's statistics, one home for each: intervals, paired differences, power, multiplicity, and the gates
and readings of stored held-out series.

Intervals and differences (one number per training seed, seeds paired across arms):

- :func:`mean_interval`: the mean and its two-sided Student-t interval, ``mean +- t_{1-a/2, n-1} s / sqrt(n)``.
- :func:`prompt_interval`: a mean over prompts and its bootstrap (BCa) interval over prompts, the evaluation noise
  of one trained policy.
- :func:`paired_difference`: :func:`mean_interval` of ``fix - baseline``, seed by seed.

Power (the two-sided paired t-test, its statistic a noncentral t with ``n - 1`` degrees of freedom and
noncentrality ``effect sqrt(n) / sd``):

- :func:`paired_t_power`: the probability of rejecting "no difference" at level ``alpha`` with ``n`` seeds;
- :func:`seeds_needed`: the fewest seeds whose power reaches ``power``;
- :func:`detectable_effect`: the smallest effect ``n`` seeds detect with that power.

Multiplicity: :func:`holm_intervals`, Holm's step-down correction of several paired differences, with intervals that
exclude their null exactly when Holm rejects.

Stored series (an arm's runs, each with its held-out evaluations ``run["evals"]``, as
:class:`rlbook.evaluation.HeldOutEvaluation` records them) and the gate of an organism (:mod:`rlbook.organisms`):

- :func:`metric_at`: one value per seed at an evaluation; :func:`eval_series`: the steps and every seed's curve;
  :func:`metric_at_budget`: one value per seed at a spent budget, interpolated along a cumulative cost;
- :func:`baseline_change`: :func:`mean_interval` of the last evaluation minus the first; :func:`baseline_level`:
  of the metric averaged over the evaluations;
- :func:`gate_holds`: whether such an interval lies beyond a threshold in the failure's direction.

The module imports numpy and :func:`rlbook.tasks.base.check_int` only (scipy inside the functions, no torch), so
that any module may use it.
"""

from __future__ import annotations

import math

import numpy as np

from rlbook.tasks.base import check_int

DIRECTIONS = ("up", "down")  # which way a failure moves a metric (rlbook.organisms.Organism.failure)


# --- intervals, paired differences, power, multiplicity -----------------------------------------------------------


def mean_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its two-sided Student-t confidence interval (scipy), ``(mean, low, high)``; the
    interval is the mean itself for a single value or identical values."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2 or np.all(values == values[0]):  # no spread: the interval is the mean itself
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=stats.sem(values))
    return mean, float(low), float(high)


def prompt_interval(values, confidence: float = 0.95, seed: int = 0, n_resamples: int = 2000):
    """Mean of per-prompt ``values`` (e.g. ``per_prompt_accuracy()``) and its bootstrap interval over prompts
    (``scipy.stats.bootstrap``, BCa), ``(mean, low, high)``: the evaluation noise of one trained policy."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size < 2:
        raise ValueError(f"prompt_interval needs a 1-D array of at least 2 per-prompt values, got {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("prompt_interval got NaN or infinite values")
    mean = float(values.mean())
    if np.all(values == values[0]):
        return mean, mean, mean
    result = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                             random_state=np.random.default_rng(seed))
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)


def paired_difference(baseline, fix, confidence: float = 0.95):
    """Mean of ``fix - baseline`` over paired training seeds and its Student-t interval (scipy),
    ``(mean, low, high)``: both arrays hold one number per seed, seed ``i`` of each arm trained and evaluated
    with the same seed. The interval is the mean itself for a single seed."""
    baseline, fix = np.asarray(baseline, dtype=float), np.asarray(fix, dtype=float)
    if baseline.shape != fix.shape or baseline.ndim != 1 or baseline.size == 0:
        raise ValueError(f"baseline and fix must be 1-D arrays of one value per seed of the same length, got "
                         f"shapes {baseline.shape} and {fix.shape}")
    if not (np.isfinite(baseline).all() and np.isfinite(fix).all()):
        raise ValueError("paired_difference got NaN or infinite values")
    return mean_interval(fix - baseline, confidence)


def _check_power_arguments(seed_sd: float, alpha: float, power: float) -> None:
    if not (seed_sd > 0 and math.isfinite(seed_sd)):
        raise ValueError(f"seed_sd must be a positive finite number, got {seed_sd}")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha} and {power}")


def paired_t_power(seed_sd: float, effect: float, seeds: int, alpha: float = 0.05) -> float:
    """The probability that the two-sided paired t-test at level ``alpha`` over ``seeds`` paired seeds rejects "no
    difference" when the true mean difference is ``effect`` and the per-seed difference has standard deviation
    ``seed_sd``: the statistic follows the noncentral t with ``seeds - 1`` degrees of freedom and noncentrality
    ``effect * sqrt(seeds) / seed_sd`` (``scipy.stats.nct``), and the test rejects beyond the central t's
    ``1 - alpha/2`` quantile on either side."""
    from scipy import stats

    _check_power_arguments(seed_sd, alpha, 0.5)
    seeds = check_int(seeds, "seeds", minimum=2)
    if not math.isfinite(effect):
        raise ValueError(f"effect must be a finite number, got {effect}")
    df, noncentrality = seeds - 1, abs(effect) * math.sqrt(seeds) / seed_sd
    critical = stats.t.ppf(1 - alpha / 2, df)
    # the lower tail P(T < -c) as P(T > c) under the mirrored noncentrality: scipy's nct.cdf is NaN far in that tail
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality))


def seeds_needed(seed_sd: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Paired seeds needed to detect a mean difference ``effect`` when the per-seed difference has standard
    deviation ``seed_sd`` (from a pilot), two-sided level ``alpha``, with probability ``power``: the smallest
    number of seeds (at least 2) whose :func:`paired_t_power` reaches ``power``. The normal approximation
    ``((z_{1-alpha/2} + z_power) sd / effect)^2`` (about ``(2.8 sd / effect)^2``) ignores that the t-interval is
    wider with few seeds and asks for one to three seeds too few."""
    _check_power_arguments(seed_sd, alpha, power)
    if not (effect != 0 and math.isfinite(effect)):
        raise ValueError(f"effect must be a non-zero finite number, got {effect}")
    seeds = 2
    while paired_t_power(seed_sd, effect, seeds, alpha) < power:
        seeds += 1
    return seeds


def detectable_effect(seed_sd: float, seeds: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest mean difference that ``seeds`` paired seeds detect with probability ``power`` (two-sided level
    ``alpha``): the effect whose :func:`paired_t_power` equals ``power``, solved with ``scipy.optimize.brentq``.
    The inverse of :func:`seeds_needed`; at least 2 seeds (one seed has no t-interval)."""
    from scipy import optimize

    _check_power_arguments(seed_sd, alpha, power)
    seeds = check_int(seeds, "seeds", minimum=2)
    high = seed_sd
    while paired_t_power(seed_sd, high, seeds, alpha) < power:  # bracket the root
        high *= 2
    return float(optimize.brentq(lambda e: paired_t_power(seed_sd, e, seeds, alpha) - power, 0.0, high,
                                 xtol=1e-12 * seed_sd, rtol=1e-10))


def holm_intervals(differences: dict, nulls: dict | None = None, alpha: float = 0.05) -> dict:
    """Holm's step-down correction for several paired differences, with intervals that agree with it.

    ``differences`` maps a name to the per-seed differences of one comparison (1-D, at least 2 seeds); ``nulls``
    the value each is tested against (default 0; a non-inferiority margin ``-m`` tests "worse by more than m").
    Each comparison gets the two-sided paired t-test's p-value; sorted ascending, the ``k``-th of ``m`` is rejected
    while every one before it was and ``p <= alpha / (m - k + 1)``. Its interval is the Student-t interval at
    confidence ``1 - alpha / (m - k + 1)`` (before the first comparison not rejected) or at the level of that first
    one (from it on), so an interval excludes its null exactly when Holm rejects. Returns ``{name: {"mean", "low",
    "high", "null", "p", "adjusted_p", "level", "rejected"}}``; ``adjusted_p`` is Holm's adjusted p-value."""
    from scipy import stats

    if not differences:
        raise ValueError("holm_intervals needs at least one comparison")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    nulls = {**{name: 0.0 for name in differences}, **(nulls or {})}
    unknown = sorted(set(nulls) - set(differences))
    if unknown:
        raise ValueError(f"nulls name comparisons not in differences: {unknown}")
    tests = {}
    for name, values in differences.items():
        values = np.asarray(values, dtype=float)
        if values.ndim != 1 or values.size < 2:
            raise ValueError(f"{name!r}: needs a 1-D array of at least 2 paired differences, got {values.shape}")
        if not np.isfinite(values).all():
            raise ValueError(f"{name!r}: the differences hold NaN or infinite values")
        null = float(nulls[name])
        mean, se = float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))
        if se == 0:  # every seed gave the same difference: rejected unless it is the null itself
            p = 1.0 if mean == null else 0.0
        else:
            p = float(2 * stats.t.sf(abs(mean - null) / se, values.size - 1))
        tests[name] = (values, null, mean, se, p)
    order = sorted(tests, key=lambda name: tests[name][4])
    m, out, stopped_level, adjusted = len(order), {}, None, 0.0
    for k, name in enumerate(order):
        values, null, mean, se, p = tests[name]
        step_level = alpha / (m - k)
        rejected = stopped_level is None and p <= step_level
        if not rejected and stopped_level is None:
            stopped_level = step_level
        level = step_level if rejected else stopped_level
        adjusted = max(adjusted, min(1.0, (m - k) * p))
        half = float(stats.t.ppf(1 - level / 2, values.size - 1)) * se
        out[name] = {"mean": mean, "low": mean - half, "high": mean + half, "null": null, "p": p,
                     "adjusted_p": adjusted, "level": 1 - level, "rejected": rejected}
    return {name: out[name] for name in differences}



# --- stored held-out series: readings and gates ------------------------------------------------------------------


def metric_at(runs: list[dict], metric: str, where: int) -> np.ndarray:
    """One value per seed of ``metric`` at evaluation ``where`` (0 the first, -1 the last) of each run's
    ``evals``; raises ValueError if a run lacks it or it is NaN."""
    values = []
    for run in runs:
        evals = run.get("evals")
        if not evals:
            raise ValueError(f"run of seed {run.get('seed')} has no held-out evaluations ('evals')")
        value = evals[where].get(metric)
        if value is None or not np.isfinite(value):
            raise ValueError(f"run of seed {run.get('seed')}: {metric!r} is missing or NaN at evaluation {where}")
        values.append(float(value))
    return np.array(values)


def eval_series(runs: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The held-out evaluation steps ``(T,)`` and ``metric`` at each, ``(seeds, T)``, of one arm's runs (for
    :func:`rlbook.plotting.plot_seeds`); the runs must share their evaluation steps."""
    steps = [e["step"] for e in runs[0]["evals"]]
    if any([e["step"] for e in run["evals"]] != steps for run in runs):
        raise ValueError("the runs were evaluated at different steps")
    return np.array(steps), np.array([[e[metric] for e in run["evals"]] for run in runs], dtype=float)


def baseline_change(runs: list[dict], metric: str) -> tuple[float, float, float]:
    """The metric's change from the first evaluation to the last, mean and 95 % t-interval over seeds."""
    return mean_interval(metric_at(runs, metric, -1) - metric_at(runs, metric, 0))


def baseline_level(runs: list[dict], metric: str) -> tuple[float, float, float]:
    """The metric averaged over each run's evaluations, mean and 95 % t-interval over seeds (the gate of a failure
    present from the start, :attr:`rlbook.organisms.Organism.failure_threshold`)."""
    return mean_interval(np.mean([metric_at(runs, metric, i) for i in range(len(runs[0]["evals"]))], axis=0))


def gate_holds(interval: tuple[float, float, float], failure: str, threshold: float = 0.0) -> bool:
    """True when the interval (of the baseline's change, or of its level) lies beyond ``threshold`` (0 for a change)
    in the failure's direction."""
    if failure not in DIRECTIONS:
        raise ValueError(f"failure must be one of {DIRECTIONS}, got {failure!r}")
    _, low, high = interval
    return bool(low > threshold) if failure == "up" else bool(high < threshold)


def metric_at_budget(runs: list[dict], metric: str, budget, axis: str = "num_completions") -> np.ndarray:
    """One value per seed of ``metric`` once seed ``i`` had spent ``budget[i]`` (a number for every seed, or one per
    seed), read off each run's held-out evaluations by linear interpolation along ``axis``, a cumulative cost each
    evaluation records: ``"num_completions"``, the completions sampled for training, or another (the head-to-head's
    ``"samples"`` and ``"seconds"``). Raises ValueError where a run did not spend that much, or an evaluation lacks
    ``axis`` or ``metric``."""
    values = []
    for run, spend in zip(runs, np.broadcast_to(budget, (len(runs),))):
        spent = np.array([e.get(axis, np.nan) for e in run["evals"]], dtype=float)
        if not np.isfinite(spent).all():
            raise ValueError(f"run of seed {run.get('seed')}: {axis!r} is missing or NaN in an evaluation")
        if spend > spent[-1]:
            raise ValueError(f"run of seed {run.get('seed')} spent {spent[-1]:.6g} {axis}, less than the "
                             f"{spend:.6g} to compare at")
        series = np.array([e.get(metric, np.nan) for e in run["evals"]], dtype=float)
        if not np.isfinite(series).all():
            raise ValueError(f"run of seed {run.get('seed')}: {metric!r} is missing or NaN in an evaluation")
        values.append(float(np.interp(spend, spent, series)))
    return np.array(values)
