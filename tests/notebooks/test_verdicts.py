"""Verdicts in glued values: the book's one wording (``stats.said``), never the old "no difference
between … resolved". Each chapter module that glues verdicts asserts that :func:`old_verdicts` of
its smoke run is empty (on the worker that ran the notebook); the tests here check the search
itself and the library's wordings."""

import re

from halluc_lab.evaluation import stats

OLD = re.compile(r"no difference between .+ resolved", re.DOTALL)


def _strings(value):
    """Every string inside a glued value: itself, or the items of its lists and the keys and
    values of its dicts, however deep."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def old_verdicts(glue: dict) -> list[str]:
    """``name: text`` of every glued string that says "no difference between … resolved"."""
    return [f"{name}: {s}" for name, value in glue.items() for s in _strings(value)
            if OLD.search(s)]


def test_the_old_wording_is_found_however_deep_it_is_glued():
    old = "no difference between RLVR + bksp greedy and RLVR greedy resolved"
    glue = {"a_verdict": old, "b": [0.1, {"c": ["no difference between A and B resolved"]}],
            "fine": "RLVR − SFT in wrong rate: not resolved (+0.010 [-0.020, +0.040]; t, 8 seeds)"}
    assert old_verdicts(glue) == [f"a_verdict: {old}", "b: no difference between A and B resolved"]


def test_no_verdict_the_library_writes_has_the_old_wording():
    for iv in (stats.Interval(0.0, -1.0, 1.0), stats.Interval(1.0, 0.5, 2.0),
               stats.Interval(-1.0, -2.0, -0.5)):
        said = {"terse": stats.verdict(iv, "A", "B"),
                "said": stats.said(iv, "A", "B", "x", exploratory=True)}
        assert not old_verdicts(said)
