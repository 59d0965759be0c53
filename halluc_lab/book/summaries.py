"""Chapters 10–12's summaries and chapter 11's claim rows, as sentences built from numbers.

A chapter's summary states what its measurements say, so its words must follow the numbers: a
verdict comes from :func:`halluc_lab.evaluation.stats.said` (higher, lower or not resolved, the
interval beside it), never from a sentence written before the run. These builders take the
intervals and rates a chapter computed and return Markdown; ``tests/unit/test_summaries.py`` plants
numbers on both sides of every verdict and checks that the wording follows.

- :func:`against_best` and :func:`take_back_summary` — RL with a backspace token (chapter 10): each
  contrast of the hallucination rate, how often the `<bksp>` arms erased, and each arm with
  `<bksp>` against the best arm without it, with what masking its `<bksp>` does.
- :func:`hallucination_summary` — hallucination and retrieval (chapter 11): where the
  hallucinations are, decoding, calibration, propagation and retrieval, one bullet each; and
  :func:`reading_passages`, what its models do with retrieved passages; and
  :func:`hallucination_claims`, the rows of its check of 001 Part 3 §2–3, each verdict from the
  measured interval.
- :func:`continual_learning_summary`, :func:`sycophancy_summary`, :func:`safety_summary`,
  :func:`vision_summary` and :func:`icl_cot_summary` — the summaries of chapter 12's pages, one
  each, each closing with how many disagreements the page's tables hold.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence

from halluc_lab.book.claims import ClaimTable
from halluc_lab.evaluation.stats import Interval, said

RATE = "hallucination rate"
AGREEING = "rate of agreeing with a wrong user"  # chapter 12's sycophancy measure
BM25_4, ORACLE, NONE = "the BM25 top-4 passages", "the oracle passages", "its answers with none"


def _places(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: "1 place", "6 places"."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    return f"{n} {noun}{'s' * (n != 1)}"


# -- RL with a backspace token -----------------------------------------------------------------
def against_best(arm: str, best: str, d: Interval, masked: Interval, ratio: float, *,
                 exploratory: bool = False) -> str:
    """An arm with `<bksp>` against the best arm without it (``d``: its hallucination rate minus
    the best's), the ratio of their rates, and what masking its `<bksp>` does (``masked``: the same
    weights with minus without). Where the arm is lower, the clause says whether its take-backs
    account for part of the gain. ``exploratory``: the contrast was not pre-registered (the
    verdict begins "(exploratory)").

    >>> iv = Interval(0.17, 0.14, 0.20)
    >>> against_best("RLVR + bksp", "RSFT", iv, Interval(-0.08, -0.2, 0.01), 9.2).split(": ")[1]
    "a rate 9.20 times the best arm's (its `<bksp>` minus masked"
    """
    if not ratio >= 0:
        raise ValueError(f"ratio must be a number >= 0 (a ratio of two rates), got {ratio!r}")
    verdict = said(d, arm, best, RATE, exploratory=exploratory)
    head = f"{verdict}: a rate {ratio:.2f} times the best arm's"
    if d.high >= 0:
        return f"{head} (its `<bksp>` minus masked: {masked:+.3f})"
    if masked.high < 0:
        cause = ("and the take-backs account for part of it: with its `<bksp>` masked, the same "
                 f"weights hallucinate more ({masked:+.3f} with minus without)")
    else:
        cause = ("but not through its take-backs: with its `<bksp>` masked the same weights do no "
                 f"worse ({masked:+.3f} with minus without)")
    return f"{head}, {cause}"


def take_back_summary(task: str, where: str, wrong: Callable[[str, str], Interval],
                      erasing: Mapping[str, float], best: str, against: Sequence[str], *,
                      exploratory: bool = False) -> str:
    """One task's paragraph of the summary. ``wrong(a, b)``: arm ``a`` minus arm ``b`` in
    hallucination rate, both answering greedily; ``erasing``: the share of greedy answers that
    erased, of "RLVR + bksp" and "RLVR + own errors"; ``best``: the best arm without `<bksp>`;
    ``against``: :func:`against_best` of each RLVR arm with `<bksp>`. ``exploratory``: none of
    these contrasts was pre-registered (each verdict begins "(exploratory)")."""
    if len(against) != 2:
        raise ValueError(f"against must hold the two RLVR arms' clauses, got {len(against)}")
    for arm in ("RLVR + bksp", "RLVR + own errors"):
        if not 0 <= erasing[arm] <= 1:
            raise ValueError(f"erasing[{arm!r}] must be a share in [0, 1], got {erasing[arm]!r}")

    def v(a: str, b: str) -> str:
        return said(wrong(a, b), a, b, RATE, exploratory=exploratory)

    starts = "; ".join(v(f"{m} + {s}", m) for m in ("RSFT", "DPO") for s in ("bksp", "own errors"))
    controls = "; ".join(v(f"{m} + own errors", f"{m} + corrections") for m in ("RSFT", "DPO"))
    return (
        f"**{task}**, hallucination rate on {where}. RL from the verifier against the SFT model it "
        f"started from: {v('RLVR', 'SFT')}. With take-backs against without, at the same compute: "
        f"{v('RLVR + bksp', 'RLVR')}; RLVR + bksp erased in {erasing['RLVR + bksp']:.1%} of its "
        f"greedy answers, RLVR + own errors in {erasing['RLVR + own errors']:.1%}. The own-errors "
        "arm against its control with the same gold answers and no take-back: "
        f"{v('RLVR + own errors', 'RLVR + corrections')}. Against the best arm without `<bksp>` "
        f"({best}, chosen after the fact), {against[0]}; and {against[1]}. Chapter 9's "
        "post-trainings from the backspace starting points, against the same method from clean "
        f"SFT: {starts}. The own-errors starting point against its control (the same gold answers, "
        f"no take-back), each after the same method: {controls}.")


# -- hallucination and retrieval ---------------------------------------------------------------
def hallucination_summary(*, hard: str, sft_hard: Interval, sft_knowable: float,
                          dpo_vs_sft: Interval, rlvr_vs_dpo: Interval,
                          decoding_range: tuple[float, float], decodings: int,
                          hot_vs_greedy: Interval, sft_conf_wrong: float, sft_ece: float,
                          rlvr_ece: float, drift: float, returned: float,
                          singular_values: Sequence[float], gain_offset: int, gain: float,
                          bm25_vs_none: Interval, oracle_vs_none: Interval,
                          reader_oracle_vs_none: Interval, reader_vs_sft: Interval,
                          follows: Mapping[str, float], disagreements: int) -> str:
    """The chapter's summary, a bullet a topic. ``hard``: the split the contrasts read (e.g. "rare
    fact"); the Intervals are differences a − b of the hallucination rate (``sft_hard``: SFT's rate
    there); ``follows``: per model, the share of answers that wrote a swapped passage's entity."""
    low, high = decoding_range
    if not low <= high:
        raise ValueError(f"decoding_range must be (lowest, highest), got {decoding_range!r}")
    return (
        f"- **Where the hallucinations are.** On {hard} chains the SFT model answers wrong "
        f"{sft_hard:.3f} of the time (greedy; knowable chains: {sft_knowable:.3f}). There, "
        f"{said(dpo_vs_sft, 'DPO', 'SFT', RATE)}, and {said(rlvr_vs_dpo, 'RLVR', 'DPO', RATE)}.\n"
        f"- **Decoding.** The same weights give hallucination rates from {low:.3f} to {high:.3f} "
        f"across {decodings} decodings; "
        f"{said(hot_vs_greedy, 'sampling at τ = 1.5', 'greedy', 'rate')}.\n"
        f"- **Calibration.** SFT's wrong answers have mean confidence {sft_conf_wrong:.2f} "
        f"(ECE {sft_ece:.3f}); RLVR's ECE is {rlvr_ece:.3f}.\n"
        f"- **Propagation.** After a forced wrong entity the next step drifts coherently in "
        f"{drift:.2f} of answers and returns to the gold path in {returned:.2f}; the blocks' "
        f"median singular values are {', '.join(f'{m:.2f}' for m in singular_values)}, and the "
        f"largest relative gain {gain_offset} positions on is {gain:.2f}.\n"
        f"- **Retrieval.** For the SFT model on {hard} chains, "
        + said(bm25_vs_none, f"its answers with {BM25_4}", NONE, RATE, plural=True,
               exploratory=True)
        + ", and " + said(oracle_vs_none, f"its answers with {ORACLE}", NONE, RATE, plural=True)
        + _same_either_way(bm25_vs_none, oracle_vs_none)
        + "; for the reader, "
        + said(reader_oracle_vs_none, f"its answers with {ORACLE}", NONE, RATE, plural=True)
        + "; the reader with oracle passages against the SFT model with none: "
        + said(reader_vs_sft, "the reader", "SFT", RATE, exploratory=True)
        + ". With the first fact swapped, the share of answers that wrote the passage's entity is "
        + ", ".join(f"{share:.2f} for {arm}" for arm, share in follows.items()) + ".\n"
        f"- The chapter's check-the-claim tables disagree with the documents in "
        f"{_places(disagreements, 'place')}.")


def _same_either_way(bm25: Interval, oracle: Interval) -> str:
    """Where the SFT model's change is the same with the retrieved and the oracle passages, seed by
    seed, a clause that says so; else nothing."""
    values = [(iv.estimate, iv.low, iv.high, tuple(iv.per_seed or ())) for iv in (bm25, oracle)]
    if values[0] != values[1]:
        return ""
    return (" — the same change, seed by seed, with either set: what the passages say does not "
            "move the SFT model's rate there, only that its prompt opens with passages")


# -- extensions --------------------------------------------------------------------------------
def _rate(v: Interval) -> str:
    """A rate with its interval; one with no spread at all (the interval one point: every seed gave
    the same rate) as the value and that fact, not "1.000 [1.000, 1.000]".

    >>> _rate(Interval(0.5, 0.4, 0.6)), _rate(Interval(1.0, 1.0, 1.0))
    ('0.500 [0.400, 0.600]', '1.000 in every seed')
    """
    return f"{v.estimate:.3f} in every seed" if v.low == v.high else f"{v:.3f}"


def _rates(named: Sequence[tuple[str, Interval]]) -> str:
    """Named rates in order, those in a row with the same single-point value said once: "start
    0.914 [0.896, 0.931], refuse and take back 0.000 in every seed"."""
    groups: list[tuple[list[str], Interval]] = []
    for name, v in named:
        last = groups[-1][1] if groups else None
        if last is not None and v.low == v.high == last.low == last.high:
            groups[-1][0].append(name)
        else:
            groups.append(([name], v))
    return ", ".join(f"{' and '.join(names)} {_rate(v)}" for names, v in groups)


def _tables(disagreements: int) -> str:
    """The closing sentence of a chapter 12 page: how many disagreements its tables hold.

    >>> _tables(1)
    "The page's tables hold 1 disagreement with the documents; it is on the [errata page](...)."
    >>> _tables(0)
    "The page's tables hold 0 disagreements with the documents."
    """
    held = f"The page's tables hold {_places(disagreements, 'disagreement')} with the documents"
    if not disagreements:
        return held + "."
    where = "it is" if disagreements == 1 else "each is"
    return f"{held}; {where} on the [errata page](../book/errata.md)."


def continual_learning_summary(*, steps: int, full_vs_before: Interval, frozen_vs_before: Interval,
                               span: str, chance: float, anchors: Mapping[float, Interval],
                               disagreements: int) -> str:
    """Continual learning's summary. ``full_vs_before``, ``frozen_vs_before``: old-chain accuracy
    after the fine-tune minus before; ``span``: the new gradient's share in the old ones' span, as
    printed; ``anchors``: per λ, the anchored run minus full fine-tuning in old-chain accuracy."""
    old = "old-chain accuracy"
    anchored = "; ".join(said(d, f"the anchor at λ = {lam:g}", "full fine-tuning", old)
                         for lam, d in anchors.items())
    frozen = said(frozen_vs_before, "a frozen backbone", "the model before", old, exploratory=True)
    return (
        f"**Continual learning.** After {steps} steps on the grown world, "
        f"{said(full_vs_before, 'full fine-tuning', 'the model before', old)}. "
        f"{frozen}. "
        f"The new gradient's share in the span of the old ones is {span} (a random direction's: "
        f"{chance:.2g}). Eq. (12)'s anchor, added to full fine-tuning: {anchored}.\n\n"
        + _tables(disagreements))


def sycophancy_summary(*, sft_agrees: Interval, agreeable_vs_sft: Interval,
                       rlvr_vs_agreeable: Interval, rlvr_vs_sft: Interval,
                       disagreements: int) -> str:
    """Sycophancy's summary. ``sft_agrees``: the SFT model's rate of agreeing with a wrong user;
    ``agreeable_vs_sft`` and ``rlvr_vs_agreeable``, the page's two pre-registered contrasts, and
    ``rlvr_vs_sft``, an exploratory one: one model's rate minus another's."""
    agreeable = "RLHF with agreeable raters"
    return (
        f"**Sycophancy.** The SFT model repeats a wrong user's number in {sft_agrees:.3f} of the "
        f"sums. Pre-registered: {said(agreeable_vs_sft, agreeable, 'SFT', AGREEING)}; "
        f"{said(rlvr_vs_agreeable, 'RLVR', agreeable, AGREEING)}. "
        f"{said(rlvr_vs_sft, 'RLVR', 'SFT', AGREEING, exploratory=True)}.\n\n"
        + _tables(disagreements))


def safety_summary(*, violations: Mapping[str, Interval], disagreements: int) -> str:
    """Safety's summary. ``violations``: the rates "start", "refuse", "take back" (free-running) and
    "refuse, prefilled", "take back, prefilled"."""
    v = violations
    free = _rates([(k, v[k]) for k in ("start", "refuse", "take back")])
    prefilled = _rates([(k, v[f"{k}, prefilled"]) for k in ("refuse", "take back")])
    return (
        f"**Safety.** Free-running violations of the forbidden relation: {free}; with the fact "
        f"prefilled: {prefilled}.\n\n" + _tables(disagreements))


def vision_summary(*, vlm_habit: Interval, disagreements: int) -> str:
    """The vision model's summary. ``vlm_habit``: the habit-trained captioner's rate of naming the
    usual colour on counter images minus the control's."""
    return (
        "**A model that sees.** On images that break the training habit, the habit-trained "
        "captioner's extra rate of naming the usual colour against the control's: "
        f"{said(vlm_habit, 'the habit model', 'the control', 'that rate')}.\n\n"
        + _tables(disagreements))


def icl_cot_summary(*, icl_right: Interval, cot_vs_direct: Interval, disagreements: int) -> str:
    """In-context learning and chain of thought's summary. ``icl_right``: the ICL model's accuracy
    with 1–4 demonstrations; ``cot_vs_direct``: accuracy on held-out sums, CoT minus direct."""
    return (
        "**In-context learning and chain of thought.** With 1–4 demonstrations, the share of "
        f"held-out prompts the ICL model answers right is {_rate(icl_right)} (chance 1/9); on "
        "held-out sums, "
        f"{said(cot_vs_direct, 'CoT', 'direct', 'accuracy')}.\n\n" + _tables(disagreements))


def reading_passages(*, sft_answered: float, rag_answered: float, rag_follows: float,
                     rag_oracle: Interval, reader_follows: float,
                     reader_per_seed: Sequence[float], reader_oracle: Interval,
                     reader_vs_sft: Interval, wrong_passage: Interval) -> str:
    """What the three models do with retrieved passages, as a paragraph. ``*_answered``: the share
    of answers that begin with the prompt's entity given the oracle passages (SFT, SFT + RAG);
    ``*_follows``: the share that wrote a swapped first passage's entity (the reader's per seed
    too); ``*_oracle``: the oracle passages minus none, in the rare-fact hallucination rate;
    ``reader_vs_sft``: the reader with passages minus SFT without; ``wrong_passage``: the reader's
    knowable-chain rate with a wrong first passage minus with none."""
    for name, share in (("sft_answered", sft_answered), ("rag_answered", rag_answered),
                        ("rag_follows", rag_follows), ("reader_follows", reader_follows)):
        if not 0 <= share <= 1:
            raise ValueError(f"{name} must be a share in [0, 1], got {share!r}")
    if sft_answered < 0.5:
        sft = ("Shown passages it was never trained with, the SFT model answers the question in "
               f"only {sft_answered:.0%} of cases even with the perfect passages: to a model "
               "trained on `<bos> prompt`, a prompt that starts with fact sentences is a "
               "pre-training document, and it continues it or stops. ")
    else:
        sft = (f"The SFT model answers the question in {sft_answered:.0%} of cases with the "
               "oracle passages. ")
    if rag_follows < 0.1:
        rag = (f"SFT + RAG has learned the format (it answers {rag_answered:.0%} of them) but "
               "not to read: with the first fact swapped it writes the passage's entity in "
               f"{rag_follows:.0%} of answers, and the perfect passages change its rare-fact "
               f"hallucination rate by {rag_oracle:+.3f}. Every passage it was trained on stated "
               "a fact it already knew, so ignoring them cost its loss nothing. ")
    else:
        rag = f"SFT + RAG writes the passage's entity in {rag_follows:.0%} of the swapped answers. "
    reader = ("The reader, trained where passage and memory disagree, writes the swapped "
              f"passage's entity in {reader_follows:.0%} of those answers (per seed: "
              + ", ".join(f"{x:.0%}" for x in reader_per_seed)
              + "); the perfect passages change its rare-fact hallucination rate by "
              f"{reader_oracle:+.3f}, and against the SFT model without any passages: "
              + said(reader_vs_sft, "the reader with passages", "SFT without", RATE,
                     exploratory=True) + ". ")
    if wrong_passage.low > 0:
        wrong = ("The same reading makes it believe a wrong passage: on knowable chains a wrong "
                 f"first fact raises its rate by {wrong_passage:+.3f}. ")
    else:
        wrong = f"A wrong first fact changes its knowable-chain rate by {wrong_passage:+.3f}. "
    only_retrained = reader_oracle.high < 0 and rag_oracle.high >= 0 and sft_answered < 0.5
    return sft + rag + reader + wrong + (
        "Retrieval lowered hallucination here only in a model retrained to read — not as the "
        "purely inference-time step 001 describes." if only_retrained else "")


def hallucination_claims(table: ClaimTable, *, hard: str, hot: Interval,
                         calibration: Mapping[str, float], drift: Interval, returned: Interval,
                         medians: Sequence[float], gain_offset: int, gain: float,
                         dpo_vs_sft: Interval, rlvr_vs_dpo: Interval,
                         rag: Sequence[tuple[str, str, Interval, float]], prompt_tokens: int,
                         max_positions: int, hybrid: Interval, inference_only: Interval,
                         reader_vs_sft: Interval, top1_vs_oracle: Interval) -> ClaimTable:
    """001 Part 3 §2–3's claims on hallucination and RAG, each beside what the lab measured, added
    to ``table`` in the document's order. The Intervals are differences a − b of the hallucination
    rate on the ``hard`` split (``hot``: τ = 1.5 − greedy; ``drift``, ``returned``: the shares of
    answers that drift on or return after a forced wrong entity); ``calibration``: SFT's
    "mean_conf_wrong", "confident_wrong" and "mean_conf_right"; ``rag``: (model, passages, Δ Hall,
    ratio of the rates) per row; ``prompt_tokens``: the longest augmented prompt with ``<bos>`` and
    the answer budget."""
    table.check_sign("decoding rules 'affect Hall … even though π is unchanged': Hall(τ = 1.5) − "
                     "Hall(greedy), SFT", hot, stated="≠ 0",
                     note=said(hot, "τ = 1.5", "greedy", "SFT's Hall"))
    conf = calibration["mean_conf_wrong"]
    table.check("a hallucination is a false claim 'assigned high probability': mean confidence of "
                "SFT's wrong answers", stated="high (> 0.5)", computed=round(conf, 3),
                agrees=conf > 0.5, note=f"{calibration['confident_wrong']:.2f} of them above 0.5; "
                f"right answers {calibration['mean_conf_right']:.2f}")
    apart = drift.low > returned.high
    table.check("a deviation 'propagates rather than being rapidly corrected': after a forced "
                "wrong entity, coherent drift − return to the gold path", stated="> 0",
                computed=f"{drift.estimate:.3f} vs {returned.estimate:.3f}", agrees=apart,
                note="drift's interval above return's" if apart else "the intervals overlap")
    table.check("'near-unit singular values': median singular value of each block's Jacobian, SFT",
                stated="≈ 1", computed=", ".join(f"{m:.2f}" for m in medians),
                agrees=all(0.5 < m < 2 for m in medians),
                note="agrees when every block's median lies in (0.5, 2)")
    table.check("'approximately neutral propagation': largest relative gain of "
                f"∂h(L, t+{gain_offset})/∂h(0, t)", stated="≈ 1 (neither amplified nor suppressed)",
                computed=round(gain, 3), agrees=0.5 < gain < 2, note="agrees within (0.5, 2)")
    table.check_sign("preference alignment 'reduce[s] hallucination indirectly': Hall(DPO) − "
                     f"Hall(SFT), {hard}", dpo_vs_sft, stated="< 0",
                     note=said(dpo_vs_sft, "DPO", "SFT", "Hall"))
    table.check_sign("RLVR's verifiable reward 'more explicitly suppress[es]' it: Hall(RLVR) − "
                     f"Hall(DPO), {hard} (001 compares with RLHF, which chapter 9 tests; here the "
                     "comparator is DPO)", rlvr_vs_dpo, stated="< 0",
                     note=said(rlvr_vs_dpo, "RLVR", "DPO", "Hall"))
    for model, passages, d, ratio in rag:
        table.check(f"'Hall_RAG ≪ Hall', {model} with {passages} passages, {hard}",
                    stated="≪ (ratio ≤ 0.5)", computed=f"Δ {d:+.3f}; ratio {ratio:.2f}",
                    agrees=d.high < 0 and ratio <= 0.5,
                    note=said(d, "with passages", "without", "Hall",
                              exploratory=passages != "oracle"))
    table.check("eq. (11): x′ = [z_1 : … : z_m] concat x with t′ ≤ Δ: the longest augmented prompt "
                "(tokens, with <bos> and the answer budget) against the model's positions",
                stated=f"≤ {max_positions}", computed=prompt_tokens,
                agrees=prompt_tokens <= max_positions,
                note="rag_prompt puts the passages first, best first, then the prompt")
    table.check_sign("'hybrid search (dense + sparse), further constraining drift': Hall(fused top "
                     f"4) − Hall(BM25 top 4), reader, {hard}", hybrid, stated="< 0",
                     note=said(hybrid, "fused top 4", "BM25 top 4", "Hall"))
    table.check("RAG is 'purely inference-time … no retraining': a model never trained with "
                "passages gains from perfect ones", stated="Hall falls",
                computed=format(inference_only, "+.3f"), agrees=inference_only.high < 0,
                note=f"the reader − SFT, with the same passages: {reader_vs_sft:+.3f}")
    table.check_sign("'effectiveness depends on retriever quality': Hall(BM25 top 1) − "
                     "Hall(oracle), SFT + RAG reader", top1_vs_oracle, stated="> 0",
                     note=said(top1_vs_oracle, "BM25 top 1", "oracle", "Hall"))
    return table
