"""BM25 indexing and querying: the lab's reference against ``bm25s`` and ``rank-bm25``, same corpus, one run.

The corpus is generated: ``--docs`` documents of ``--min-len``..``--max-len`` tokens (uniform), each token
drawn from a Zipfian vocabulary of ``--vocab`` words (p(rank r) ∝ 1/r). Queries are 3–5 distinct words
drawn from the same distribution. Every peer gets the same token lists, k1 = 1.5, b = 0.75, and returns
the top 10 documents.

- *lab*: :func:`halluc_lab.foundations.lexical.bm25_top_k`, the readable reference. It keeps no index: every call
  counts the corpus into a dense (documents × vocabulary) matrix, so its *index* column is that counting
  (``term_counts``, df, idf) alone and its *query* column is one whole call, which repeats it.
- *bm25s* (``method="lucene"``, numpy backend): its scores are the lab's / (k1 + 1), rankings identical
  (tests/unit/test_lexical.py). *bm25s batch*: all queries in one ``retrieve`` call, per query.
- *rank-bm25* (``BM25Okapi``): Robertson's idf with negative values floored at 0.25 × the mean idf; the
  lab matches it with that idf (checked below on one query). The idf is one vector operation over the
  vocabulary, so the variant does not change the lab's time.

Indexing: median of ``--repeats`` builds. Querying: median over queries of one timed call each, after a
warm-up call; the lab answers only the first ``--lab-queries`` queries (each call rebuilds the counts).

    python benchmarks/bm25.py --json _build/bench/bm25.json
    python benchmarks/bm25.py --quick          # a smoke check of the script (seconds)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from importlib.metadata import version

import numpy as np
import torch
from common import attempt, environment, print_table, ratio, write_json

from halluc_lab.foundations.lexical import (
    bm25_scores,
    bm25_top_k,
    document_frequency,
    idf_bm25,
    idf_okapi,
    term_counts,
)

K1, B, TOP = 1.5, 0.75, 10


def zipf_corpus(n_docs: int, n_vocab: int, min_len: int, max_len: int, n_queries: int, seed: int = 0):
    """Seeded documents and queries (lists of str) over a Zipfian vocabulary ``w0``, ``w1``, …"""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(n_vocab)])
    p = 1 / np.arange(1, n_vocab + 1)
    p /= p.sum()
    lengths = rng.integers(min_len, max_len + 1, size=n_docs)
    tokens = vocab[rng.choice(n_vocab, size=int(lengths.sum()), p=p)].tolist()
    cuts = np.concatenate([[0], np.cumsum(lengths)])
    docs = [tokens[cuts[i]:cuts[i + 1]] for i in range(n_docs)]
    queries = [vocab[rng.choice(n_vocab, size=rng.integers(3, 6), replace=False, p=p)].tolist()
               for _ in range(n_queries)]
    return docs, queries


def median_time(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_query_ms(answer, queries) -> float:
    """Median milliseconds of one ``answer(query)`` over ``queries``, after one warm-up call."""
    answer(queries[0])
    return 1e3 * statistics.median(median_time(lambda q=q: answer(q), 1) for q in queries)


def lab_index(docs):
    counts, vocab = term_counts(docs)
    return counts, vocab, idf_bm25(document_frequency(counts), len(docs))


def measure(docs, queries, repeats: int, lab_queries: int) -> tuple[list[dict], dict]:
    import bm25s
    import rank_bm25

    rows = {}
    rows["lab"] = {"index s": attempt(lambda: median_time(lambda: lab_index(docs), repeats), "lab index"),
                   "query ms": attempt(lambda: median_query_ms(lambda q: bm25_top_k(q, docs, TOP, k1=K1, b=B),
                                                               queries[:lab_queries]), "lab query")}

    def bm25s_index():
        index = bm25s.BM25(method="lucene", k1=K1, b=B)
        index.index(docs, show_progress=False)
        return index

    index = bm25s_index()
    rows["bm25s"] = {"index s": attempt(lambda: median_time(bm25s_index, repeats), "bm25s index"),
                     "query ms": attempt(lambda: median_query_ms(
                         lambda q: index.retrieve([q], k=TOP, show_progress=False), queries), "bm25s query")}

    def batch_ms():
        index.retrieve(queries, k=TOP, show_progress=False)  # warm-up
        return 1e3 * median_time(lambda: index.retrieve(queries, k=TOP, show_progress=False), repeats) / len(queries)
    rows["bm25s batch"] = {"index s": rows["bm25s"]["index s"], "query ms": attempt(batch_ms, "bm25s batch")}

    okapi = rank_bm25.BM25Okapi(docs, k1=K1, b=B, epsilon=0.25)
    ids = list(range(len(docs)))
    rows["rank-bm25"] = {"index s": attempt(lambda: median_time(lambda: rank_bm25.BM25Okapi(docs, k1=K1, b=B),
                                                                repeats), "rank-bm25 index"),
                         "query ms": attempt(lambda: median_query_ms(lambda q: okapi.get_top_n(q, ids, n=TOP),
                                                                     queries), "rank-bm25 query")}

    # Same variant, same scores: a check on the first query, untimed (the full one is the unit test).
    q = queries[0]
    ours = bm25_scores(q, docs, k1=K1, b=B)
    agree = {
        "bm25s": bool(np.allclose(ours / (K1 + 1), index.get_scores(q), rtol=1e-5, atol=1e-5 * ours.max())),
        "rank-bm25": bool(np.allclose(bm25_scores(q, docs, k1=K1, b=B, idf=idf_okapi), okapi.get_scores(q),
                                      rtol=1e-9)),
    }
    agree["bm25s batch"] = agree["bm25s"]
    table = []
    for name, r in rows.items():
        row = {"implementation": name, "index s": r["index s"], "query ms": r["query ms"]}
        if name != "lab":
            row["lab/peer index"] = ratio(rows["lab"]["index s"], r["index s"])
            row["lab/peer query"] = ratio(rows["lab"]["query ms"], r["query ms"])
            row["same scores"] = "yes" if agree[name] else "NO"
        table.append(row)
    return table, agree


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=20_000, help="documents in the corpus")
    p.add_argument("--vocab", type=int, default=5_000, help="Zipfian vocabulary size")
    p.add_argument("--min-len", type=int, default=20, help="shortest document, tokens")
    p.add_argument("--max-len", type=int, default=180, help="longest document, tokens")
    p.add_argument("--queries", type=int, default=100, help="queries of 3-5 words (bm25s, rank-bm25)")
    p.add_argument("--lab-queries", type=int, default=10, help="of those, how many the lab answers")
    p.add_argument("--repeats", type=int, default=3, help="index builds timed (median)")
    p.add_argument("--quick", action="store_true", help="2,000 documents, 20 queries: a smoke check")
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.vocab, args.queries, args.lab_queries, args.repeats = 2_000, 2_000, 20, 5, 2
    start = time.perf_counter()
    docs, queries = zipf_corpus(args.docs, args.vocab, args.min_len, args.max_len, args.queries)
    n_tokens = sum(map(len, docs))
    n_vocab = len({t for d in docs for t in d})
    rows, agree = measure(docs, queries, args.repeats, min(args.lab_queries, len(queries)))
    env = {**environment(torch.device("cpu")), "numpy": np.__version__, "bm25s": version("bm25s"),
           "rank-bm25": version("rank-bm25")}
    corpus = (f"{args.docs:,} documents, {n_tokens:,} tokens, {n_vocab:,} distinct words (Zipf over {args.vocab:,}); "
              f"queries of 3-5 words, top {TOP}, k1 = {K1}, b = {B}")
    print_table(f"BM25 — {corpus} — {env['device']}, numpy {env['numpy']}, bm25s {env['bm25s']}, "
                f"rank-bm25 {env['rank-bm25']}, {env['date']}",
                rows, ["implementation", "index s", "query ms", "lab/peer index", "lab/peer query", "same scores"])
    print(f"query ms: median over {len(queries)} queries (lab: the first {min(args.lab_queries, len(queries))}); "
          f"index s: median of {args.repeats} builds; total {time.perf_counter() - start:.0f} s")
    payload = {"benchmark": "bm25", **env, "docs": args.docs, "tokens": n_tokens, "distinct_words": n_vocab,
               "vocab": args.vocab, "queries": len(queries), "lab_queries": min(args.lab_queries, len(queries)),
               "k1": K1, "b": B, "top": TOP, "rows": rows, "same_scores": agree}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
