"""What is SFT's own: backspace demonstrations and scheduled sampling."""

import random

import pytest
import torch

from halluc_lab.training.data import IGNORE, encode_example, pad
from halluc_lab.extensions.retraction import REFUSE, TAKE_BACK, ForbiddenFacts
from halluc_lab.stages.sft import BackspaceConfig, backspace_demonstration, own_error_demonstration, scheduled_sampling
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, Example, KBWalk, KBWalkConfig, completion_symbols
from tests.unit._tiny_lm import TinyConfig, TinyLM

TASK = Arithmetic(ArithmeticConfig(max_digits=3))
TOK = TASK.tokenizer()


@pytest.mark.parametrize("errors", ["plausible", "random"])
def test_backspace_demonstration_masks_the_erased_token_and_reads_as_the_gold_answer(errors):
    rng = random.Random(0)
    for ex in TASK.examples("train", 20, seed=0):
        seq, = backspace_demonstration(TOK, TASK, ex, BackspaceConfig(rate=0.5, errors=errors), rng)
        text = TOK.decode(seq.ids)
        completion = text.split(" = ", 1)[1]
        assert completion_symbols(completion) == ex.completion.split()
        for t, tid in enumerate(seq.ids):
            if t + 1 < len(seq.ids) and seq.ids[t + 1] == TOK.bksp_id:
                assert seq.labels[t] == IGNORE  # never learn to write the error
                assert seq.labels[t + 1] == TOK.bksp_id  # learn to erase it
                assert seq.labels[t + 2] == seq.ids[t + 2]  # and to write the correction


def test_backspace_rate_zero_is_the_clean_example_and_rate_one_errs_everywhere():
    ex = Example("1 2 + 3 4 =", "4 6")
    clean, = backspace_demonstration(TOK, TASK, ex, BackspaceConfig(rate=0.0), random.Random(0))
    assert clean == encode_example(TOK, ex)
    full, = backspace_demonstration(TOK, TASK, ex, BackspaceConfig(rate=1.0), random.Random(0))
    assert full.ids.count(TOK.bksp_id) == 2


def test_erase_context_gives_the_clean_sequence_and_one_branch_per_error():
    ex = Example("1 2 + 3 4 =", "4 6")
    seqs = backspace_demonstration(TOK, TASK, ex, BackspaceConfig(rate=1.0, context="erase"), random.Random(0))
    assert seqs[0] == encode_example(TOK, ex) and len(seqs) == 3
    for br in seqs[1:]:
        assert br.ids[-1] == TOK.bksp_id and [t for t in br.labels if t != IGNORE] == [TOK.bksp_id]
    assert seqs[2].ids[:-2] == encode_example(TOK, ex).ids[:8]  # prefix: <bos>, 6 prompt symbols, first digit


def test_backspace_on_kb_walk_abstention_uses_a_made_up_entity():
    task = KBWalk(KBWalkConfig(n_entities=10, n_relations=2))
    tok = task.tokenizer()
    ex = next(e for e in task.examples("train", 100, seed=0) if e.completion.endswith("<abstain>"))
    seq, = backspace_demonstration(tok, task, ex, BackspaceConfig(rate=1.0), random.Random(0))
    words = tok.decode(seq.ids).split()
    assert words[-4] in task.entities and words[-3:] == ["<bksp>", "<abstain>", "<eos>"]


@pytest.mark.parametrize("kwargs", [{"rate": 1.5}, {"errors": "typo"}, {"context": "forget"}])
def test_bad_backspace_config_raises(kwargs):
    with pytest.raises(ValueError):
        BackspaceConfig(**kwargs)


# -- scheduled sampling ------------------------------------------------------------------------
def _batch():
    return pad([encode_example(TOK, e) for e in TASK.examples("train", 8, seed=0)], TOK.pad_id)


@pytest.mark.parametrize("answer, ids, targets", [
    ("4 6 <eos>", "<bos> 1 + 1 = 4 6 <eos>", "4 6 <eos>"),  # right: the clean example
    ("4 7 9 <eos>", "<bos> 1 + 1 = 4 7 <bksp> 6 <eos>", "4 <bksp> 6 <eos>"),  # cut at 7, its first wrong symbol
    ("5 <eos>", "<bos> 1 + 1 = 5 <bksp> 4 6 <eos>", "<bksp> 4 6 <eos>"),  # wrong from the start
    ("4 7 <bksp> 6 <eos>", "<bos> 1 + 1 = 4 6 <eos>", "4 6 <eos>"),  # judged on what it finally says: right
    ("4 <eos>", "<bos> 1 + 1 = 4 6 <eos>", "4 6 <eos>"),  # stopped early: nothing follows <eos>
    ("4 6 8", "<bos> 1 + 1 = 4 6 8 <bksp> <eos>", "4 6 <bksp> <eos>"),  # no <eos>: the extra symbol is the error
])
def test_own_error_demonstration_cuts_at_the_first_wrong_symbol(answer, ids, targets):
    task = Arithmetic()
    tok = task.tokenizer()
    ex = Example("1 + 1 =", "4 6")  # any gold answer will do: the demonstration reads only the example
    seq = own_error_demonstration(tok, ex, tok.encode(answer))
    assert tok.decode(seq.ids) == ids
    assert tok.decode([t for t in seq.labels if t != IGNORE]) == targets
    clean = own_error_demonstration(tok, ex, tok.encode(answer), take_back=False)
    assert tok.decode(clean.ids) == "<bos> 1 + 1 = 4 6 <eos>"  # the control: the gold answer, no take-back


def test_scheduled_sampling_replaces_only_completion_inputs_and_keeps_gold_labels():
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(vocab_size=TOK.vocab_size))
    b = _batch()
    assert scheduled_sampling(model, b, 0.0, torch.Generator().manual_seed(0)) is b
    out = scheduled_sampling(model, b, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(out.labels, b.labels)
    changed = out.input_ids != b.input_ids
    replaceable = torch.zeros_like(changed)
    replaceable[:, 1:-1] = (b.labels[:, 1:-1] != IGNORE) & (b.labels[:, 2:] != IGNORE)
    assert not (changed & ~replaceable).any() and changed.any()
    again = scheduled_sampling(model, b, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(again.input_ids, out.input_ids)


def test_scheduled_sampling_rate_out_of_range_raises():
    with pytest.raises(ValueError, match="rate"):
        scheduled_sampling(TinyLM(TinyConfig(vocab_size=TOK.vocab_size)), _batch(), 1.2, torch.Generator())


# -- with the lab's model ----------------------------------------------------------------------


# -- retraction demonstrations (001 Part 4 §3) ---------------------------------------------------------------
KB = KBWalk(KBWalkConfig(n_entities=12, n_relations=3))
KB_TOK = KB.tokenizer()
FORBIDDEN = KB.relations[0]


def _reaching(n: int = 40):
    """Train examples whose walk reaches a fact of the forbidden relation."""
    return [e for e in KB.examples("train", 400, seed=0) if ForbiddenFacts(FORBIDDEN).position(KB, e) is not None][:n]


@pytest.mark.parametrize("style", [REFUSE, TAKE_BACK])
def test_retraction_demonstration_withholds_the_forbidden_fact_and_never_teaches_it(style):
    forbidden = ForbiddenFacts(FORBIDDEN, style)
    examples = _reaching()
    assert examples
    for ex in examples:
        i = forbidden.position(KB, ex)
        gold = ex.completion.split()
        assert gold[i - 1] == FORBIDDEN and gold[i] in KB.entities
        seq = forbidden.demonstration(KB_TOK, KB, ex)
        completion = KB_TOK.decode(seq.ids).split(" = ", 1)[1]
        assert completion_symbols(completion) == gold[:i] + ["<abstain>"]  # what it finally says: the walk withheld
        targets = [KB_TOK.tokens[t] for t in seq.labels if t != IGNORE]
        wrote, states = forbidden.judge(KB, " ".join(targets))
        assert not wrote and not states  # no target writes the forbidden fact
        assert forbidden.judge(KB, completion) == (style == TAKE_BACK, False)
        if style == TAKE_BACK:
            assert targets[-3:] == ["<bksp>", "<abstain>", "<eos>"] and KB_TOK.tokens[seq.ids[-4]] == gold[i]


def test_retraction_demonstration_leaves_other_examples_clean_and_styles_share_the_prefix():
    for ex in KB.examples("train", 60, seed=1):
        refuse = ForbiddenFacts(FORBIDDEN, REFUSE).demonstration(KB_TOK, KB, ex)
        back = ForbiddenFacts(FORBIDDEN, TAKE_BACK).demonstration(KB_TOK, KB, ex)
        if ForbiddenFacts(FORBIDDEN).position(KB, ex) is None:
            assert refuse == back == encode_example(KB_TOK, ex)
        else:
            n = len(refuse.ids) - 2  # up to the withheld fact: the same tokens and labels in both styles
            assert refuse.ids[:n] == back.ids[:n] and refuse.labels[:n] == back.labels[:n]
            assert len(back.ids) == len(refuse.ids) + 2


def test_prefill_ends_with_the_forbidden_fact_and_judge_reads_take_backs():
    forbidden = ForbiddenFacts(FORBIDDEN)
    ex = _reaching(1)[0]
    start = forbidden.prefill(KB, ex)
    assert forbidden.judge(KB, start) == (True, True)
    assert forbidden.judge(KB, start + " <bksp> <abstain> <eos>") == (True, False)
    assert forbidden.judge(KB, start + " <eos> <bksp>") == (True, True)  # nothing after <eos> counts
    other = next(r for r in KB.relations if r != FORBIDDEN)
    assert forbidden.judge(KB, f"{KB.entities[0]} {other} {KB.entities[1]}") == (False, False)
    assert forbidden.judge(KB, f"{KB.entities[0]} {FORBIDDEN} <abstain>") == (False, False)
    clean = next(e for e in KB.examples("train", 100, seed=0) if forbidden.position(KB, e) is None)
    with pytest.raises(ValueError, match="reaches no fact"):
        forbidden.prefill(KB, clean)


@pytest.mark.parametrize("kwargs, match", [({"relation": ""}, "relation"), ({"relation": 3}, "relation"),
                                           ({"relation": "x_of", "style": "hide"}, "style")])
def test_bad_forbidden_facts_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ForbiddenFacts(**kwargs)


def test_forbidden_relation_must_be_the_tasks():
    with pytest.raises(ValueError, match="not one of the task's relations"):
        ForbiddenFacts("nope_of").position(KB, Example(f"{KB.entities[0]} {FORBIDDEN} =", KB.entities[0]))
    with pytest.raises(ValueError, match="kb_walk"):
        ForbiddenFacts("nope_of").judge(TASK, "1 2")
