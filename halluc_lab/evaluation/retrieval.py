"""Retrieval for RAG: kb_walk's facts as passages, a BM25 and a dense retriever, their fusion,
recall@k, and the augmented prompt of 001's eq. (11).

Chapter 11. Document: 001 Part 3 §3 (RAG: "an external retriever first queries a knowledge
base … using an embedding of the prompt … returns a ranked list of relevant chunks z_1, …, z_m", the
augmented context x' = [z_1 : … : z_m] concat x, eq. 11; the remarks on retriever quality and hybrid
dense + sparse search). Chapter 2's :mod:`halluc_lab.foundations.lexical` is the readable reference
for BM25 and RRF; this module is what the experiments call many times.

- **Passages** (:func:`fact_passages`): one per fact of the world, the pre-training sentence
  ``e r e' .``, in the order of ``task.facts``; a passage id is its index there.
  :func:`supporting_passages` lists the facts a prompt's gold walk looks up — fewer than its hops
  for a chain that reaches a pair without a fact (none when the first pair has none): the passages a
  perfect retriever would return.
- **BM25** (:class:`BM25Retriever`): a ``bm25s`` index built once, ``method="lucene"`` in float64.
  bm25s drops 004's (k1 + 1) numerator, so its scores are multiplied back: they are
  ``lexical.bm25_scores``'s (Lucene idf, the lab's default) and the rankings are the same
  (book/results/retrieval.md; tests/unit/test_retrieval.py checks it here). Queries and passages are
  split on whitespace, kb_walk's tokens. Only passages sharing a term with the query are returned.
- **Dense** (:class:`DenseRetriever`): the lab's own decoder as an encoder: ``<bos> text``, the
  final hidden states (after the last RMSNorm, read by a forward hook, so ``model.py`` stays as it
  is), mean-pooled over the text's tokens (``<bos>``, identical for every text, and the right
  padding are left out), unit-normalised; cosine similarity. Under the causal mask a real token
  never sees the pads after it, so a text's embedding does not depend on the batch it is in. Not
  trained as an encoder: how well a language model's pooled states retrieve is what the chapter
  measures.
- **Fusion** (:class:`FusedRetriever`): reciprocal rank fusion (Cormack et al. 2009, k = 60) of each
  retriever's top ``depth`` — 001's "hybrid search (dense + sparse)".
- **recall@k** (:func:`recall_at_k`): the share of a query's relevant passages in its top k,
  averaged over the queries that have at least one; a query with none (an unanswerable chain's
  first pair) has no recall and is left out of the mean.
- **Passage sets of an experiment**: a perfect retriever's (:func:`oracle_passages`), the same
  among distractors (:func:`with_distractors`), and with the first fact's answer swapped
  (:func:`swap_first_fact`).
- **The augmented prompt** (:func:`rag_prompt`): eq. (11)'s x' as text.
- **Fine-tuning to read**: :class:`halluc_lab.stages.sft.RetrievedContext` puts these passages in
  SFT prompts.

Departures and choices (each tested in tests/unit/test_retrieval.py):

- 001 retrieves "using an embedding of the prompt"; BM25 uses the prompt's words. Both are offered.
- x' = [z_1 : … : z_m] concat x, the best passage first as 001 writes it, with no separator: each
  fact passage ends in ``.``, so x' reads as a pre-training document followed by the question, in
  the task's own vocabulary (a new separator token would change every model's vocabulary size).
- 001's t' ≤ Δ: the lab's model has no hard window; the caller keeps k small (k passages add 4k
  tokens).
- A single retrieval from the prompt finds a chain's first fact — the prompt names its entity and
  relation — but not the later ones: their entity is the answer of the hop before, which the query
  does not contain. 001's "multi-hop retrieval" (query again with what was found) is not implemented
  here.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from halluc_lab.foundations import lexical
from halluc_lab.model.tokenizer import ABSTAIN

Query = str | Sequence[str]  # a whitespace-separated string or its list of tokens
Hit = tuple[int, float]  # (passage id, score), best first


class Retriever(Protocol):
    """Anything with ``search_many(queries, k) -> [[(passage id, score), …] per query]``."""

    n_passages: int

    def search_many(self, queries: Sequence[Query], k: int) -> list[list[Hit]]: ...


# ---------------------------------------------------------------- argument checks


def _tokens(query: Query, what: str = "query") -> list[str]:
    """A query or passage as its list of tokens (a string is split on whitespace)."""
    if isinstance(query, str):
        return query.split()
    if not isinstance(query, Sequence) or not all(isinstance(t, str) for t in query):
        raise TypeError(f"{what} must be a string or a sequence of string tokens, got {query!r}")
    return list(query)


def _corpus(passages: Sequence[Query], what: str = "passages") -> list[list[str]]:
    """Every passage as a non-empty token list; a ValueError for an empty corpus or an empty
    passage."""
    if isinstance(passages, str) or not isinstance(passages, Sequence):
        raise TypeError(f"{what} must be a sequence of texts, got {type(passages).__name__}")
    if len(passages) == 0:
        raise ValueError(f"{what} is empty: a retriever needs a corpus of at least one passage")
    docs = [_tokens(p, f"{what}[{i}]") for i, p in enumerate(passages)]
    empty = [i for i, d in enumerate(docs) if not d]
    if empty:
        raise ValueError(f"{what} {empty[:5]} have no tokens: each needs at least one")
    return docs


def _queries(queries: Sequence[Query]) -> list[list[str]]:
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        raise TypeError("queries must be a sequence of queries (for one query use search)")
    return [_tokens(q) for q in queries]


# ---------------------------------------------------------------- kb_walk's passages


def fact_passages(task) -> list[str]:
    """One passage per fact of a :class:`~halluc_lab.tasks.kb_walk.KBWalk` world, ``e r e' .``, in
    the order of ``task.facts``: passage id i is the i-th fact. Distinct by construction (one fact
    per pair)."""
    return [f"{e} {r} {target} ." for (e, r), target in task.facts.items()]


def supporting_passages(task, prompt: str) -> list[int]:
    """Ids (into :func:`fact_passages`) of the facts the gold walk of ``prompt`` looks up, in walk
    order, each once. The walk stops at the first pair without a fact, so an unanswerable chain has
    fewer supporting facts than hops, or none. Example: for ``e0 r1 r2 =`` with facts (e0, r1) → e1
    and no fact (e1, r2), the id of ``e0 r1 e1 .`` alone."""
    return walk_passages(task, task.gold(prompt).split())  # raises on a malformed prompt


def walk_passages(task, symbols: Sequence[str],
                  ids: Mapping[tuple[str, str], int] | None = None) -> list[int]:
    """Ids (into :func:`fact_passages`) of the facts a walk ``e0 r1 e1 r2 e2 … [<abstain>]`` looks
    up, in walk order, each once, up to its ``<abstain>``. Every (entity, relation) pair before that
    must be a fact. ``ids``: the fact → id map, for a caller that keeps one (built from
    ``task.facts`` when None)."""
    ids = {fact: i for i, fact in enumerate(task.facts)} if ids is None else ids
    out: list[int] = []
    for i in range(1, len(symbols) - 1, 2):
        if symbols[i + 1] == ABSTAIN:
            break
        fact = ids[(symbols[i - 1], symbols[i])]
        if fact not in out:  # a walk round a cycle looks a fact up twice
            out.append(fact)
    return out


def oracle_passages(task, prompt: str, passages: Sequence[str] | None = None) -> list[str]:
    """What a perfect multi-hop retriever returns for ``prompt``: the passages of its
    :func:`supporting_passages`, in walk order (``passages``: the store, :func:`fact_passages`
    when None)."""
    passages = fact_passages(task) if passages is None else passages
    return [passages[i] for i in supporting_passages(task, prompt)]


def with_distractors(own: Sequence[str], passages: Sequence[str], n: int,
                     rng: random.Random) -> list[str]:
    """A prompt's own passages among ``n`` other passages of the store, drawn with ``rng`` and
    shuffled in with them: a retriever that finds the right facts and some noise."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    pool = [p for p in passages if p not in own]
    if n > len(pool):
        raise ValueError(f"n must be at most the {len(pool)} passages that are not the prompt's "
                         f"own, got {n}")
    mixed = [*own, *rng.sample(pool, n)]
    rng.shuffle(mixed)
    return mixed


def swap_first_fact(task, example, own: Sequence[str], rng: random.Random) -> tuple[list[str], str]:
    """The passages ``own`` (a prompt's :func:`oracle_passages`) with the first fact's answer
    replaced by a plausible wrong entity (``task.plausible_error`` at the completion's first
    answer), and that entity: does a model follow the passage or its memory? No passages:
    ``([], "")``."""
    if not own:
        return [], ""
    head, rel, _, dot = own[0].split()
    fake = task.plausible_error(example, 2, rng)
    return [f"{head} {rel} {fake} {dot}", *own[1:]], fake


# ---------------------------------------------------------------- BM25 (sparse)


class BM25Retriever:
    """BM25 over ``passages`` with a ``bm25s`` index built once; scores are
    ``lexical.bm25_scores``'s.

    >>> r = BM25Retriever(["a b .", "c d ."])
    >>> [i for i, _ in r.search("c =", 5)]
    [1]
    """

    def __init__(self, passages: Sequence[Query], *, k1: float = 1.5, b: float = 0.75) -> None:
        docs = _corpus(passages)
        lexical.check_bm25_parameters(k1, b)
        import bm25s  # 0.2 s to import: only when an index is built

        self.k1, self.b, self.n_passages = float(k1), float(b), len(docs)
        self._index = bm25s.BM25(method="lucene", k1=self.k1, b=self.b, dtype="float64")
        self._index.index(docs, show_progress=False)

    def scores(self, query: Query) -> np.ndarray:
        """BM25 score ``(n_passages,)`` of every passage; a repeated query term counts each time, a
        term in no passage adds 0 (as ``lexical.bm25_scores``)."""
        ids = self._index.get_tokens_ids(_tokens(query))  # leaves out terms the corpus lacks
        if not ids:
            return np.zeros(self.n_passages)
        return np.asarray(self._index.get_scores_from_ids(ids), dtype=np.float64) * (self.k1 + 1)

    def search(self, query: Query, k: int) -> list[Hit]:
        """The at most k best passages sharing a term with ``query``, best first; ties to the lower
        id."""
        lexical.check_k(k)
        return [(i, s) for i, s in lexical.top_k(self.scores(query), min(k, self.n_passages))
                if s > 0]

    def search_many(self, queries: Sequence[Query], k: int) -> list[list[Hit]]:
        lexical.check_k(k)
        return [self.search(q, k) for q in _queries(queries)]


# ---------------------------------------------------------------- dense, from the lab's own model


@torch.no_grad()
def embed(model, tokenizer, texts: Sequence[Query], *, batch_size: int = 64) -> torch.Tensor:
    """Unit-norm embeddings ``(N, d)``, float32 on the model's device: the final hidden states of
    ``<bos> text`` (after the last RMSNorm) averaged over the text's tokens.

    ``model`` is a :class:`halluc_lab.model.transformer.Transformer` (its ``norm`` is hooked for the
    duration of the call), ``tokenizer`` the task's; rows are right-padded and the pads are left out
    of the mean.
    """
    lexical.check_k(batch_size, "batch_size")
    # a ValueError names an unknown symbol
    ids = [tokenizer.encode(t) for t in _corpus(texts, "texts")]
    device = model.embed_tokens.weight.device
    captured: list[torch.Tensor] = []
    handle = model.norm.register_forward_hook(lambda _module, _inputs,
                                              output: captured.append(output))
    out = []
    try:
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size]
            width = 1 + max(len(x) for x in chunk)
            batch = torch.full((len(chunk), width), tokenizer.pad_id, dtype=torch.long)  # (B, T)
            # (B, T): the text's own tokens
            keep = torch.zeros((len(chunk), width), dtype=torch.bool)
            for row, x in enumerate(chunk):
                batch[row, 0] = tokenizer.bos_id
                batch[row, 1:1 + len(x)] = torch.tensor(x)
                keep[row, 1:1 + len(x)] = True
            captured.clear()
            model(batch.to(device))  # the logits are not used; the hook keeps the normed states
            hidden = captured[-1].float()  # (B, T, d)
            weights = keep.to(device, hidden.dtype)[:, :, None]  # (B, T, 1)
            pooled = (hidden * weights).sum(1) / weights.sum(1)  # (B, d)
            out.append(F.normalize(pooled, dim=-1))
    finally:
        handle.remove()
    return torch.cat(out)


class DenseRetriever:
    """Cosine similarity between :func:`embed` of the query and of every passage (embedded once)."""

    def __init__(self, model, tokenizer, passages: Sequence[Query], *,
                 batch_size: int = 64) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.passage_embeddings = embed(model, tokenizer, passages, batch_size=batch_size)  # (N, d)
        self.n_passages = self.passage_embeddings.shape[0]

    def scores_many(self, queries: Sequence[Query]) -> np.ndarray:
        """Cosine similarities ``(n_queries, n_passages)`` in float64 on the host."""
        # (Q, d)
        q = embed(self.model, self.tokenizer, _queries(queries), batch_size=self.batch_size)
        return (q @ self.passage_embeddings.T).double().cpu().numpy()

    def search_many(self, queries: Sequence[Query], k: int) -> list[list[Hit]]:
        """The k most similar passages of each query, best first; ties to the lower id."""
        lexical.check_k(k)
        return [lexical.top_k(row, min(k, self.n_passages)) for row in self.scores_many(queries)]

    def search(self, query: Query, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]


# ---------------------------------------------------------------- fusion (RRF)


class FusedRetriever:
    """Reciprocal rank fusion of several retrievers: each returns its top ``depth``, and a passage
    scores Σ 1 / (rrf_k + rank) over the rankings it appears in
    (``lexical.reciprocal_rank_fusion``)."""

    def __init__(self, retrievers: Sequence[Retriever], *, depth: int = 100,
                 rrf_k: float = 60.0) -> None:
        if len(retrievers) == 0:
            raise ValueError("retrievers is empty: nothing to fuse")
        sizes = {r.n_passages for r in retrievers}
        if len(sizes) != 1:
            raise ValueError(f"the retrievers index different numbers of passages: {sorted(sizes)}")
        lexical.check_k(depth, "depth")
        if (isinstance(rrf_k, bool) or not isinstance(rrf_k, numbers.Real)
                or not (math.isfinite(rrf_k) and rrf_k > 0)):
            raise ValueError(f"rrf_k must be finite and > 0, got {rrf_k!r}")
        self.retrievers, self.depth, self.rrf_k = tuple(retrievers), depth, float(rrf_k)
        self.n_passages = sizes.pop()

    def search_many(self, queries: Sequence[Query], k: int) -> list[list[Hit]]:
        """The k best fused passages of each query, best first; equal scores keep first
        appearance."""
        lexical.check_k(k)
        queries = _queries(queries)
        per_retriever = [r.search_many(queries, self.depth) for r in self.retrievers]
        out = []
        for q in range(len(queries)):
            rankings = [[i for i, _ in hits[q]] for hits in per_retriever]
            if not any(rankings):
                out.append([])
                continue
            fused = lexical.reciprocal_rank_fusion(rankings, k=self.rrf_k)
            out.append([(int(i), s) for i, s in fused[:k]])
        return out

    def search(self, query: Query, k: int) -> list[Hit]:
        return self.search_many([query], k)[0]


# ---------------------------------------------------------------- evaluation and the augmented
# prompt


def recall_at_k(ranked: Sequence[Sequence[int | Hit]], relevant: Sequence[Sequence[int]],
                k: int) -> float:
    """Mean over queries of |top k ∩ relevant| / |relevant|.

    ``ranked[q]``: query q's passages, best first, as ids or (id, score) hits; ``relevant[q]``: its
    relevant ids. Queries with no relevant passage are left out of the mean (their recall is
    undefined); a ValueError if no query has one. With one relevant passage per query this is the
    hit rate. Example:
    ``recall_at_k([[3, 1, 2], [5, 4]], [[1, 9], [4]], 2)`` → (1/2 + 1) / 2 = 0.75.
    """
    lexical.check_k(k)
    if len(ranked) != len(relevant):
        raise ValueError(f"ranked has {len(ranked)} queries but relevant has {len(relevant)}")
    recalls = []
    for q, (ranking, rel) in enumerate(zip(ranked, relevant)):
        ids = [h[0] if isinstance(h, tuple) else h for h in ranking]
        if len(set(ids)) != len(ids):
            raise ValueError(f"ranked[{q}] lists a passage twice")
        if len(rel):
            rel = set(rel)
            recalls.append(len(rel.intersection(ids[:k])) / len(rel))
    if not recalls:
        raise ValueError("no query has a relevant passage: recall is undefined")
    return math.fsum(recalls) / len(recalls)


def rag_prompt(passages: Sequence[str], prompt: str) -> str:
    """001's x' = [z_1 : … : z_m] concat x as text: the passages in the order given (best first),
    then the prompt, separated by single spaces. ``rag_prompt(["a r b .", "b s c ."], "a r s =")`` →
    ``"a r b . b s c . a r s ="``. No passages: the prompt itself (m = 0)."""
    if not isinstance(prompt, str) or not prompt.split():
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    if isinstance(passages, str):
        raise TypeError("passages must be a sequence of passage strings, not one string")
    for i, p in enumerate(passages):
        if not isinstance(p, str) or not p.split():
            raise ValueError(f"passages[{i}] must be a non-empty string, got {p!r}")
    return " ".join([*(" ".join(p.split()) for p in passages), " ".join(prompt.split())])
