"""Chapter 6's latency measurements in words: numbers for prose, and the paragraphs on a timing run.

Chapter 6 (the KV cache) times an uncached forward and one engine step at every context, and the
total time to generate n tokens, for two models. What those numbers say depends on the run (the
device, whether the step is a CUDA graph, where the fitted fixed cost meets the work), so the
paragraphs are built from them: :func:`per_token_text`, :func:`hardware_text` (which sets the
rates beside an H100's or H200's datasheet) and :func:`totals_text`. Numbers are written to three
significant digits with a unit (:func:`sig`, :func:`fmt_ms`, :func:`fmt_time`, :func:`fmt_count`).

A timing run ``r`` is the chapter's record of one model: its per-token seconds (``uncached``,
``eager``, ``cached``), their log–log slopes and those of the counted FLOPs, the fitted fixed cost
``c0``, rate ``1/inv_rate`` and crossover ``t_star``, and the totals (``lengths``, ``tot_*``,
``fit_n``, their exponents and ``ratio``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from halluc_lab.model.kv_cache import step_cost


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, no exponent notation (1234.56 → 1,235)."""
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x)))) if x else 0
    return f"{x:,.{decimals}f}"


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds, three significant digits."""
    return f"{sig(seconds * 1e3)} ms"


def fmt_time(seconds: float) -> str:
    """Seconds in µs, ms or s, three significant digits."""
    if seconds < 1e-3:
        return f"{sig(seconds * 1e6)} µs"
    return fmt_ms(seconds) if seconds < 1 else f"{sig(seconds)} s"


def fmt_count(n: float, unit: str = "") -> str:
    """A count with a k, M, G or T prefix and three significant digits (975,243,264 → 975 M)."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{sig(n / scale)} {prefix}{unit}"
    return f"{sig(n)} {unit}".rstrip()


def pct(fraction: float) -> str:
    """A fraction as a percentage, two significant digits (0.0123 → 1.2 %)."""
    return f"{sig(100 * fraction, 2)} %"


@dataclass(frozen=True)
class Measured:
    """Where a timing run was taken: what its paragraphs say beside the run's own numbers."""

    contexts: Sequence[int]  # the contexts timed per token, shortest first
    half: int  # per-token exponents are fitted over contexts[half:]
    graphs: bool  # the engine's step was replayed as a CUDA graph (and also timed eagerly)
    gpu: str | None  # the datasheet key ("H100", "H200") when the device is one, else None
    gpu_name: str  # the device's own name ("" on the CPU)
    margin: float  # two exponents (or an exponent and 1) differ when further apart than this
    hbm_bytes_per_s: Mapping[str, float]  # datasheet memory bandwidth, by datasheet key
    peak_bf16_flops: Mapping[str, float]  # datasheet dense bf16 FLOP/s, by datasheet key


def _fixed_cost_clause(r, m: Measured) -> str:
    """Where the uncached forward's fitted work passes its fixed cost, if the fit found a work "
      "term."""
    if r.t_star is None:
        return ", with no measurable work term: every point is the fixed cost."
    t_max = m.contexts[-1]
    return (f" and the rate at $R \\approx$ {fmt_count(1 / r.inv_rate, 'FLOP/s')}; the work passes "
            "the "
            f"fixed cost at $t^\\ast \\approx$ {r.t_star:,}"
            + (", beyond the longest context measured: every point is mostly fixed cost."
               if r.t_star > t_max else
               ", inside the fitted range: below it the time is nearly flat, above it it follows "
               "the "
               "count, and the fitted slope is a blend of the two."
               if r.t_star > m.contexts[m.half] else
               ", below the fitted range, where the time roughly follows the count."))


def per_token_text(r, m: Measured) -> str:
    """The per-token paragraph of one timing model: exponents, the fitted c0 and t*, eager against "
      "graph."""
    contexts, half = m.contexts, m.half
    u, e, c, t_max = r.uncached, r.eager, r.cached, contexts[-1]
    text = (f"**{r.title}, per token.** Over $t$ = {contexts[half]}…{t_max} the uncached forward's "
            f"time grows as $t^{{{r.exp_uncached:.2f}}}$ while its FLOPs grow as "
            f"$t^{{{r.count_uncached:.2f}}}$; from $t$ = {contexts[0]} to {t_max} its FLOPs grow "
            f"{r.flops_uncached[-1] / r.flops_uncached[0]:,.0f}× and its time "
            f"{sig(u[-1] / u[0])}×. The "
            f"fit puts the fixed cost of an uncached forward at $c_0 \\approx$ {fmt_ms(r.c0)}")
    text += _fixed_cost_clause(r, m)
    work = r.flops_cached[-1] * r.inv_rate  # seconds of the cached step's arithmetic at rate R
    text += (f" The cached step's time grows as $t^{{{r.exp_cached:.2f}}}$ against FLOPs "
             f"$t^{{{r.count_cached:.2f}}}$: its work at $t$ = {t_max} is "
             f"{fmt_count(r.flops_cached[-1], 'FLOP')}, about {fmt_time(work)} at rate $R$, "
             "against a "
             f"measured {fmt_ms(c[-1])}"
             + ("." if work >= 0.3 * min(c) else
                ", so arithmetic is a small part of the step at every context measured: the rest "
                "is a "
                "cost the context does not change." if c[-1] < 1.25 * c[0] else
                ", so arithmetic is a small part of the step at every context measured; yet the "
                "step "
                f"takes {sig(c[-1] / c[0])}× as long at $t$ = {t_max} as at {contexts[0]}. What "
                "grows "
                "with the context is not the arithmetic but reading the cache and the attention "
                "kernels "
                "that run over it."))
    if m.graphs:
        text += (f" Eagerly, kernel by kernel, the cached step costs {fmt_ms(e[0])} at $t$ = "
                 f"{contexts[0]} and {fmt_ms(e[-1])} at {t_max}, against {fmt_ms(u[0])} and "
                 f"{fmt_ms(u[-1])} for the uncached forward; replayed as a CUDA graph it costs "
                 f"{fmt_ms(c[0])} and {fmt_ms(c[-1])}. Of the factor {sig(u[-1] / c[-1])} between "
                 "the "
                 f"uncached forward and the graph step at $t$ = {t_max}, the cache gives "
                 f"{sig(u[-1] / e[-1])} and the graph {sig(e[-1] / c[-1])}.")
    slower = [t for t, a, b in zip(contexts, u, c) if b > a]
    if slower:
        where = (f"Up to $t$ = {slower[-1]}" if slower == contexts[:len(slower)]
                 else "At $t$ = " + ", ".join(str(t) for t in slower))
        text += (f" {where} one cached step is slower than a whole uncached forward: the engine's "
                 "step "
                 "does more per call (sampling, log-probs, per-row bookkeeping) than a bare "
                 "forward, and "
                 "at short contexts the fixed cost is all there is.")
    if c[-1] < u[-1]:
        return text + f" At the longest context the cached step is {sig(u[-1] / c[-1])}× faster."
    return text + f" Even at the longest context the cached step is {sig(c[-1] / u[-1])}× slower."


def _bandwidth_clause(share: float) -> str:
    if share >= 0.5:
        return ("Most of the step goes to reading memory: it is memory-bound, the regime that "
                "\"Why "
                "decoding is memory-bound\" below works out.")
    if share >= 0.15:
        return ("Reading memory is a sizeable part of the step, but most of its time goes "
                "elsewhere: "
                "the many small kernels of a step, each running well below the bandwidth, are the "
                "likely cause, which a profile would confirm.")
    return ("Reading memory is a small part of the step: its time goes to what the bytes do not "
            "explain — launching kernels, however little each does.")


def _peak_clause(peak: float) -> str:
    if peak >= 0.5:
        return "the forward is compute-bound, close to what the chip can do."
    if peak >= 0.15:
        return "a fair share of the peak, but well below it."
    return "far below the peak: its kernels are too small to keep the chip busy."


def hardware_text(r, m: Measured, record: Callable[[str, float], None]) -> str:
    """The cached step's bytes per second and the uncached forward's FLOPs per second, set beside
    the datasheet of an H100 or H200; on another device the rates alone. ``record(name, value)``
    receives each number the paragraph rests on (the bytes, the rates and, against a datasheet,
    the fractions)."""
    contexts, gpu = m.contexts, m.gpu
    # the cached step at the shortest context
    moved = step_cost(r.cfg, 1, contexts[0] - 1, bytes_per_value=r.bytes_per_value)
    bandwidth, rate = moved.bytes / r.cached[0], float(r.flops_uncached[-1] / r.uncached[-1])
    record("cached_step_bytes", moved.bytes)
    record("cached_step_bytes_per_s", bandwidth)
    record("uncached_flops_per_s", rate)
    text = (f"**{r.title}, against the hardware.** At $t$ = {contexts[0]} a cached step reads "
            f"{fmt_count(moved.bytes, 'B')} (all but "
            f"{fmt_count(moved.bytes - moved.weight_bytes, 'B')} "
            f"of it weights) in {fmt_time(r.cached[0])}: {fmt_count(bandwidth, 'B/s')}")
    if gpu:
        hbm = m.hbm_bytes_per_s[gpu]
        share = bandwidth / hbm
        record("bandwidth_fraction", share)
        text += (f", {pct(share)} of the {gpu}'s datasheet {hbm / 1e12:.2f} TB/s, at which reading "
                 f"those bytes would take {fmt_time(moved.bytes / hbm)}. "
                 + _bandwidth_clause(share))
    else:
        text += "."
    text += (f" The uncached forward at $t$ = {contexts[-1]} does "
             f"{fmt_count(r.flops_uncached[-1], 'FLOP')} in {fmt_time(r.uncached[-1])}: "
             f"{fmt_count(rate, 'FLOP/s')}")
    if gpu and r.dtype == torch.bfloat16:
        peak = rate / m.peak_bf16_flops[gpu]
        record("peak_fraction", peak)
        text += (f", {pct(peak)} of the {gpu}'s dense bf16 peak of "
                 f"{m.peak_bf16_flops[gpu] / 1e12:.0f} TFLOP/s: " + _peak_clause(peak))
    elif gpu:
        text += (f" (the model computes in {str(r.dtype).removeprefix('torch.')}: the bf16 peak is "
                 "not "
                 "its ceiling).")
    elif m.graphs:
        text += (f". The chapter has no datasheet numbers for this GPU ({m.gpu_name}): the rates "
                 "stand "
                 "alone.")
    else:
        text += (". On the CPU the chapter quotes no datasheet: these are the rates this run's CPU "
                 "threads reached.")
    return text


def side_of_one(exponent: float, margin: float) -> str:
    """Where an exponent lies against 1, within ``margin``: "above 1", "below 1" or "about 1"."""
    return "above 1" if exponent > 1 + margin else "below 1" if exponent < 1 - margin else "about 1"


def _split_text(r, graphs: bool) -> str:
    """The longest total, split into the cache's share and the graph's."""
    n1 = r.lengths[-1]
    u, e, c = r.tot_uncached[-1], r.tot_eager[-1], r.tot_cached[-1]
    if not graphs:
        return (f" At $n$ = {n1:,} the uncached loop takes {fmt_time(u)} and the engine "
                f"{fmt_time(c)}: "
                f"the factor {sig(u / c)} is all the cache's. On the CPU there is no graph — the "
                "engine's "
                "step runs eagerly — so the graph's share is 1 and the eager total is not timed "
                "twice.")
    return (f" At $n$ = {n1:,} the uncached loop takes {fmt_time(u)}, the engine {fmt_time(e)} "
            "eagerly "
            f"and {fmt_time(c)} with its CUDA graph: of the factor {sig(u / c)} between the loops, "
            "the "
            f"cache's share (uncached over eager) is {sig(u / e)} and the graph's (eager over "
            "graph) "
            f"{sig(e / c)}."
            + (" The cache's share is below 1: at this length the engine's eager steps, each "
               "launching "
               "more kernels than a bare forward (sampling, log-probs, bookkeeping), cost more "
               "than the "
               "uncached forwards they replace." if u < e else "")
            + (" The graph's share is below 1: replaying the step cost more than launching its "
               "kernels "
               "one by one." if e < c else ""))


def totals_text(r, m: Measured) -> str:
    """The totals paragraph: exponents, what the fitted timing model predicts and whether this run
    bears it out, and the total ratio split into the cache's share and the graph's."""
    margin = m.margin
    pred, meas = r.predicted_total_uncached, r.exp_total_uncached
    n0, n1 = r.lengths[0], r.lengths[-1]
    where = ("the fit found no work term" if r.t_star is None else
             f"the longest $n$ stays below $t^\\ast \\approx$ {r.t_star:,}"
             if r.fit_n[-1] < r.t_star
             else f"the lengths pass $t^\\ast \\approx$ {r.t_star:,}")
    verdict = (f"bears this out: {meas:.2f}" if abs(meas - pred) <= margin else
               f"agrees that it is {side_of_one(pred, margin)} but not on how far: {meas:.2f}"
               if side_of_one(meas, margin) == side_of_one(pred, margin) else "does not: "
                                                                              f"{meas:.2f}")
    r0, r1 = r.ratio[0], r.ratio[-1]
    trend = "grows" if r1 > 1.2 * r0 else "falls" if r1 < r0 / 1.2 else "stays within 20 %"
    text = (f"**{r.title}, totals.** Generating $n$ = {r.fit_n[0]}…{r.fit_n[-1]:,} tokens, the "
            f"uncached loop's time grows as $n^{{{meas:.2f}}}$ (its FLOPs as "
            f"$n^{{{r.count_total_uncached:.2f}}}$) and the cached one's as "
            f"$n^{{{r.exp_total_cached:.2f}}}$ (FLOPs $n^{{{r.count_total_cached:.2f}}}$). Summed "
            "over "
            f"the steps, the timing model fitted to the per-token times ({where}) predicts an "
            "uncached "
            f"exponent of {pred:.2f}, {side_of_one(pred, margin)}; the measurement {verdict}. The "
            "ratio "
            f"of the two totals {trend}, from {sig(r0)}× at $n$ = {n0} to {sig(r1)}× at $n$ = "
            f"{n1:,}"
            + ((", as the predicted exponent implies." if trend == "grows" else
                ", although the predicted exponent implies that it grows.")
               if pred > 1 + margin else "."))
    return text + _split_text(r, m.graphs)
