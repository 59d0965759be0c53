"""halluc_lab.evaluation.retrieval: kb_walk's passages, BM25 (bm25s) against the lab's reference, the dense retriever's
pooling, RRF, recall@k by hand, eq. (11)'s prompt, bad input, recall on a small world, and the SFT examples
with retrieved context (RetrievedContext)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from halluc_lab.evaluation import retrieval
from halluc_lab.foundations import lexical
from halluc_lab.evaluation.retrieval import (BM25Retriever, DenseRetriever, FusedRetriever, embed, fact_passages, rag_prompt,
                                  recall_at_k, supporting_passages)
from halluc_lab.stages.sft import RetrievedContext
from halluc_lab.tasks import Arithmetic
from halluc_lab.tasks.kb_walk import KBWalk, KBWalkConfig
from halluc_lab.model.tokenizer import ABSTAIN
from tests.unit._tiny_lm import small_transformer

# The kb_walk world of recipes.TASK_PLANS' smoke scale: 24 entities, 4 relations, 84 facts.
SMALL = KBWalkConfig(n_entities=24, n_relations=4, common_count=600, facts_per_document=7, max_hops=3)


@pytest.fixture(scope="module")
def task():
    return KBWalk(SMALL)


@pytest.fixture(scope="module")
def passages(task):
    return fact_passages(task)


@pytest.fixture(scope="module")
def model(task):
    torch.manual_seed(0)
    return small_transformer(task.tokenizer().vocab_size, seed=0)


def _prompts(task, hops):
    """Distinct knowable prompts of ``hops`` hops from both splits."""
    out = []
    for split in ("train", "heldout"):
        out += [e.prompt for e in task.examples(split, 200, seed=0, hops=hops) if task.knowable(e.prompt)]
    return sorted(set(out))


# ---------------------------------------------------------------- passages


def test_fact_passages_are_the_worlds_facts_one_sentence_each(task, passages):
    assert len(passages) == len(task.facts) == len(set(passages))
    for text, ((e, r), target) in zip(passages, task.facts.items()):
        assert text == f"{e} {r} {target} ."
    sentences = {s.strip() + " ." for d in task.pretraining_documents(seed=0) for s in d.split(" .") if s.strip()}
    assert sentences == set(passages)  # the pre-training corpus says exactly these facts


def test_supporting_passages_follow_the_gold_walk_and_stop_at_a_missing_fact(task, passages):
    e0, r1 = next(iter(task.facts))
    e1 = task.facts[(e0, r1)]
    r2 = next(r for r in task.relations if (e1, r) in task.facts)
    e2 = task.facts[(e1, r2)]
    assert [passages[i] for i in supporting_passages(task, f"{e0} {r1} {r2} =")] == \
        [f"{e0} {r1} {e1} .", f"{e1} {r2} {e2} ."]
    missing = [(e, r) for e in task.entities for r in task.relations if (e, r) not in task.facts]
    e, r = missing[0]
    assert supporting_passages(task, f"{e} {r} {r1} =") == []  # the first pair has no fact: nothing supports
    before = next((a, b) for (a, b), t in task.facts.items() if any(t == m[0] for m in missing))
    stop = next(m for m in missing if m[0] == task.facts[before])
    ids = supporting_passages(task, f"{before[0]} {before[1]} {stop[1]} {r1} =")
    assert task.gold(f"{before[0]} {before[1]} {stop[1]} {r1} =").endswith(ABSTAIN)
    assert [passages[i] for i in ids] == [f"{before[0]} {before[1]} {task.facts[before]} ."]
    with pytest.raises(ValueError, match="not a kb_walk prompt"):
        supporting_passages(task, "nonsense =")


# ---------------------------------------------------------------- BM25


def test_bm25_retriever_scores_and_ranks_as_the_labs_reference(task, passages):
    # bm25s "lucene" with its scores × (k1 + 1) is lexical.bm25_scores with its default (Lucene) idf.
    corpus = [p.split() for p in passages]
    queries = _prompts(task, 2)[:15] + _prompts(task, 3)[:15] + [passages[0], "= .", "unknown words"]
    for k1, b in ((1.5, 0.75), (0.9, 0.4), (2.0, 1.0), (0.0, 0.0)):
        retriever = BM25Retriever(passages, k1=k1, b=b)
        for q in queries:
            ours = lexical.bm25_scores(q.split(), corpus, k1=k1, b=b)
            np.testing.assert_allclose(retriever.scores(q), ours, rtol=1e-12, atol=1e-12)
            hits = retriever.search(q, 10)
            reference = [(i, s) for i, s in lexical.bm25_top_k(q.split(), corpus, 10, k1=k1, b=b) if s > 0]
            assert [i for i, _ in hits] == [i for i, _ in reference]  # ties too: both go to the lower id
            np.testing.assert_allclose([s for _, s in hits], [s for _, s in reference], rtol=1e-12)


def test_bm25_returns_only_passages_sharing_a_term_and_at_most_k():
    retriever = BM25Retriever(["a b .", "c d .", "a c ."])
    assert [i for i, _ in retriever.search("a =", 10)] == [0, 2]  # equal scores: the lower id first
    assert [i for i, _ in retriever.search(["c", "d"], 1)] == [1]
    assert retriever.search("zzz", 3) == []
    assert retriever.search_many(["a", "zzz"], 1) == [retriever.search("a", 1), []]


def test_bm25_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        BM25Retriever([])
    with pytest.raises(ValueError, match="no tokens"):
        BM25Retriever(["a b", "  "])
    with pytest.raises(ValueError, match="b must be in"):
        BM25Retriever(["a"], b=1.5)
    with pytest.raises(ValueError, match="b must be in"):
        BM25Retriever(["a"], b=-0.1)
    with pytest.raises(ValueError, match="k1 must be"):
        BM25Retriever(["a"], k1=-1)
    with pytest.raises(TypeError):
        BM25Retriever("a b c")  # one string is not a corpus
    retriever = BM25Retriever(["a"])
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k must be"):
            retriever.search("a", k)
    with pytest.raises(TypeError):
        retriever.search([1, 2], 1)
    with pytest.raises(TypeError):
        retriever.search_many("a", 1)


# ---------------------------------------------------------------- dense


def test_embedding_ignores_right_padding_and_the_batch(task, passages, model):
    tok = task.tokenizer()
    texts = [passages[0], task.pretraining_documents(seed=0)[0], "=", passages[1]]  # 4, 28, 1, 4 tokens
    batched = embed(model, tok, texts, batch_size=4)
    for i, text in enumerate(texts):
        alone = embed(model, tok, [text])
        torch.testing.assert_close(batched[i:i + 1], alone, atol=1e-5, rtol=1e-5)
    assert batched.shape == (4, model.config.hidden_size)
    torch.testing.assert_close(batched.norm(dim=-1), torch.ones(4))
    # the mean is over the text's states, <bos> left out: recomputed from the model's own forward pass
    captured = []
    handle = model.norm.register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        model(torch.tensor([[tok.bos_id, *tok.encode(texts[0])]]))
    handle.remove()
    expected = torch.nn.functional.normalize(captured[0][0, 1:].mean(0), dim=-1)
    torch.testing.assert_close(batched[0], expected, atol=1e-6, rtol=1e-6)
    assert not model.norm._forward_hooks  # embed removed its hook


def test_dense_query_equal_to_a_passage_ranks_that_passage_first(task, passages, model):
    retriever = DenseRetriever(model, task.tokenizer(), passages, batch_size=32)
    hits = retriever.search_many(passages, 3)
    assert [h[0][0] for h in hits] == list(range(len(passages)))
    assert all(h[0][1] == pytest.approx(1.0, abs=1e-5) and h[1][1] < h[0][1] for h in hits)
    alone = retriever.search(passages[5], 2)  # a batch of one: the same ranking, scores to float32 rounding
    assert [i for i, _ in alone] == [i for i, _ in hits[5][:2]]
    np.testing.assert_allclose([s for _, s in alone], [s for _, s in hits[5][:2]], atol=1e-6)


def test_dense_rejects_bad_input_and_removes_its_hook(task, passages, model):
    tok = task.tokenizer()
    with pytest.raises(ValueError, match="empty"):
        DenseRetriever(model, tok, [])
    with pytest.raises(ValueError, match="unknown symbol"):
        embed(model, tok, ["not_a_symbol ."])
    assert not model.norm._forward_hooks
    with pytest.raises(ValueError, match="batch_size"):
        embed(model, tok, passages, batch_size=0)
    with pytest.raises(ValueError, match="k must be"):
        DenseRetriever(model, tok, passages[:3]).search(passages[0], 0)


# ---------------------------------------------------------------- fusion


class _Fixed:
    """A stub retriever returning fixed rankings."""

    def __init__(self, ranking, n_passages=5):
        self.ranking, self.n_passages = ranking, n_passages

    def search_many(self, queries, k):
        return [[(i, 1.0) for i in self.ranking[:k]] for _ in queries]


def test_rrf_fusion_by_hand():
    # ranks: 0 → 1 and 2; 1 → 2; 2 → 3 and 1; 4 → 2 in the second only
    fused = FusedRetriever([_Fixed([0, 1, 2]), _Fixed([2, 0, 4])]).search("q", 4)
    expected = {0: 1 / 61 + 1 / 62, 2: 1 / 63 + 1 / 61, 1: 1 / 62, 4: 1 / 63}
    assert [i for i, _ in fused] == [0, 2, 1, 4]  # 1 and 4 both have one rank 2 / rank 3 → 1/62 > 1/63
    for i, s in fused:
        assert s == pytest.approx(expected[i], abs=1e-15)
    assert [i for i, _ in FusedRetriever([_Fixed([0, 1, 2]), _Fixed([2, 0, 4])], depth=1).search("q", 4)] == [0, 2]
    assert FusedRetriever([_Fixed([]), _Fixed([])]).search("q", 3) == []


def test_fused_retriever_is_rrf_of_bm25_and_dense(task, passages, model):
    bm25 = BM25Retriever(passages)
    dense = DenseRetriever(model, task.tokenizer(), passages)
    fused = FusedRetriever([bm25, dense], depth=20)
    for q in _prompts(task, 2)[:5]:
        rankings = [[i for i, _ in bm25.search(q, 20)], [i for i, _ in dense.search(q, 20)]]
        assert fused.search(q, 10) == lexical.reciprocal_rank_fusion(rankings, k=60.0)[:10]


def test_fused_retriever_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        FusedRetriever([])
    with pytest.raises(ValueError, match="different numbers"):
        FusedRetriever([_Fixed([0], 3), _Fixed([0], 4)])
    with pytest.raises(ValueError, match="depth"):
        FusedRetriever([_Fixed([0])], depth=0)
    for rrf_k in (0, -60, math.inf):
        with pytest.raises(ValueError, match="rrf_k"):
            FusedRetriever([_Fixed([0])], rrf_k=rrf_k)
    with pytest.raises(ValueError, match="k must be"):
        FusedRetriever([_Fixed([0])]).search("q", 0)


# ---------------------------------------------------------------- recall@k


def test_recall_at_k_by_hand():
    ranked = [[3, 1, 2], [5, 4], [7, 8]]
    relevant = [[1, 9], [4], []]  # the third query has no relevant passage: left out of the mean
    assert recall_at_k(ranked, relevant, 2) == pytest.approx((1 / 2 + 1) / 2)
    assert recall_at_k(ranked, relevant, 1) == 0.0
    assert recall_at_k(ranked, relevant, 10) == pytest.approx((1 / 2 + 1) / 2)  # 9 is never retrieved
    hits = [[(i, 0.5) for i in r] for r in ranked]
    assert recall_at_k(hits, relevant, 2) == recall_at_k(ranked, relevant, 2)  # (id, score) hits are read too


def test_recall_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="no query has a relevant"):
        recall_at_k([[1, 2]], [[]], 1)
    with pytest.raises(ValueError, match="queries"):
        recall_at_k([[1], [2]], [[1]], 1)
    with pytest.raises(ValueError, match="twice"):
        recall_at_k([[1, 1]], [[1]], 1)
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k([[1]], [[1]], 0)


# ---------------------------------------------------------------- eq. (11)


def test_rag_prompt_prepends_the_passages_and_the_tokenizer_reads_it(task, passages):
    tok = task.tokenizer()
    prompt = _prompts(task, 2)[0]
    chosen = [passages[i] for i in supporting_passages(task, prompt)]
    text = rag_prompt(chosen, prompt)
    assert text == " ".join([*chosen, prompt])
    assert text.endswith(prompt) and text.startswith(chosen[0])
    assert tok.decode(tok.encode(text)) == text  # every token of x' is in the task's vocabulary
    assert rag_prompt([], prompt) == prompt  # m = 0: the plain prompt
    assert rag_prompt(["a  r b .\n"], " a r = ") == "a r b . a r ="
    with pytest.raises(ValueError, match="prompt"):
        rag_prompt(chosen, "  ")
    with pytest.raises(ValueError, match=r"passages\[1\]"):
        rag_prompt([chosen[0], ""], prompt)
    with pytest.raises(TypeError):
        rag_prompt("a r b .", prompt)


# ---------------------------------------------------------------- recall on the small world


def test_bm25_finds_a_chains_first_fact_but_rarely_the_later_ones(task, passages):
    # Measured on this world: 399 distinct knowable 2- and 3-hop prompts, 335 with a first fact (a knowable
    # chain may end in <abstain> on a fact-less pair that train chains use), 267 with a later one.
    # First fact: recall@1 0.415, @3 0.821, @5 0.973, @10 0.997. Later facts: @5 0.125, @10 0.210.
    # The prompt names the start entity and every relation, so the first fact shares two rare terms with
    # it; it ties with the facts pairing the start entity with another relation of the chain or having
    # it as object, hence recall@1 about 0.4. A later fact's subject is the previous hop's answer, which
    # the prompt does not contain: it shares only a relation with the query, as a quarter of all facts
    # do, so a lexical retriever finds it little better than chance (10 of 84 passages: 0.12).
    retriever = BM25Retriever(passages)
    prompts = _prompts(task, 2) + _prompts(task, 3)
    support = [supporting_passages(task, p) for p in prompts]
    assert sum(map(bool, support)) > 0.8 * len(prompts) > 200
    hits = retriever.search_many(prompts, 10)
    first, later = [s[:1] for s in support], [s[1:] for s in support]
    assert recall_at_k(hits, first, 5) >= 0.95
    assert recall_at_k(hits, first, 10) >= 0.99
    assert recall_at_k(hits, later, 5) <= 0.2
    assert recall_at_k(hits, later, 10) <= 0.3


# ---------------------------------------------------------------- fine-tuning on retrieved context


def _read(prompt: str) -> tuple[list[str], str]:
    """(the passages, the question) of an augmented prompt: each passage ends in ``.``, the question follows."""
    *passages, question = prompt.split(" .")
    return [p.strip() + " ." for p in passages], question.strip()


@pytest.fixture(scope="module")
def train_examples(task):
    return task.examples("train", 400, seed=0)


def _augment_all(task, examples, ctx, seed=0):
    rng = random.Random(seed)
    return [ctx.augment(task, ex, rng) for ex in examples]


def test_share_zero_leaves_every_example_and_share_one_gives_each_one_to_k_passages(task, train_examples):
    assert _augment_all(task, train_examples, RetrievedContext(share=0.0)) == train_examples
    for k in (1, 4, 6):
        sizes = []
        for ex, out in zip(train_examples, _augment_all(task, train_examples, RetrievedContext(share=1.0, passages=k))):
            passages, question = _read(out.prompt)
            assert 1 <= len(passages) <= k and len(passages) == len(set(passages)) and question == ex.prompt
            assert out.completion == ex.completion and out.prompt == rag_prompt(passages, ex.prompt)
            sizes.append(len(passages))
        assert set(sizes) == set(range(1, k + 1))  # every number of passages up to k occurs (400 uniform draws)


def test_about_share_of_the_examples_get_passages(task, train_examples):
    out = _augment_all(task, train_examples, RetrievedContext(share=0.3))
    with_context = sum(o != e for o, e in zip(out, train_examples))
    assert 0.22 < with_context / len(out) < 0.38  # 120 expected of 400


def test_gold_passages_are_kept_at_keep_gold_one_and_never_shown_at_zero(task, passages, train_examples):
    examples = [e for e in train_examples if supporting_passages(task, e.prompt)]
    gold = [{passages[i] for i in supporting_passages(task, e.prompt)} for e in examples]
    always = _augment_all(task, examples, RetrievedContext(share=1.0, keep_gold=1.0))
    never = _augment_all(task, examples, RetrievedContext(share=1.0, keep_gold=0.0))
    half = _augment_all(task, examples, RetrievedContext(share=1.0, keep_gold=0.5))
    # every gold passage shown whenever k leaves room for all of them (k is uniform in 1 … 4)
    assert all(g <= set(_read(o.prompt)[0]) for g, o in zip(gold, always) if len(_read(o.prompt)[0]) >= len(g))
    assert all(set(_read(o.prompt)[0]) <= g for g, o in zip(gold, always) if len(_read(o.prompt)[0]) < len(g))
    assert all(not g & set(_read(o.prompt)[0]) for g, o in zip(gold, never))  # a dropped one is no distractor
    kept = sum(len(g & set(_read(o.prompt)[0])) for g, o in zip(gold, half)) / sum(map(len, gold))
    assert 0.4 < kept < 0.6


def test_distractors_are_only_facts_training_may_show_never_rare_or_reserved(task, passages, train_examples):
    # After SFT a rare fact must still be known only from its 1–3 pre-training sentences: no passage is one.
    fact_of = {p: fact for p, fact in zip(passages, task.facts)}
    trainable = {p for p, (e, r) in fact_of.items() if task.usable_in_training(e, r)}
    rare = {p for p, (e, r) in fact_of.items() if task.is_rare(e, r)}
    assert rare and trainable == set(passages) - rare  # a fact-less pair has no passage to show
    shown = set()
    for seed in range(3):
        for out in _augment_all(task, train_examples, RetrievedContext(share=1.0, keep_gold=0.0), seed=seed):
            shown |= set(_read(out.prompt)[0])
    assert shown <= trainable and not shown & rare
    assert shown == trainable  # 4,800 uniform draws reach every training fact


def test_passage_order_is_random_not_gold_first(task, passages, train_examples):
    examples = [e for e in train_examples if supporting_passages(task, e.prompt)]
    where = set()
    for ex, out in zip(examples, _augment_all(task, examples, RetrievedContext(share=1.0, keep_gold=1.0))):
        shown = _read(out.prompt)[0]
        first = passages[supporting_passages(task, ex.prompt)[0]]
        if first in shown:  # a k below the chain's facts may leave it out
            where.add(shown.index(first))
    assert where == {0, 1, 2, 3}  # k = 4 in about a quarter of them, and the first gold passage anywhere


def test_more_kept_gold_than_k_keeps_a_random_subset_of_k(task, passages):
    examples = [e for e in task.examples("train", 400, seed=1, hops=3) if len(supporting_passages(task, e.prompt)) == 3]
    assert len(examples) > 50
    picked = []
    for ex, out in zip(examples, _augment_all(task, examples, RetrievedContext(share=1.0, passages=2, keep_gold=1.0))):
        gold = [passages[i] for i in supporting_passages(task, ex.prompt)]
        shown = _read(out.prompt)[0]
        assert len(shown) in (1, 2) and set(shown) <= set(gold)
        picked += [gold.index(p) for p in shown]
    assert set(picked) == {0, 1, 2}  # not always the chain's first facts


def test_augment_is_deterministic_given_the_rng(task, train_examples):
    ctx = RetrievedContext()
    first = _augment_all(task, train_examples, ctx, seed=5)
    assert first == _augment_all(task, train_examples, ctx, seed=5)
    assert first != _augment_all(task, train_examples, ctx, seed=6)


@pytest.mark.parametrize("changes, match", [
    ({"share": -0.1}, "share"), ({"share": 1.5}, "share"), ({"share": float("nan")}, "share"),
    ({"share": True}, "share"), ({"passages": 0}, "passages"), ({"passages": 2.0}, "passages"),
    ({"passages": True}, "passages"), ({"keep_gold": -0.5}, "keep_gold"), ({"keep_gold": 1.01}, "keep_gold"),
])
def test_retrieved_context_rejects_bad_settings(changes, match):
    with pytest.raises(ValueError, match=match):
        RetrievedContext(**changes)


def test_augment_rejects_another_task_a_held_out_chain_it_must_not_show_and_too_few_facts(task, train_examples):
    rng = random.Random(0)
    arithmetic = Arithmetic()
    with pytest.raises(TypeError, match="kb_walk"):
        RetrievedContext().augment(arithmetic, arithmetic.examples("train", 1, seed=0)[0], rng)
    unknowable = next(e for e in task.examples("heldout", 400, seed=0) if not task.knowable(e.prompt))
    with pytest.raises(ValueError, match="rare fact"):
        RetrievedContext().augment(task, unknowable, rng)
    with pytest.raises(ValueError, match="distractors"):
        RetrievedContext(share=1.0, passages=len(task.facts) + 1).augment(task, train_examples[0], rng)
    with pytest.raises(TypeError, match="Example"):
        RetrievedContext().augment(task, train_examples[0].prompt, rng)


def test_a_counterfactual_passage_names_another_entity_and_the_answer_follows_it(task, passages, train_examples):
    true_passages, hops = set(passages), set()
    swapped = 0
    for ex, out in zip(train_examples, _augment_all(task, train_examples, RetrievedContext(share=1.0, counterfactual=1.0))):
        shown, question = _read(out.prompt)
        assert question == ex.prompt and 1 <= len(shown) <= 4
        fakes = [p for p in shown if p not in true_passages]
        assert len(fakes) <= 1
        if not fakes:  # no fact to swap, or no entity to walk on from: the example keeps its true walk
            assert out.completion == ex.completion
            continue
        swapped += 1
        head, relation, other, _ = fakes[0].split()
        assert task.facts[(head, relation)] not in (other, head)  # a real pair, named with a wrong entity
        said, gold = out.completion.split(), ex.completion.split()
        j = next(i for i in range(0, len(said) - 2, 2) if said[i:i + 3] == [head, relation, other])
        hops.add(j // 2)
        assert said[:j + 2] == gold[:j + 2]  # the walk up to the swapped fact is the true one
        e = other  # and from the swapped entity on, it walks the world, through nothing training may not show
        for i in range(j + 3, len(said), 2):
            assert said[i] == ex.prompt.split()[1 + i // 2] and task.usable_in_training(e, said[i])
            e = task.facts.get((e, said[i]))
            assert said[i + 1] == ("<abstain>" if e is None else e)
        assert f"{head} {relation} {task.facts[(head, relation)]} ." not in shown  # the true fact is not beside it
        assert all(not task.is_rare(*p.split()[:2]) for p in shown if p in true_passages)
    assert swapped > 250 and hops == {0, 1, 2}  # any hop can be the swapped one
    # counterfactual = 0 draws nothing more: the same examples as the default context
    assert (_augment_all(task, train_examples, RetrievedContext(counterfactual=0.0))
            == _augment_all(task, train_examples, RetrievedContext()))


def test_counterfactual_share_is_validated():
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="counterfactual"):
            RetrievedContext(counterfactual=bad)


# -- the passage sets of the experiment ---------------------------------------------------------------------
def test_oracle_passages_are_the_supporting_facts_in_walk_order(task, passages):
    for e in task.examples("heldout", 30, seed=2):
        got = retrieval.oracle_passages(task, e.prompt, passages)
        assert got == [passages[i] for i in supporting_passages(task, e.prompt)]
        assert retrieval.oracle_passages(task, e.prompt) == got  # the store by default
        walk = e.completion.split()
        assert [p.split()[:2] for p in got] == [walk[i - 1:i + 1] for i in range(1, 2 * len(got), 2)]


def test_distractors_are_the_own_passages_among_n_others_and_the_rng_decides(task, passages):
    e = next(e for e in task.examples("heldout", 50, seed=3) if supporting_passages(task, e.prompt))
    own = retrieval.oracle_passages(task, e.prompt, passages)
    mixed = retrieval.with_distractors(own, passages, 3, random.Random(1))
    assert len(mixed) == len(own) + 3 == len(set(mixed)) and set(own) <= set(mixed)
    assert mixed == retrieval.with_distractors(own, passages, 3, random.Random(1))
    assert own == retrieval.oracle_passages(task, e.prompt, passages)  # own is left as it was
    with pytest.raises(ValueError, match="n must be at most"):
        retrieval.with_distractors(own, passages, len(passages), random.Random(1))
    with pytest.raises(ValueError, match="n must be an int"):
        retrieval.with_distractors(own, passages, -1, random.Random(1))


def test_swapping_the_first_fact_changes_only_its_answer_to_a_wrong_entity(task, passages):
    for e in task.examples("heldout", 40, seed=4):
        own = retrieval.oracle_passages(task, e.prompt, passages)
        swapped, fake = retrieval.swap_first_fact(task, e, own, random.Random(0))
        if not own:
            assert (swapped, fake) == ([], "")
            continue
        head, rel, right, _ = own[0].split()
        assert swapped[0] == f"{head} {rel} {fake} ." and fake != right and fake in task.entities
        assert swapped[1:] == own[1:]
