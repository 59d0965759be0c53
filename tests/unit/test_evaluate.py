"""Evaluation: distinct evaluation sets, free running against teacher forcing, answer scoring with
abstention, mistakes, forced errors, what <bksp> took back, and fact recall (halluc_lab.evaluation.evaluate and
the answer judging of halluc_lab.evaluation.scoring it re-exports)."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.training.data import encode_example, pad
from halluc_lab.evaluation.evaluate import (ABSTAINED, CORRECT, WRONG, AnswerScores, BackspaceUse, TeacherForced, answer_budget,
                                 backspace_use, complete, distinct_examples, distinct_examples_by_length, erasures,
                                 fact_recall, forced_error, free_run, lam_for_target, mean_nll, mistakes,
                                 mistakes_after_first, next_token_probs, score_answers, teacher_forced)
from halluc_lab.evaluation.evaluate import answer_tokens, best_of_n_matched, oracle_check, pick_first
from halluc_lab.training.losses import causal_lm_loss
from halluc_lab.generation.sampling import ConflictingSamplingParams, SamplingParams
from halluc_lab.tasks import (SUPPORTED, Arithmetic, ArithmeticConfig, Example, KBWalk, KBWalkConfig, PathStar,
                              PathStarConfig)
from halluc_lab.tasks import DeadEnds, DeadEndsConfig
from halluc_lab.tasks.base import split_of
from tests.unit._tiny_lm import small_transformer

TASK = Arithmetic(ArithmeticConfig(max_digits=3))
TOK = TASK.tokenizer()
KB = KBWalk(KBWalkConfig(n_entities=12, n_relations=3, p_missing=0.2, common_count=5))


def _missing_pair(task: KBWalk) -> tuple[str, str]:
    return next((e, r) for e in task.entities for r in task.relations if (e, r) not in task.facts)


# -- evaluation sets of distinct prompts ---------------------------------------------------------------------
def _first_distinct(exs):
    seen = {}
    for e in exs:
        seen.setdefault(e.prompt, e)
    return list(seen.values())


def test_distinct_examples_keep_the_first_draws_in_order_and_add_new_ones():
    drawn = TASK.examples("heldout", 60, seed=3)
    got = distinct_examples(TASK, "heldout", 60, seed=3)
    assert len(got) == 60 and len({e.prompt for e in got}) == 60
    assert got[:len(_first_distinct(drawn))] == _first_distinct(drawn)
    assert distinct_examples(TASK, "heldout", 60, seed=3) == got  # deterministic


def test_a_small_space_gives_all_its_problems_and_no_more():
    # Every held-out single-digit sum: operands 0..9 whose sum is below 10, on the held-out side of the hash.
    every = {TASK.example(a, b).prompt for a in range(10) for b in range(10 - a) if TASK.split(a, b) == "heldout"}
    got = distinct_examples(TASK, "heldout", 1000, seed=0, answer_digits=1)
    assert {e.prompt for e in got} == every and len(got) == len(every) < 1000
    one_hop = {f"{e} {r} =" for e in KB.entities for r in KB.relations
               if split_of(f"{e} {r}", KB.config.heldout_fraction, salt=KB.config.world_seed) == "heldout"}
    assert {e.prompt for e in distinct_examples(KB, "heldout", 500, seed=1, hops=1)} == one_hop


def test_distinct_examples_by_length_fill_each_length_from_its_own_draws():
    by_len = distinct_examples_by_length(KB, "heldout", 40, seed=2)
    assert list(by_len) == list(KB.examples_by_length("heldout", 1, seed=0))
    for k, exs in by_len.items():
        assert len({e.prompt for e in exs}) == len(exs) <= 40
        assert all(len(e.prompt.split()) == k + 2 for e in exs)
        assert exs[:len(_first_distinct(KB.examples("heldout", 40, seed=2, hops=k)))] == \
            _first_distinct(KB.examples("heldout", 40, seed=2, hops=k))
    assert len(by_len[1]) < 40 and len(by_len[3]) == 40  # 12 × 3 one-hop chains, 20% held out; 12 × 27 three-hop


def test_bad_evaluation_set_arguments_are_rejected():
    for kw in (dict(n=0), dict(seed=-1), dict(max_rounds=0), dict(n=True)):
        args = dict(n=5, seed=0, max_rounds=3) | kw
        with pytest.raises(ValueError, match=next(iter(kw))):
            distinct_examples(TASK, "heldout", args["n"], args["seed"], max_rounds=args["max_rounds"])


# -- free running against teacher forcing -------------------------------------------------------------
def test_greedy_completion_is_what_teacher_forcing_predicts():
    model = small_transformer(TOK.vocab_size, seed=2)
    prompts = [e.prompt for e in TASK.examples("train", 6, seed=2)]
    outs = complete(model, TOK, prompts, 5)
    for p, o in zip(prompts, outs):
        words = o.split()
        body = words[:-1] if words[-1] == "<eos>" else words
        tf = teacher_forced(model, TOK, [Example(p, " ".join(body))])
        n = len(words)  # the generated tokens, <eos> included when it was generated
        assert all(tf.correct[0][:n])
        assert all(lp <= 0 for lp in tf.logprobs[0])


def test_teacher_forced_summaries_follow_their_definitions():
    tf = TeacherForced(correct=[[True, False], [True, True, True]],
                       logprobs=[[math.log(0.5), math.log(0.25)], [0.0, math.log(0.5), 0.0]])
    assert tf.token_accuracy == pytest.approx(4 / 5)
    assert tf.all_correct == [False, True]
    assert tf.gold_probs == pytest.approx([0.125, 0.5])
    assert tf.token_error == pytest.approx(1 - (0.5 + 0.25 + 1 + 0.5 + 1) / 5)


def test_teacher_forcing_in_chunks_equals_one_batch():
    model = small_transformer(TOK.vocab_size, seed=3)
    exs = TASK.examples("heldout", 7, seed=0)
    one, chunked = teacher_forced(model, TOK, exs), teacher_forced(model, TOK, exs, chunk=3)
    assert one.correct == chunked.correct
    for a, b in zip(one.logprobs, chunked.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert [len(c) for c in one.correct] == [len(e.completion.split()) + 1 for e in exs]  # + <eos>


def test_free_run_gives_each_answer_room_for_a_detour_before_every_symbol():
    exs = [Example("1 + 1 =", "2"), Example("9 9 + 9 9 =", "1 9 8")]
    assert answer_budget(exs) == 2 * 3 + 4
    model = small_transformer(TOK.vocab_size, seed=4)
    assert free_run(model, TOK, exs) == complete(model, TOK, [e.prompt for e in exs], 10)
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    assert (free_run(model, TOK, exs, sampling=SamplingParams(), generator=g())
            == complete(model, TOK, [e.prompt for e in exs], 10, sampling=SamplingParams(),
                        generator=g()))


def test_a_temperature_given_to_complete_is_sampled_at_and_greedy_with_one_is_refused():
    model = small_transformer(TOK.vocab_size, seed=4)
    prompts = [e.prompt for e in TASK.examples("heldout", 12, seed=2)]
    greedy = complete(model, TOK, prompts, 6)
    hot = [complete(model, TOK, prompts, 6, sampling=SamplingParams(temperature=5.0),
                    generator=torch.Generator().manual_seed(s)) for s in range(2)]
    assert hot[0] != greedy and hot[0] != hot[1]  # two generators, two samples: not the argmax
    with pytest.raises(ConflictingSamplingParams, match="temperature=5.0"):
        complete(model, TOK, prompts, 6, sampling=SamplingParams(greedy=True, temperature=5.0))


def test_mean_nll_is_the_mean_loss_over_the_target_tokens_of_one_padded_batch():
    model = small_transformer(TOK.vocab_size, seed=6)
    exs = TASK.examples("train", 9, seed=1)
    for only in (True, False):
        b = pad([encode_example(TOK, e, only) for e in exs], TOK.pad_id)
        with torch.no_grad():
            want = float(causal_lm_loss(model(b.input_ids), b.labels))
        assert mean_nll(model, TOK, exs, completion_only=only) == pytest.approx(want, rel=1e-5)
        assert mean_nll(model, TOK, exs, completion_only=only, chunk=4) == pytest.approx(want, rel=1e-5)


def test_next_token_probs_are_those_of_each_prompt_alone():
    model = small_transformer(TOK.vocab_size, seed=7)
    prompts = ["1 2 + 3 =", "4 ="]
    probs = next_token_probs(model, TOK, prompts)
    assert probs.shape == (2, TOK.vocab_size)
    for row, p in zip(probs, prompts):
        with torch.no_grad():
            alone = torch.softmax(model(torch.tensor([[TOK.bos_id, *TOK.encode(p)]]))[0, -1], -1)
        assert torch.allclose(row, alone, atol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="prompts"):
        next_token_probs(model, TOK, [])


# -- examples grouped by answer length (each task's own measure) ------------------------------------------
def test_each_task_groups_heldout_examples_by_its_answer_length():
    by_hops = KB.examples_by_length("heldout", 5, seed=0)
    assert list(by_hops) == [1, 2, 3]
    assert all(len(e.prompt.split()) == k + 2 for k, exs in by_hops.items() for e in exs)
    assert by_hops[2] == KB.examples("heldout", 5, seed=0, hops=2)
    arith = Arithmetic(ArithmeticConfig(min_digits=2, max_digits=3))
    by_digits = arith.examples_by_length("heldout", 4, seed=1)
    assert list(by_digits) == [2, 3, 4]
    assert all(len(e.completion.split()) == k and len(exs) == 4 for k, exs in by_digits.items() for e in exs)
    ps = PathStar(PathStarConfig(degree=2, path_length=3, n_nodes=8))
    (length, exs), = ps.examples_by_length("train", 3, seed=2).items()
    assert length == 3 and all(len(e.completion.split()) == 3 for e in exs)


# -- answers scored with an abstain option --------------------------------------------------------------
def test_each_answer_is_correct_wrong_or_abstained():
    s = score_answers(TASK, ["4 7 + 5 ="] * 5, ["5 2", "5 1", "<abstain>", "5 1 <bksp> 2 <eos>", "5 <abstain>"])
    assert s.outcomes == (CORRECT, WRONG, ABSTAINED, CORRECT, ABSTAINED)
    assert s.prompts == ("4 7 + 5 =",) * 5


def test_abstaining_is_correct_where_the_gold_answer_abstains():
    e, r = _missing_pair(KB)
    prompt = f"{e} {r} ="
    assert KB.gold(prompt) == f"{e} {r} <abstain>"
    made_up = next(x for x in KB.entities if x != e)
    s = score_answers(KB, [prompt] * 3, [f"{e} {r} <abstain> <eos>", f"{e} {r} {made_up}", "<abstain>"])
    assert s.outcomes == (CORRECT, WRONG, ABSTAINED)  # exactly the gold abstention; a made-up fact; a bare one


def test_abstaining_on_an_answerable_chain_is_an_abstention_not_a_hallucination():
    (e, r), x = next(iter(KB.facts.items()))
    s = score_answers(KB, [f"{e} {r} ="] * 2, [f"{e} {r} <abstain>", f"{e} {r} {x}"])
    assert s.outcomes == (ABSTAINED, CORRECT)
    assert s.hallucination_rate == 0.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([CORRECT, WRONG, ABSTAINED]), min_size=1, max_size=30))
def test_rates_sum_to_one_and_hallucination_is_the_share_of_wrong_answers(outcomes):
    s = AnswerScores(tuple(str(i) for i in range(len(outcomes))), tuple(outcomes))
    assert s.correct_rate + s.wrong_rate + s.abstain_rate == pytest.approx(1.0)
    assert s.hallucination_rate == outcomes.count(WRONG) / len(outcomes)
    lam = 1.7
    assert s.penalised_score(lam) == pytest.approx(sum(s.rewards(lam)) / s.n)


def test_penalised_score_by_hand():
    s = AnswerScores(("p",) * 6, (CORRECT, CORRECT, CORRECT, WRONG, WRONG, ABSTAINED))
    lam = lam_for_target(0.6)  # 0.6 / 0.4 = 1.5
    assert lam == pytest.approx(1.5)
    assert s.penalised_score(lam) == pytest.approx((3 - 1.5 * 2) / 6)
    assert s.rewards(lam) == pytest.approx((1.0, 1.0, 1.0, -1.5, -1.5, 0.0))
    assert s.penalised_score(0) == pytest.approx(0.5)  # λ = 0: plain accuracy


@pytest.mark.parametrize("t", [0.0, 0.25, 0.5, 0.9])
def test_answering_pays_exactly_when_p_correct_exceeds_the_target(t):
    lam = lam_for_target(t)
    for p in (t - 0.05, t + 0.05):
        if 0 <= p <= 1:
            assert (p - lam * (1 - p) > 0) == (p > t)
    assert t - lam * (1 - t) == pytest.approx(0.0)


def test_answer_outcomes_agree_with_the_tasks_reward_at_plus_one_zero_minus_lambda():
    exs = KB.examples("heldout", 30, seed=0)
    rng = random.Random(0)
    comps = [rng.choice([e.completion, "<abstain>", " ".join(e.completion.split()[:-1] + [KB.entities[0]])])
             for e in exs]
    prompts = [e.prompt for e in exs]
    lam = lam_for_target(0.75)
    want = KB.reward(prompts, comps, correct_reward=1.0, abstain_reward=0.0, wrong_reward=-lam)
    assert list(score_answers(KB, prompts, comps).rewards(lam)) == want


def test_bad_scoring_input_is_rejected():
    with pytest.raises(ValueError, match="same length"):
        score_answers(TASK, ["1 + 1 ="], [])
    with pytest.raises(ValueError, match="at least one"):
        score_answers(TASK, [], [])
    s = score_answers(TASK, ["1 + 1 ="], ["2"])
    for lam in (-0.1, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="lam"):
            s.penalised_score(lam)
        with pytest.raises(ValueError, match="lam"):
            s.rewards(lam)
    for t in (1.0, -0.1, math.nan, 2, True):
        with pytest.raises(ValueError, match="t must be"):
            lam_for_target(t)
    with pytest.raises(ValueError, match="outcomes must be in"):
        AnswerScores(("p",), ("maybe",))
    with pytest.raises(ValueError, match="one length"):
        AnswerScores(("p", "q"), (CORRECT,))
    with pytest.raises(ValueError, match="outcome must be one of"):
        s.count("right")


# -- mistakes, forced errors, erasures --------------------------------------------------------------------
def test_mistakes_count_wrong_extra_and_missing_steps():
    prompts = ["4 7 + 5 ="] * 5  # gold: 5 2
    assert mistakes(TASK, prompts, ["5 2", "5 1", "4 1", "5", "5 2 7"]) == [0, 1, 2, 1, 1]
    with pytest.raises(ValueError, match="same length"):
        mistakes(TASK, prompts, ["5 2"])


def test_abstaining_where_the_reached_entity_has_no_fact_is_no_mistake():
    # The answer reached a wrong entity x; where x has no fact for the next relation, the expert in that
    # state would abstain too, so only the wrong step costs. Where x has a fact, abstaining costs as well.
    (e0, r1), right = next(iter(KB.facts.items()))
    x, r2 = next((x, r2) for x in KB.entities for r2 in KB.relations if x != right and (x, r2) not in KB.facts)
    y, r3 = next((y, r3) for y in KB.entities for r3 in KB.relations if y != right and (y, r3) in KB.facts)
    assert mistakes(KB, [f"{e0} {r1} {r2} ="], [f"{e0} {r1} {x} {r2} <abstain>"]) == [1]
    assert mistakes(KB, [f"{e0} {r1} {r3} ="], [f"{e0} {r1} {y} {r3} <abstain>"]) == [2]
    assert mistakes(KB, [f"{e0} {r1} {r2} ="], [KB.gold(f"{e0} {r1} {r2} =")]) == [0]


def test_only_an_abstention_can_be_warranted():
    (e0, r1), right = next(iter(KB.facts.items()))
    (claim,) = KB.claims(f"{e0} {r1} =", f"{e0} {r1} {right}")
    assert claim.status == SUPPORTED
    with pytest.raises(ValueError, match="claim must be an abstention"):
        KB.abstention_warranted(f"{e0} {r1} =", f"{e0} {r1} {right}", claim)


def test_forcing_a_wrong_symbol_through_the_engine_equals_putting_it_in_the_prompt():
    model = small_transformer(TOK.vocab_size, seed=8)
    exs = [e for e in TASK.examples("heldout", 8, seed=3) if len(e.completion.split()) >= 2]
    out = forced_error(model, TOK, TASK, exs, 1, random.Random(0))
    assert out.position == 1 and len(out.completions) == len(exs)
    for e, w, c, ctx in zip(exs, out.wrong, out.completions, out.contexts):
        gold = e.completion.split()
        assert w != gold[1] and c.split()[:2] == [gold[0], w]
        assert ctx == f"{e.prompt} {gold[0]} {w}"
    rest = complete(model, TOK, list(out.contexts), answer_budget(exs))
    assert [" ".join(c.split()[2:]) for c in out.completions] == rest
    assert out.recovered == tuple(o == CORRECT for o in score_answers(
        TASK, [e.prompt for e in exs], list(out.completions)).outcomes)
    assert out.recovery_rate == sum(out.recovered) / len(exs)
    with pytest.raises(ValueError, match="position must be <"):
        forced_error(model, TOK, TASK, [Example("1 + 1 =", "2")], 1, random.Random(0))
    with pytest.raises(ValueError, match="position must be an int"):
        forced_error(model, TOK, TASK, exs, -1, random.Random(0))


def test_erasures_say_whether_each_backspace_took_back_a_right_symbol():
    assert erasures("4 6", "4 7 <bksp> 6 <bksp> 6 <eos>") == [False, True]
    assert erasures("4 6", "<bksp> 4 6 <eos> <bksp>") == []  # nothing to erase; nothing after <eos>
    assert erasures("4 6", "5 <bksp> <bksp> 4 6") == [False]  # the second one erases nothing


def test_mistakes_after_the_first_drop_the_first_one():
    prompts = ["4 7 + 5 ="] * 4  # gold: 5 2
    assert mistakes_after_first(TASK, prompts, ["5 2", "5 1", "4 1", "4 1 7"]) == [0, 0, 1, 2]


def test_backspace_accounting_on_hand_made_answers():
    gold = "4 6"
    # 7 is wrong and erased; then right to the end: one warranted erasure, the answer ends right.
    u = backspace_use([gold], ["4 7 <bksp> 6 <eos>"])
    assert (u.wrong, u.wrong_erased, u.erasures, u.erased_wrong) == (1, 1, 1, 1)
    assert u.precision == u.recall == 1.0 and u.right_after_erasure_rate == 1.0 and u.erasing_rate == 1.0
    # A right token erased, then a wrong one and one after it (wrong too: "5 6" does not start "4 6"), kept.
    u = backspace_use([gold], ["4 <bksp> 5 6 <eos>"])
    assert (u.wrong, u.wrong_erased, u.erasures, u.erased_wrong, u.right_after_erasure) == (2, 0, 1, 0, 0)
    assert u.precision == 0.0 and u.recall == 0.0
    # A token after a wrong one is wrong when written; erasing both takes back two wrong tokens.
    u = backspace_use([gold], ["5 6 <bksp> <bksp> 4 6 <eos>"])
    assert (u.wrong, u.wrong_erased, u.erasures, u.erased_wrong, u.right_after_erasure) == (2, 2, 2, 2, 1)
    # A <bksp> at an empty answer erases nothing; tokens after <eos> are not read.
    u = backspace_use([gold], ["<bksp> 4 6 <eos> 9 <bksp>"])
    assert (u.wrong, u.erasures, u.answers_erasing) == (0, 0, 0)
    assert u.precision is None and u.recall is None  # no erasure, no wrong token: undefined, not 0 or NaN
    # Pooled over answers: sums of the counts, shares of all answers.
    u = backspace_use([gold, gold, gold], ["4 7 <bksp> 6 <eos>", "4 <bksp> 5 6 <eos>", "4 6 <eos>"])
    assert u == BackspaceUse(answers=3, wrong=3, wrong_erased=1, erasures=2, erased_wrong=1, answers_erasing=2,
                             right_after_erasure=1)
    assert u.precision == 0.5 and u.recall == pytest.approx(1 / 3)
    assert u.right_after_erasure_rate == pytest.approx(1 / 3)
    assert erasures(gold, "4 <bksp> 5 6 <bksp>") == [True, False]  # took back a right token, then a wrong one
    with pytest.raises(ValueError, match="one length"):
        backspace_use([gold], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["4", "6", "7", "<bksp>"]), max_size=12))
def test_backspace_accounting_matches_erasures_and_the_verifier(tokens):
    completion = " ".join(tokens)
    u = backspace_use(["4 6"], [completion])
    flags = erasures("4 6", completion)
    assert u.erasures == len(flags) and u.erased_wrong == flags.count(False)
    assert u.wrong_erased <= u.wrong and u.erased_wrong == u.wrong_erased  # each erasure removes one token
    ends_right = score_answers(TASK, ["4 0 + 6 ="], [completion]).outcomes[0] == CORRECT  # gold: 4 6
    assert u.right_after_erasure == int(ends_right and bool(flags))


def test_answer_indicators_pair_prompts_for_the_bootstrap():
    s = AnswerScores(("a", "b", "c"), (CORRECT, WRONG, ABSTAINED))
    assert s.indicator(WRONG) == [0.0, 1.0, 0.0]
    assert sum(map(sum, (s.indicator(o) for o in (CORRECT, WRONG, ABSTAINED)))) == s.n
    with pytest.raises(ValueError, match="outcome must be one of"):
        s.indicator("right")


# -- fact recall ---------------------------------------------------------------------------------------------
def test_fact_recall_reads_the_argmax_after_entity_and_relation():
    tok = KB.tokenizer()
    model = small_transformer(tok.vocab_size, seed=9)
    rec = fact_recall(model, tok, KB)
    assert rec.facts == tuple(sorted(KB.facts)) and rec.chance == 1 / 12
    for (e, r), ok in zip(rec.facts, rec.recalled):
        with torch.no_grad():
            pred = int(model(torch.tensor([[tok.bos_id, *tok.encode(f"{e} {r}")]]))[0, -1].argmax())
        assert ok == (tok.tokens[pred] == KB.facts[(e, r)])
    rare = [ok for ok, k in zip(rec.recalled, rec.rare) if k]
    assert rec.rare_rate == sum(rare) / len(rare)
    no_rare = KBWalk(KBWalkConfig(n_entities=12, n_relations=3, p_rare=0.0))
    with pytest.raises(ValueError, match="no rare facts"):
        fact_recall(model, no_rare.tokenizer(), no_rare).rare_rate


# -- tokens written, and what a model believes ---------------------------------------------------------------
def test_written_tokens_count_every_symbol_before_eos_but_bksp_and_pad():
    from halluc_lab.evaluation.scoring import written_tokens

    assert written_tokens(["4 7 <bksp> 6 <eos> 9 9", "5 <pad> <pad>", "<bksp> <eos>", "1 2 3"]) == 3 + 1 + 0 + 3
    assert written_tokens([]) == 0
    with pytest.raises(TypeError, match="not one string"):
        written_tokens("4 7")


def test_entity_recall_ranks_the_answer_among_the_entities_only():
    from halluc_lab.evaluation.evaluate import entity_recall

    tok = KB.tokenizer()
    model = small_transformer(tok.vocab_size, seed=4)
    facts = sorted(KB.facts)[:20]
    got = entity_recall(model, tok, KB, facts)
    probs = next_token_probs(model, tok, [f"{e} {r} = {e} {r}" for e, r in facts])
    for (e, r), hit, p in zip(facts, got, probs):
        best = max(KB.entities, key=lambda x: float(p[tok.token_id(x)]))  # the likeliest entity, not token
        assert hit == float(best == KB.facts[(e, r)])
    # The likeliest token is "=", not an entity: the likeliest *entity* decides.
    fact = facts[0]
    logits = torch.zeros(tok.vocab_size)
    logits[tok.token_id("=")], logits[tok.token_id(KB.facts[fact])] = 10.0, 5.0
    other = next(f for f in facts if KB.facts[f] != KB.facts[fact])
    assert entity_recall(_Fixed(logits), tok, KB, [fact, other]) == [1.0, 0.0]


class _Fixed(torch.nn.Module):
    """The same next-token logits at every position."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids):
        return self.logits.expand(*input_ids.shape, -1)


def test_entity_recall_refuses_no_facts_and_pairs_that_are_not_facts():
    from halluc_lab.evaluation.evaluate import entity_recall

    tok = KB.tokenizer()
    model = small_transformer(tok.vocab_size, seed=4)
    with pytest.raises(ValueError, match="at least one"):
        entity_recall(model, tok, KB, [])
    with pytest.raises(ValueError, match="must be facts of the world"):
        entity_recall(model, tok, KB, [_missing_pair(KB)])


# -- best-of-N at matched tokens --------------------------------------------------------------
DEAD = DeadEnds(DeadEndsConfig(reveal=1, length=3, n_nodes=12))


def test_answer_tokens_count_every_written_token_up_to_the_eos():
    assert answer_tokens("<bos> 0 3 <bksp> 4 <eos> <pad> 5") == 5
    assert answer_tokens("0 3 4") == 3 and answer_tokens("") == 0


def test_best_of_n_picks_the_first_sample_its_check_passes_and_the_oracle_the_first_right_one():
    ex = DEAD.examples("heldout", 1, seed=0)[0]
    gold = ex.completion.split()
    centre = gold[0]
    wrong = next(v for u, v in DEAD.parse(ex.prompt)[0] if u == centre and v != gold[1])
    short = " ".join(gold[:-1])  # a start of the gold path: neither check passes it
    group = [f"{centre} {wrong}", short, ex.completion, DEAD.retry_completion(ex, random.Random(0))]
    assert pick_first([ex.prompt], [group], DEAD.reaches_goal) == [ex.completion]
    assert pick_first([ex.prompt], [group], oracle_check(DEAD)) == [ex.completion]
    none_right = group[:2]
    assert pick_first([ex.prompt], [none_right], oracle_check(DEAD)) == [group[0]]  # the first
    with pytest.raises(ValueError, match="one non-empty list of samples per prompt"):
        pick_first([ex.prompt], [[]], DEAD.reaches_goal)
    with pytest.raises(ValueError, match="one non-empty list"):
        pick_first([ex.prompt, ex.prompt], [group], DEAD.reaches_goal)


def test_best_of_n_draws_as_many_samples_as_match_the_target_tokens():
    tok = DEAD.tokenizer()
    model = small_transformer(tok.vocab_size, seed=3)
    prompts = [e.prompt for e in DEAD.examples("heldout", 6, seed=1)]
    hot = SamplingParams(temperature=1.0)
    first = complete(model, tok, prompts, 8, sampling=hot,
                     generator=torch.Generator().manual_seed(4))
    per_sample = sum(map(answer_tokens, first)) / len(first)

    def best(target, max_n=64, seed=4):
        g = torch.Generator().manual_seed(seed)
        return best_of_n_matched(model, tok, DEAD, prompts, 8, target_tokens=target,
                                 check=DEAD.reaches_goal, generator=g, max_n=max_n)

    for target, max_n in ((3 * per_sample, 64), (100.0, 64), (100.0, 2), (0.1, 64)):
        res = best(target, max_n)
        assert res.n == min(max_n, max(1, round(target / per_sample)))
        assert res.n <= res.tokens_per_answer <= 8 * res.n  # every sample spends 1 to 8 tokens
        assert res.self_checked.prompts == res.oracle.prompts == tuple(prompts)
        assert res.oracle.count(CORRECT) >= res.self_checked.count(CORRECT)
    assert best(0.1).tokens_per_answer == per_sample  # N = 1: the first samples alone
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="target_tokens must be a finite number > 0"):
            best(bad)
    with pytest.raises(ValueError, match="max_n must be"):
        best(9.0, max_n=0)
    with pytest.raises(ValueError, match="prompts must hold"):
        best_of_n_matched(model, tok, DEAD, [], 8, target_tokens=9.0, check=DEAD.reaches_goal,
                          generator=torch.Generator())
