"""Intervals and verdicts: how sure is a number, and does arm A beat arm B?

Every chapter that compares arms (chapter 8's SFT variants, chapters 9–12's post-training
methods) states a difference only where an interval excludes zero; the prose then uses
:func:`said` instead of a sentence written in advance.

- :func:`wilson` — the Wilson score interval for a rate k/n (Wilson, 1927): unlike the normal
  interval p ± z√(p(1−p)/n) it stays inside [0, 1] and is sensible at k = 0 or k = n.
- :func:`t_difference` — the primary interval for a comparison of arms: a t-interval over the S
  per-seed means of the paired differences, S − 1 degrees of freedom. A seed decides the whole
  chain of a model, so the seeds are the independent units; the prompts only sharpen each seed's
  mean. With the seed-level and prompt-level noise normal it covers at its level for any S ≥ 2
  (``tests/unit/test_stats.py`` checks 3, 5 and 8 seeds by simulation). :func:`difference` is the
  t-interval where S ≥ 2 and the bootstrap, labelled so, from one seed.
- :func:`bootstrap_mean` and :func:`paired_difference` — percentile bootstrap intervals over the
  evaluation prompts and, when several training seeds ran, over the seeds too (a two-level
  bootstrap: resample seeds, then prompts). A comparison is *paired*: both arms answered the same
  prompts with models from the same seeds, so each resample draws the same prompts and seeds for
  both, and the prompt-to-prompt variation common to both arms cancels. For a difference of arms
  it is the secondary interval: resampling 3 seeds covers well below its level (0.81 for 0.95
  in the simulation of the tests), as the few seeds' spread is taken for the population's.
- :func:`said` — the one verdict of the book: "A is higher than B in …", "A is lower than B in …"
  or "A − B in …: not resolved", the interval beside it, "(exploratory)" before a contrast the
  chapter did not pre-register. :func:`verdict` is its terse form for a table cell.
- :func:`contrast` — one pre-registered (or exploratory) comparison of two arms in one call: the
  primary interval, the two-level bootstrap beside it and the verdict, as a :class:`Contrast` that
  also lists what a chapter glues under the contrast's name.
- :func:`per_seed` — a chapter's results as the (seeds, prompts) grid every interval above takes;
  :func:`between`, the interval of one arm minus another from those grids.
- Rates of an event by position in token sequences (chapter 1) are
  :mod:`halluc_lab.evaluation.sequence_rates`.
- :func:`reliability` — calibration (chapter 11): answers binned by the model's confidence, each bin's
  accuracy beside its mean confidence (the reliability diagram), and the expected calibration error
  ECE = Σ_b (n_b/N) |accuracy_b − confidence_b| (Guo et al., 2017) over equal-width bins.

Departure from common practice: the bootstrap's resamples are drawn with a seeded NumPy
generator, so the same numbers give the same interval on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy.stats import t as student_t

CONFIDENCE = 0.95  # the default level of every interval in the book
RESAMPLES = 10_000  # bootstrap resamples: the interval's ends move by well under 0.5% of its width


class OneSeedError(ValueError):
    """A t-interval over seeds was asked of one seed: there is no spread to estimate. Use the
    bootstrap (:func:`paired_difference`) and say that the interval is over prompts only."""


@dataclass(frozen=True)
class Interval:
    """An estimate with a two-sided confidence interval; for a comparison over seeds, also how it
    was made (``method``), how many seeds (``seeds``) and each seed's own value (``per_seed``)."""

    estimate: float  # the point estimate (a rate, a mean, a difference of means)
    low: float  # lower end of the interval
    high: float  # upper end of the interval
    confidence: float = CONFIDENCE  # the interval's level
    method: str = ""  # "t" (over seeds), "bootstrap" (seeds and prompts), "" (other: Wilson…)
    seeds: int | None = None  # S, the number of training seeds behind the estimate
    per_seed: tuple[float, ...] | None = None  # the S per-seed values whose mean is the estimate

    @property
    def side(self) -> int:
        """+1 when the whole interval lies above zero, −1 below it, 0 when it contains zero (nothing resolved)."""
        return 1 if self.low > 0 else -1 if self.high < 0 else 0

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of zero."""
        return self.side != 0

    def map(self, f: Callable[[float], float]) -> Interval:
        """The interval for ``f`` of the quantity, ``f`` increasing: ``f`` of the estimate and of both ends. The
        coverage carries over exactly (f(low) ≤ f(θ) ≤ f(high) just when low ≤ θ ≤ high); ``math.exp`` turns an
        interval for a mean log-loss into one for the perplexity.

        >>> format(Interval(0.0, -1.0, 1.0).map(math.exp), ".3f")
        '1.000 [0.368, 2.718]'
        """
        per_seed = None if self.per_seed is None else tuple(f(x) for x in self.per_seed)
        return Interval(f(self.estimate), f(self.low), f(self.high), self.confidence, self.method,
                        self.seeds, per_seed)

    @property
    def how(self) -> str:
        """How the interval was made, for a caption: "t, 8 seeds", "bootstrap, 1 seed" or ""."""
        if self.seeds is None:
            return self.method
        return f"{self.method}, {self.seeds} seed{'s' * (self.seeds != 1)}".lstrip(", ")

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"

    def __str__(self) -> str:
        return format(self)


def per_seed(runs, key: tuple, metric: str, seeds, mask=None) -> np.ndarray:
    """The (seeds, prompts) grid of one metric: row s is ``runs[(*key, s)][metric]``, one value per
    evaluation prompt in a fixed order, for each seed of ``seeds``; ``mask`` (a boolean vector over
    the prompts, or indices) keeps some columns, e.g. the hard split.

    >>> runs = {("sft", 0): {"wrong": [1, 0]}, ("sft", 1): {"wrong": [0, 0]}}
    >>> per_seed(runs, ("sft",), "wrong", [0, 1]).tolist()
    [[1.0, 0.0], [0.0, 0.0]]
    """
    missing = [s for s in seeds if (*key, s) not in runs]
    if missing:
        raise KeyError(f"no runs of {key!r} under seeds {missing}")
    grid = _as_grid([runs[(*key, s)][metric] for s in seeds], metric)
    return grid if mask is None else grid[:, mask]


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (float, np.floating)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be a float in (0, 1), got {confidence!r}")


def check_int(name: str, value, minimum: int | None = None) -> None:
    """``value`` must be a Python or NumPy integer (not a bool), at least ``minimum`` if given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval for a rate ``successes / n``.

    >>> format(wilson(8, 10), ".4f")
    '0.8000 [0.4902, 0.9433]'
    """
    _check_confidence(confidence)
    check_int("successes", successes)
    check_int("n", n)
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need n >= 1 and 0 <= successes <= n, got successes={successes}, n={n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The interval holds p; at p = 0 or 1 rounding can leave centre ∓ half a hair on the wrong side
    # (2.7e-20 above 0 for 0 of 8,000), which an error bar drawn from it would reject as negative.
    return Interval(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)), confidence)


def _as_grid(x, name: str) -> np.ndarray:
    """Scores as a (seeds, prompts) float array: a 1-D input is one seed."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 2:
        raise ValueError(f"{name} must be scores per prompt, shape (prompts,) or (seeds, prompts) with at least "
                         f"2 prompts, got shape {np.shape(x)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds NaN or inf")
    return a


def _bootstrap(grid: np.ndarray, confidence: float, resamples: int, seed: int) -> Interval:
    """Percentile interval of the grid's mean under resampling seeds (rows) and prompts (columns)."""
    _check_confidence(confidence)
    check_int("resamples", resamples, 100)
    check_int("seed", seed, 0)
    n_seeds, n_prompts = grid.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    chunk = max(1, 2_000_000 // (n_seeds * n_prompts))  # resamples at a time, about 16 MB of work
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        prompts = rng.integers(0, n_prompts, size=(r, n_prompts))  # (r, P): the same prompts for every seed
        per_seed = grid[:, prompts].mean(-1).T  # (r, S): each seed's mean over the resampled prompts
        seeds = rng.integers(0, n_seeds, size=(r, n_seeds)) if n_seeds > 1 else np.zeros((r, 1), dtype=int)
        stats[start:start + r] = np.take_along_axis(per_seed, seeds, axis=1).mean(1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    per_seed = tuple(float(x) for x in grid.mean(1))
    return Interval(float(grid.mean()), float(low), float(high), confidence, "bootstrap", n_seeds,
                    per_seed)


def bootstrap_mean(scores, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                   seed: int = 0) -> Interval:
    """The mean score with a bootstrap interval over prompts (and seeds, for a 2-D input).

    ``scores``: per-prompt scores (1 = right, 0 = wrong, or any number), shape (prompts,) or
    (seeds, prompts) when every seed answered the same prompts.
    """
    return _bootstrap(_as_grid(scores, "scores"), confidence, resamples, seed)


def _paired(a, b) -> np.ndarray:
    """a − b as a (seeds, prompts) grid, the two arms checked to be paired."""
    ga, gb = _as_grid(a, "a"), _as_grid(b, "b")
    if ga.shape != gb.shape:
        raise ValueError(f"a and b must be paired (same seeds and prompts), got shapes {ga.shape} "
                         f"and {gb.shape}")
    return ga - gb


def paired_difference(a, b, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                      seed: int = 0) -> Interval:
    """mean(a) − mean(b) with a paired bootstrap interval over prompts (and seeds).

    ``a`` and ``b`` are the two arms' scores on the same prompts, in the same order, shape
    (prompts,) or (seeds, prompts) with seed s of both arms sharing what the seed decides.
    The secondary interval of a comparison over seeds (see :func:`t_difference`).
    """
    return _bootstrap(_paired(a, b), confidence, resamples, seed)


def t_difference(a, b, *, confidence: float = CONFIDENCE) -> Interval:
    """mean(a) − mean(b) with a t-interval over the S per-seed means of the paired differences.

    ``a`` and ``b``: (seeds, prompts) scores as for :func:`paired_difference`. Seed s's value is
    d_s = mean over prompts of a[s] − b[s]; the interval is d̄ ± t_{S−1} · sd(d) / √S. Raises
    :class:`OneSeedError` for one seed.

    >>> a, b = [[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    >>> iv = t_difference(a, b)
    >>> format(iv, ".3f"), iv.how, iv.per_seed
    ('0.667 [-0.050, 1.384]', 't, 3 seeds', (0.5, 0.5, 1.0))
    """
    _check_confidence(confidence)
    d = _paired(a, b).mean(1)
    n = d.size
    if n < 2:
        raise OneSeedError("a t-interval over seeds needs at least 2 seeds, got 1; use "
                           "paired_difference (an interval over prompts only) and say so")
    mean = float(d.mean())
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, confidence, "t", n, tuple(float(x) for x in d))


def difference(a, b, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
               seed: int = 0) -> Interval:
    """The primary interval of a comparison of arms: :func:`t_difference` from two seeds or more,
    the bootstrap over prompts (``method`` "bootstrap", ``seeds`` 1) from one seed."""
    if _paired(a, b).shape[0] == 1:
        return paired_difference(a, b, confidence=confidence, resamples=resamples, seed=seed)
    return t_difference(a, b, confidence=confidence)


def between(runs, a: tuple, b: tuple, metric: str, seeds, mask=None, *,
            interval: Callable[..., Interval] = difference, **kw) -> Interval:
    """Arm ``a`` minus arm ``b`` on one metric: ``interval`` (:func:`difference`, or
    :func:`paired_difference` for the bootstrap) of their :func:`per_seed` grids, paired prompt by
    prompt and seed by seed; ``kw`` goes to ``interval`` (``resamples=``, ``confidence=``).

    >>> runs = {("rl", 0): {"wrong": [1, 0, 0]}, ("sft", 0): {"wrong": [1, 1, 0]}}
    >>> between(runs, ("rl",), ("sft",), "wrong", [0], resamples=200).estimate
    -0.3333333333333333
    """
    if not callable(interval):
        raise TypeError(f"interval must be a function of two grids, got {interval!r}")
    return interval(per_seed(runs, a, metric, seeds, mask), per_seed(runs, b, metric, seeds, mask),
                    **kw)


def verdict(difference: Interval, a: str = "A", b: str = "B") -> str:
    """The terse verdict for a table cell: "a > b", "a < b" or "a − b: not resolved" (the interval
    contains zero). Prose uses :func:`said`.

    >>> verdict(Interval(0.05, 0.01, 0.09), "backspace", "clean")
    'backspace > clean'
    >>> verdict(Interval(0.01, -0.02, 0.04), "backspace", "clean")
    'backspace − clean: not resolved'
    """
    if difference.side:
        return f"{a} {'>' if difference.side > 0 else '<'} {b}"
    return f"{a} − {b}: not resolved"


def said(difference: Interval, a: str, b: str, what: str, *, spec: str = "+.3f",
         plural: bool = False, exploratory: bool = False) -> str:
    """The verdict on ``what`` of ``a`` minus ``b`` as a clause that follows the numbers: "a is
    higher than b in what" or "a is lower …" where the interval excludes zero, "a − b in what: not
    resolved" where it does not; the interval always beside it, with how it was made ("t, 8 seeds")
    when the interval says.

    Every chapter's verdicts come from this one function. ``spec``: the format of the estimate and
    the interval's ends. ``plural``: ``a`` names several things ("are higher"). ``exploratory``: the
    contrast was not among the chapter's pre-registered ones; the clause begins "(exploratory)".

    >>> said(Interval(0.05, 0.01, 0.09), "backspace SFT", "clean SFT", "exact match")
    'backspace SFT is higher than clean SFT in exact match (+0.050 [+0.010, +0.090])'
    >>> iv = Interval(-0.02, -0.06, 0.01, method="t", seeds=8)
    >>> said(iv, "DPO", "SFT", "wrong rate", exploratory=True)
    '(exploratory) DPO − SFT in wrong rate: not resolved (-0.020 [-0.060, +0.010]; t, 8 seeds)'
    """
    for name, v in (("a", a), ("b", b), ("what", what)):
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{name} must be a non-empty string, got {v!r}")
    numbers = f"{difference:{spec}}" + (f"; {difference.how}" if difference.how else "")
    if difference.side:
        higher = "higher" if difference.side > 0 else "lower"
        words = f"{a} {'are' if plural else 'is'} {higher} than {b} in {what}"
    else:
        words = f"{a} − {b} in {what}: not resolved"
    return ("(exploratory) " if exploratory else "") + f"{words} ({numbers})"


@dataclass(frozen=True)
class Contrast:
    """One comparison of two arms: its primary interval (:func:`difference`), the two-level
    bootstrap beside it (:func:`paired_difference`) and its verdict (:func:`said`)."""

    primary: Interval  # t over the seeds' paired differences (the bootstrap from one seed)
    secondary: Interval  # the two-level bootstrap over seeds and prompts
    said: str  # the verdict, from the primary interval

    def glued(self) -> dict[str, float | list | str]:
        """What a chapter records under the contrast's name, by suffix: "" the primary interval as
        [estimate, low, high], "_bootstrap" the secondary one, "_per_seed" each seed's difference,
        "_verdict" the sentence."""
        p, s = self.primary, self.secondary
        return {"": [p.estimate, p.low, p.high], "_bootstrap": [s.estimate, s.low, s.high],
                "_per_seed": list(p.per_seed or ()), "_verdict": self.said}


def contrast(a, b, a_name: str, b_name: str, what: str, *, exploratory: bool = False,
             resamples: int = RESAMPLES) -> Contrast:
    """Arm ``a`` against arm ``b`` on ``what``: (seeds, prompts) scores paired as for
    :func:`paired_difference`; the verdict names them ``a_name`` and ``b_name`` and begins
    "(exploratory)" when ``exploratory``.

    >>> c = contrast([[1.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], "A", "B", "x", resamples=200)
    >>> c.said, c.glued()["_per_seed"]
    ('A − B in x: not resolved (+0.750 [-2.427, +3.927]; t, 2 seeds)', [1.0, 0.5])
    """
    primary = difference(a, b, resamples=resamples)
    secondary = paired_difference(a, b, resamples=resamples)
    return Contrast(primary, secondary, said(primary, a_name, b_name, what, exploratory=exploratory))


@dataclass(frozen=True)
class Reliability:
    """Answers binned by confidence: what a reliability diagram draws, and the ECE."""

    edges: np.ndarray  # (B + 1,) bin edges on [0, 1]; bin b is [edges[b], edges[b+1]), the last one closed
    count: np.ndarray  # (B,) answers in each bin
    confidence: np.ndarray  # (B,) mean confidence in each bin (NaN where empty)
    accuracy: np.ndarray  # (B,) share of right answers in each bin (NaN where empty)
    ece: float  # expected calibration error: Σ_b (count_b / N) |accuracy_b − confidence_b|

    @property
    def overconfidence(self) -> float:
        """Σ_b (count_b / N) (confidence_b − accuracy_b): > 0 when the model claims more than it gets right."""
        full = self.count > 0
        return float((self.count[full] * (self.confidence[full] - self.accuracy[full])).sum() / self.count.sum())


def reliability(confidence, correct, bins: int = 10) -> Reliability:
    """Bin answers by ``confidence`` (the model's probability of its own answer, in [0, 1]) into ``bins``
    equal-width bins and compare each bin's accuracy (``correct``: bools or 0/1) with its mean confidence.

    >>> r = reliability([0.9, 0.9, 0.6, 0.6], [1, 0, 1, 1], bins=2)
    >>> r.accuracy.tolist(), r.ece                      # bin [0.5, 1]: accuracy 0.75 at confidence 0.75
    ([nan, 0.75], 0.0)
    """
    conf, right = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    if conf.ndim != 1 or conf.shape != right.shape or conf.size == 0:
        raise ValueError(f"confidence and correct must be non-empty 1-D sequences of one length, "
                         f"got shapes {conf.shape} and {right.shape}")
    if not np.all((conf >= 0) & (conf <= 1)):
        raise ValueError("confidence must lie in [0, 1] (a probability)")
    if not np.all((right == 0) | (right == 1)):
        raise ValueError("correct must hold booleans or 0/1")
    check_int("bins", bins, 1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.minimum(np.searchsorted(edges, conf, side="right") - 1, bins - 1)  # conf = 1 joins the last bin
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(which, weights=conf, minlength=bins) / count
        accuracy = np.bincount(which, weights=right, minlength=bins) / count
    full = count > 0
    ece = float((count[full] * np.abs(accuracy[full] - mean_conf[full])).sum() / conf.size)
    return Reliability(edges, count, mean_conf, accuracy, ece)
