"""The in-context task: every prompt's rule is given only by its demonstrations."""

import random

import pytest

from halluc_lab.tasks import ABSTAINED, CONTRADICTED, SUPPORTED, UNSUPPORTED, InContext, InContextConfig

TASK = InContext(InContextConfig(max_shots=4, n_pretrain_documents=40))


def _shift(prompt: str) -> set[int]:
    pairs = [p.split(">") for p in prompt.split(";")[:-1]]
    return {(int(y) - int(x)) % 10 for x, y in pairs}


def test_every_prompt_follows_one_hidden_shift_and_the_query_is_never_shown():
    for e in TASK.examples("train", 200, seed=0) + TASK.examples("heldout", 200, seed=0):
        shifts, query = _shift(e.prompt), e.prompt.split(";")[-1].split()[0]
        shown = [p.split(">")[0].strip() for p in e.prompt.split(";")[:-1]]
        assert query not in shown and len(set(shown)) == len(shown)
        if shown:
            assert len(shifts) == 1 and 0 not in shifts
            assert e.completion == str((int(query) + shifts.pop()) % 10)
        else:
            assert e.completion == "<abstain>"  # nothing in the prompt determines the answer


def test_across_prompts_every_query_maps_to_many_answers():
    """The weights cannot hold the answer: it depends on the prompt's rule, not on the query."""
    answers = {}
    for e in TASK.examples("train", 500, seed=1, shots=1):
        answers.setdefault(e.prompt.split(";")[-1].split()[0], set()).add(e.completion)
    assert len(answers) == 10 and all(len(a) >= 7 for a in answers.values())


def test_examples_by_length_are_keyed_by_the_number_of_shots():
    by = TASK.examples_by_length("heldout", 5, seed=0)
    assert sorted(by) == [0, 1, 2, 3, 4]
    assert all(e.prompt.count(";") == k for k, exs in by.items() for e in exs)
    with pytest.raises(ValueError):
        TASK.examples("train", 1, seed=0, shots=5)


def test_the_worked_form_of_001_part_5_a_rule_from_examples_alone():
    assert TASK.gold("3 > 8 ; 6 > 1 ; 9 >") == "4"  # c = 5, learnt from the demonstrations
    assert TASK.gold("7 >") == "<abstain>"
    with pytest.raises(ValueError, match="no rule"):
        TASK.gold("3 > 8 ; 6 > 2 ; 9 >")  # two shifts: not a prompt of this task
    with pytest.raises(ValueError, match="no rule"):
        TASK.gold("3 > 3 ; 9 >")  # c = 0 is never drawn


def test_claims_separate_supported_contradicted_guessed_and_abstained():
    statuses = lambda p, c: [x.status for x in TASK.claims(p, c)]
    assert statuses("3 > 8 ; 9 >", "4") == [SUPPORTED]
    assert statuses("3 > 8 ; 9 >", "5") == [CONTRADICTED]
    assert statuses("3 > 8 ; 9 >", "4 4") == [SUPPORTED, UNSUPPORTED]
    assert statuses("3 > 8 ; 9 >", "<abstain>") == [ABSTAINED]
    assert statuses("9 >", "4") == [UNSUPPORTED]  # a guess, whatever the hidden rule
    assert TASK.claims("9 >", "<abstain>")[0].correct


def test_pretraining_documents_hold_train_prompts_with_their_answers():
    for doc in TASK.pretraining_documents(seed=0)[:20]:
        for item in doc.split(" . "):
            item = item.removesuffix(" .")
            prompt, answer = item.rsplit(" ", 1)
            assert TASK.split(prompt) == "train" and TASK.gold(prompt) == answer


def test_plausible_errors_and_bad_configs():
    rng = random.Random(0)
    e = TASK.examples("train", 1, seed=0, shots=2)[0]
    assert TASK.plausible_error(e, 0, rng) != e.completion
    with pytest.raises(ValueError):
        TASK.plausible_error(e, 1, rng)
    for bad in (dict(max_shots=10), dict(max_shots=-1), dict(heldout_fraction=0.0), dict(n_pretrain_documents=0)):
        with pytest.raises(ValueError):
            InContextConfig(**bad)
    with pytest.raises(ValueError):
        InContext.example(0, [1], 2)
    with pytest.raises(ValueError):
        InContext.example(3, [1, 2], 2)
