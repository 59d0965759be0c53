"""Dead ends: a wrong first step shows k tokens later (or never), its verifier, and retry data."""

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab import recipes
from halluc_lab.training.data import IGNORE, encode_document
from halluc_lab.device import setup
from halluc_lab.evaluation.scoring import score_answers
from halluc_lab.stages.sft import SFT, BackspaceConfig, retry_demonstration
from halluc_lab.tasks import ABSTAINED, Arithmetic, DeadEnds, DeadEndsConfig, Example, make_task
from halluc_lab.tasks.base import completion_symbols
from halluc_lab.tasks.dead_ends import DOC_OVERHEAD, fit_tokens

REVEALS = (1, 2, 4)


L = 5  # the answer's nodes after the centre


def task_of(reveal: int | None, **kw) -> DeadEnds:
    return DeadEnds(DeadEndsConfig(reveal=reveal, length=L, n_nodes=24, **kw))


def arms(task: DeadEnds, prompt: str) -> list[list[str]]:
    """Each arm of a prompt's graph, from the centre to its leaf."""
    edges, centre, _ = task.parse(prompt)
    child = dict(edges - {e for e in edges if e[0] == centre})
    out = []
    for u, v in sorted(e for e in edges if e[0] == centre):
        arm = [u, v]
        while arm[-1] in child:
            arm.append(child[arm[-1]])
        out.append(arm)
    return out


# -- the generator: when a wrong step shows ---------------------------------------------
@pytest.mark.parametrize("k", REVEALS)
def test_a_wrong_first_node_meets_its_dead_end_exactly_k_tokens_later(k):
    task = task_of(k, degree=3)
    for ex in task.examples("train", 50, seed=0) + task.examples("heldout", 50, seed=0):
        gold = ex.completion.split()
        _, centre, goal = task.parse(ex.prompt)
        assert len(gold) == L + 1 and gold[0] == centre and gold[-1] == goal  # the goal is named
        wrong_arms = [a for a in arms(task, ex.prompt) if a[1] != gold[1]]
        assert len(wrong_arms) == 2 and all(len(a) == k + 2 for a in wrong_arms)
        for arm in wrong_arms:
            shown = [task.dead_end(ex.prompt, " ".join(arm[:2 + t])) for t in range(k + 1)]
            assert shown == [False] * k + [True]  # t tokens after the wrong node; certain at t = k
        prefixes = [" ".join(gold[:i]) for i in range(1, len(gold) + 1)]
        assert not any(task.dead_end(ex.prompt, p) for p in prefixes)


def test_the_answer_and_its_backward_chain_are_as_long_whatever_k():
    for reveal in (*REVEALS, None):
        task = task_of(reveal)
        for ex in task.examples("train", 20, seed=4):
            assert len(ex.completion.split()) == L + 1
            goal_arm = next(a for a in arms(task, ex.prompt) if a[1] == ex.completion.split()[1])
            assert len(goal_arm) == (L + 1 if reveal else L + 2)  # centre included; never: one past


def test_never_walks_a_wrong_arm_to_the_answers_end_without_a_dead_end():
    task = task_of(None)
    for ex in task.examples("train", 50, seed=1):
        gold = ex.completion.split()
        _, centre, goal = task.parse(ex.prompt)
        assert len(gold) == 1 + L and goal not in gold  # the goal: the leaf one past the answer
        for arm in arms(task, ex.prompt):
            assert len(arm) == 1 + L + 1
            assert (arm[-1] == goal) == (arm[1] == gold[1])
            prefixes = [" ".join(arm[:i]) for i in range(1, len(gold) + 1)]
            assert not any(task.dead_end(ex.prompt, p) for p in prefixes)


@pytest.mark.parametrize("degree", (2, 4))
def test_a_first_step_without_search_is_right_about_one_time_in_degree(degree):
    task = DeadEnds(DeadEndsConfig(degree=degree, reveal=2, length=L, n_nodes=40))
    exs = task.examples("train", 2000, seed=0)
    first_listed = [next(v for u, v in (e.split() for e in ex.prompt.split("/")[0].split(","))
                         if u == ex.completion.split()[0]) for ex in exs]
    smallest = [min(a[1] for a in arms(task, ex.prompt)) for ex in exs]  # a guess by label
    for guess in (first_listed, smallest):
        rate = sum(g == ex.completion.split()[1] for g, ex in zip(guess, exs)) / len(exs)
        assert abs(rate - 1 / degree) < 0.05


# -- the verifier: right, wrong, abstained -----------------------------------------------
@pytest.mark.parametrize("k", (*REVEALS, None))
def test_the_verifier_scores_right_wrong_and_abstained(k):
    task = task_of(k)
    ex = task.examples("heldout", 1, seed=3)[0]
    gold = ex.completion.split()
    wrong = next(a for a in arms(task, ex.prompt) if a[1] != gold[1])[:len(gold)]
    answers = [ex.completion, " ".join(wrong), f"{gold[0]} <abstain>",
               " ".join([*wrong[:2], "<abstain>"]), "<abstain> <eos>"]
    assert score_answers(task, [ex.prompt] * 5, answers).outcomes == (
        "correct", "wrong", "abstained", "wrong", "abstained")
    assert task.reward([ex.prompt] * 3, answers[:3], wrong_reward=-3.0) == [1.0, -3.0, 0.0]
    claims = task.claims(ex.prompt, answers[2])
    assert [c.status for c in claims] == ["supported", ABSTAINED] and not claims[-1].correct
    assert [c.status for c in task.claims(ex.prompt, answers[1])] == ["supported"] * len(wrong)


@pytest.mark.parametrize("k", (*REVEALS, None))
def test_the_models_own_check_passes_a_walk_from_the_centre_to_the_goal_and_nothing_else(k):
    task = task_of(k)
    for ex in task.examples("heldout", 20, seed=5):
        gold = ex.completion.split()
        edges, centre, goal = task.parse(ex.prompt)
        wrong = next(a for a in arms(task, ex.prompt) if a[1] != gold[1])[:len(gold)]
        assert task.reaches_goal(ex.prompt, ex.completion)
        assert task.reaches_goal(ex.prompt, f"{ex.completion} <eos> 3 3")
        assert not task.reaches_goal(ex.prompt, " ".join(wrong))
        assert not task.reaches_goal(ex.prompt, " ".join(gold[:-1]))  # stopped short
        if k is not None:
            assert task.reaches_goal(ex.prompt, task.retry_completion(ex, random.Random(0)))
            jump = [centre, *gold[2:], goal]  # the goal last, but an edge skipped
            assert not task.reaches_goal(ex.prompt, " ".join(jump[:len(gold)]))
        # the check knows no gold answer: a walk from the centre ending at the goal is the gold one
        assert task.reward([ex.prompt], [ex.completion]) == [1.0]


def test_config_rejects_what_it_cannot_build_with_named_errors():
    for kw, match in (({"degree": 1}, "degree must be"), ({"reveal": 0}, "reveal must be"),
                      ({"reveal": 5}, r"reveal must be an int in \[1, 4\]"),
                      ({"reveal": 3, "length": 3}, r"reveal must be an int in \[1, 2\]"),
                      ({"length": 1}, "length must be an int >= 2"),
                      ({"reveal": None, "retry_fraction": 0.5}, "retry_fraction must be 0"),
                      ({"retry_fraction": 1.0}, r"retry_fraction must be in \[0, 1\)"),
                      ({"retry_fraction": float("nan")}, "retry_fraction must be"),
                      ({"heldout_fraction": 0.0}, "heldout_fraction must be"),
                      ({"n_nodes": 8}, r"n_nodes must be an int >= 1 \+ the goal's arm \+ "
                                       r"\(degree - 1\) \* a wrong arm = 9"),
                      ({"reveal": None, "n_nodes": 12}, r"= 13, got 12"),
                      ({"pretrain_tokens": 0}, "pretrain_tokens must be")):
        with pytest.raises(ValueError, match=match):
            DeadEndsConfig(**kw)
    DeadEndsConfig(n_nodes=9)
    DeadEndsConfig(reveal=None, n_nodes=13)
    with pytest.raises(TypeError, match="DeadEndsConfig"):
        DeadEnds(Arithmetic().config)
    assert isinstance(make_task(DeadEndsConfig()), DeadEnds)


# -- retry data --------------------------------------------------------------------------
@pytest.mark.parametrize("k", REVEALS)
def test_the_backspaces_erase_exactly_the_wrong_arm_and_leave_the_gold_path(k):
    task, rng = task_of(k, degree=3), random.Random(0)
    for ex in task.examples("train", 100, seed=2):
        retry = task.retry_completion(ex, rng).split()
        n = retry.count("<bksp>")
        first = retry.index("<bksp>")
        wrong = retry[:first]
        assert wrong in [a for a in arms(task, ex.prompt) if a[1] != ex.completion.split()[1]]
        assert n == len(wrong) - 1 == k + 1  # back to the centre
        assert retry[first:first + n] == ["<bksp>"] * n
        assert task.dead_end(ex.prompt, wrong)  # taken back where the error shows, not before
        assert completion_symbols(retry) == ex.completion.split()
        assert task.reward([ex.prompt], [" ".join(retry)]) == [1.0]
    with pytest.raises(ValueError, match="reveal must be an int"):
        task_of(None).retry_completion(task_of(None).examples("train", 1, seed=0)[0], rng)


def test_a_retry_corpus_and_its_clean_control_hold_the_same_tokens_and_graphs():
    retry = task_of(2, retry_fraction=0.5, pretrain_tokens=20_000)
    clean = task_of(2, pretrain_tokens=20_000)
    tok = retry.tokenizer()
    docs = {"retry": retry.pretraining_documents(seed=0),
            "clean": clean.pretraining_documents(seed=0)}
    for d in docs.values():
        assert sum(len(encode_document(tok, x).ids) for x in d) == 20_000
    retried = ["<bksp>" in d for d in docs["retry"]]
    assert 0.4 < sum(retried) / len(retried) < 0.6
    assert len(docs["clean"]) > len(docs["retry"])  # retry documents are longer
    prompts = [d.split("=")[0] for d in docs["retry"][:-2]]
    assert prompts == [d.split("=")[0] for d in docs["clean"][:len(prompts)]]  # same graphs, order
    for d in docs["retry"][:-2]:  # a train example each (bar the last two), taken back if retried
        prompt, answer = d.split("= ")
        assert " ".join(completion_symbols(answer)) == retry.gold(prompt + "=")
    assert retry.pretraining_documents(seed=0) == docs["retry"]
    assert retry.pretraining_documents(seed=1) != docs["retry"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(4, 20), min_size=1, max_size=30), st.integers(DOC_OVERHEAD + 1, 300))
def test_fit_tokens_gives_exactly_the_budget(lengths, budget):
    docs = [" ".join(str(i) for i in range(n)) for n in lengths]
    out = fit_tokens(itertools.cycle(docs), budget)
    assert sum(len(d.split()) + DOC_OVERHEAD for d in out) == budget
    supply = itertools.cycle(docs)
    assert all(d for d in out) and all(a == next(supply) for a in out[:-2])  # only the last two cut


def test_fit_tokens_says_when_the_documents_run_out():
    with pytest.raises(ValueError, match="ran out before 100 tokens"):
        fit_tokens(iter(["a b c"] * 3), 100)
    with pytest.raises(ValueError, match="budget must be"):
        fit_tokens(iter(["a b c"]), 2)


def test_retry_demonstrations_for_sft_target_the_detour_or_leave_the_wrong_nodes_out():
    task = task_of(2)
    tok = task.tokenizer()
    ex = task.examples("train", 1, seed=0)[0]
    seq = retry_demonstration(tok, task, ex, random.Random(0))
    text = tok.decode(seq.ids)
    assert completion_symbols(text.split("=")[1]) == ex.completion.split()
    prompt_len = 1 + len(ex.prompt.split())
    assert seq.labels[:prompt_len] == (IGNORE,) * prompt_len
    assert seq.labels[prompt_len:] == seq.ids[prompt_len:]
    masked = retry_demonstration(tok, task, ex, random.Random(0), wrong_targets=False)
    assert masked.ids == seq.ids
    dropped = [i for i, (a, b) in enumerate(zip(seq.labels, masked.labels)) if a != b]
    assert dropped == list(range(prompt_len + 1, prompt_len + 4))  # 3 wrong nodes after the centre
    with pytest.raises(TypeError, match="DeadEnds"):
        retry_demonstration(tok, Arithmetic(), Example("1 + 1 =", "2"), random.Random(0))


# -- where <bksp> enters: the registry's arms (the fair test's §3) -------------------------
@pytest.mark.parametrize("scale", recipes.SCALES)
def test_the_arms_differ_only_where_the_retry_data_enters(scale):
    for k in ("k1", "k2", "k4"):
        a, b, c = (recipes.get(f"dead_ends_{k}{n}", scale)
                   for n in ("_retry-sft-retry", "-sft-retry", "-sft-clean"))
        # (a) - (b): the pre-training corpus alone, token-matched
        assert a.parent.task == dataclasses.replace(b.parent.task, retry_fraction=0.5)
        assert (a.parent.train, a.stage, a.train) == (b.parent.train, b.stage, b.train)
        # (b) - (c): the SFT data alone, from one pre-trained model
        assert b.parent == c.parent and b.train == c.train
        assert b.stage == dataclasses.replace(c.stage, retry=0.5) and c.stage.retry == 0
        allowed, masked = (recipes.get(f"dead_ends_{k}_retry-{n}", scale)
                           for n in ("rlvr-retry", "rlvr-retry-masked"))
        assert allowed.parent == masked.parent == a  # RL from (a), <bksp> allowed and masked
        assert allowed.stage.config.allow_bksp and not masked.stage.config.allow_bksp
        assert masked.stage == dataclasses.replace(allowed.stage, config=dataclasses.replace(
            allowed.stage.config, allow_bksp=False)) and masked.train == allowed.train
        assert recipes.get(f"dead_ends_{k}-rlvr-retry", scale).parent == b  # RL from (b)
        from_clean = recipes.get(f"dead_ends_{k}-rlvr-clean-bksp", scale)  # RL from (c)
        assert from_clean.parent == c and from_clean.stage == allowed.stage
    never = recipes.get("dead_ends_never-rlvr-clean-bksp", scale)
    assert never.parent == recipes.get("dead_ends_never-sft-clean", scale)
    for k in ("k1", "k2", "k4", "never"):  # RLVR without the key: clean SFT's start, <bksp> masked
        masked = recipes.get(f"dead_ends_{k}-rlvr-clean-masked", scale)
        assert masked.parent == recipes.get(f"dead_ends_{k}-sft-clean", scale)
        assert masked.stage.config.allow_bksp is False
        assert masked.train == recipes.get(f"dead_ends_{k}-rlvr-clean-bksp", scale).train
    assert not any(n.startswith(("dead_ends_never-sft-retry", "dead_ends_never_retry"))
                   for n in recipes.NAMES)  # no dead end is written: nothing to take back


def test_the_full_scale_pretraining_rate_is_the_dead_ends_worlds_own():
    assert recipes.get("dead_ends_k2-pretrain", "full").train.lr == 1e-3  # the pilot's
    assert recipes.get("path_star-pretrain", "full").train.lr == 2e-3  # every other task's


def test_sft_retry_gives_half_its_examples_as_retry_demonstrations_and_clean_sft_none():
    retry, clean = (recipes.get(f"dead_ends_k2-{s}", "smoke") for s in ("sft-retry", "sft-clean"))
    tok = make_task(retry.task).tokenizer()
    rows = recipes.training_rows(retry).input_ids
    examples, bksp = (rows == tok.eos_id).sum().item(), (rows == tok.bksp_id).sum().item()
    assert examples == retry.stage.n_examples and bksp % 3 == 0  # k + 1 = 3 per retry
    assert 0.4 < bksp / 3 / examples < 0.6
    assert not (recipes.training_rows(clean).input_ids == tok.bksp_id).any()
    for kw, match in (({"retry": 1.5}, r"retry must be a number in \[0, 1\]"),
                      ({"retry": True}, "retry must be a number"),
                      ({"retry": 0.5, "backspace": BackspaceConfig()}, "retry and backspace")):
        with pytest.raises(ValueError, match=match):
            SFT(n_examples=10, **kw)


def test_the_masked_arm_never_samples_a_bksp_where_the_allowed_arm_does():
    rt = setup(scale="smoke", seed=0, verbose=False)
    rates = {n: recipes.load(f"dead_ends_k2_retry-{n}", rt).history.metrics["bksp_rate"]
             for n in ("rlvr-retry", "rlvr-retry-masked")}
    assert rates["rlvr-retry-masked"] == [0.0] * len(rates["rlvr-retry-masked"])
    assert sum(rates["rlvr-retry"]) > 0  # the same start: it takes tokens back when allowed


def test_the_learning_part_is_decided_by_the_graph_not_by_the_order_its_edges_are_listed_in():
    # RL draws its prompts from the learning part and the fair test evaluates outside it: a graph
    # listed in another edge order must not cross over (k = 1's small graphs did, when the part
    # hashed the prompt's text).
    task = DeadEnds(DeadEndsConfig(reveal=1, length=5, n_nodes=14))
    rng, parts = random.Random(0), []
    for ex in task.examples("heldout", 400, seed=1):
        body, _, query = ex.prompt.partition(" / ")
        edges = body.split(" , ")
        rng.shuffle(edges)
        reordered = " , ".join(edges) + " / " + query
        assert task.learning_part(reordered) == task.learning_part(ex.prompt)
        parts.append(task.learning_part(ex.prompt))
    assert 0.4 < sum(parts) / len(parts) < 0.6  # about half; 400 draws: sd 0.025
