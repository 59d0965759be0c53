"""Training data: completion-only labels, padding, packing, batch streams, rollouts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.training.data import (IGNORE, Encoded, batches, encode_document, encode_example, pack, pad,
                             prompt_rounds, rollout_batch)
from halluc_lab.training.losses import causal_lm_loss
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, Example
from tests.unit._tiny_lm import small_transformer

TASK = Arithmetic(ArithmeticConfig(max_digits=3))
TOK = TASK.tokenizer()


def test_completion_only_labels_mask_the_prompt_with_minus_100():
    enc = encode_example(TOK, Example("1 2 + 3 =", "1 5"))
    n_prompt = 1 + 5  # <bos> and five prompt symbols
    assert enc.labels[:n_prompt] == (IGNORE,) * n_prompt
    assert enc.labels[n_prompt:] == enc.ids[n_prompt:] == (*TOK.encode("1 5"), TOK.eos_id)
    full = encode_example(TOK, Example("1 2 + 3 =", "1 5"), completion_only=False)
    assert full.labels == (IGNORE, *full.ids[1:])
    doc = encode_document(TOK, "1 + 1 = 2 .")
    assert doc.ids[0] == TOK.bos_id and doc.ids[-1] == TOK.eos_id and doc.labels[1:] == doc.ids[1:]


def test_pad_puts_minus_100_on_padding():
    seqs = [encode_example(TOK, Example("1 + 1 =", "2")), encode_example(TOK, Example("1 2 + 3 4 =", "4 6"))]
    b = pad(seqs, TOK.pad_id)
    assert b.input_ids.shape == (2, len(seqs[1].ids))
    assert (b.labels[0, len(seqs[0].ids):] == IGNORE).all() and (b.input_ids[0, len(seqs[0].ids):] == TOK.pad_id).all()
    with pytest.raises(ValueError, match="length must be"):
        pad(seqs, TOK.pad_id, length=3)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(2, 9), min_size=1, max_size=12), st.integers(9, 20))
def test_pack_keeps_every_sequence_whole_with_its_own_positions(lengths, length):
    seqs = [Encoded(tuple(range(10 * i, 10 * i + n)), (IGNORE, *range(10 * i + 1, 10 * i + n)))
            for i, n in enumerate(lengths)]
    b = pack(seqs, length, pad_id=0)
    found = []
    for r in range(b.input_ids.shape[0]):
        for s in b.segment_ids[r].unique().tolist():
            if s == 0:
                continue
            at = (b.segment_ids[r] == s).nonzero().flatten()
            assert (at == torch.arange(at[0], at[0] + len(at))).all()  # contiguous
            assert b.position_ids[r, at].tolist() == list(range(len(at)))  # positions restart at 0
            found.append((tuple(b.input_ids[r, at].tolist()), tuple(b.labels[r, at].tolist())))
    assert sorted(found) == sorted((s.ids, s.labels) for s in seqs)
    assert b.labels[b.segment_ids == 0].eq(IGNORE).all()
    assert b.input_ids.shape[0] <= len(seqs)


def test_packing_reduces_the_number_of_rows():
    seqs = [encode_example(TOK, e) for e in TASK.examples("train", 40, seed=0)]
    assert pack(seqs, 64, TOK.pad_id).input_ids.shape[0] < len(seqs) / 3


def test_pack_rejects_a_sequence_longer_than_a_row():
    with pytest.raises(ValueError, match="length must be"):
        pack([Encoded((1, 2, 3), (IGNORE, 2, 3))], 2, pad_id=0)


def test_batches_are_a_deterministic_function_of_the_step():
    rows = pad([encode_example(TOK, e) for e in TASK.examples("train", 20, seed=0)], TOK.pad_id)
    a, b = batches(rows, 6, seed=3), batches(rows, 6, seed=3)
    for step in (0, 2, 3, 7, 2):
        assert torch.equal(a(step).input_ids, b(step).input_ids)
    epoch0 = torch.cat([a(s).input_ids for s in range(3)])  # 3 batches of 6 from 20 rows, no repeats
    assert len({tuple(r) for r in epoch0.tolist()}) == len({tuple(r) for r in rows.input_ids.tolist()} &
                                                           {tuple(r) for r in epoch0.tolist()}) == 18
    with pytest.raises(ValueError, match="batch_size"):
        batches(rows, 21, seed=0)


# -- backspace demonstrations ------------------------------------------------------------------
def _model(seed=0):
    return small_transformer(TOK.vocab_size, seed)


def test_packed_logits_equal_the_logits_of_each_sequence_alone():
    model = _model()
    seqs = [encode_example(TOK, e) for e in TASK.examples("train", 10, seed=0)]
    packed, alone = pack(seqs, 40, TOK.pad_id), pad(seqs, TOK.pad_id)
    assert packed.input_ids.shape[0] < len(seqs)
    with torch.no_grad():
        z_packed = model(packed.input_ids, segment_ids=packed.segment_ids, position_ids=packed.position_ids)
        z_alone = model(alone.input_ids)
    for r in range(packed.input_ids.shape[0]):
        for s in set(packed.segment_ids[r].tolist()) - {0}:
            where = (packed.segment_ids[r] == s).nonzero().flatten()
            i = next(i for i, e in enumerate(seqs) if tuple(packed.input_ids[r, where].tolist()) == e.ids)
            torch.testing.assert_close(z_packed[r, where], z_alone[i, :len(where)], rtol=1e-5, atol=1e-5)


def test_packed_and_padded_batches_give_the_same_loss():
    model = _model(1)
    seqs = [encode_example(TOK, e) for e in TASK.examples("train", 10, seed=1)]
    packed, alone = pack(seqs, 40, TOK.pad_id), pad(seqs, TOK.pad_id)
    with torch.no_grad():
        a = causal_lm_loss(model(packed.input_ids, **packed.model_kwargs()), packed.labels)
        b = causal_lm_loss(model(alone.input_ids), alone.labels)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)




def test_rollout_batch_puts_labels_on_the_completion_only():
    b = rollout_batch([[1, 5, 6], [1, 7]], [[8, 2], [9, 9, 2]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 5, 6, 8, 2], [1, 7, 9, 9, 2]]
    assert b.labels.tolist() == [[IGNORE, IGNORE, IGNORE, 8, 2], [IGNORE, IGNORE, 9, 9, 2]]
    masked = rollout_batch([[1, 7]], [[9, 9, 2]], pad_id=0, targets=[[True, False, True]])
    assert masked.labels.tolist() == [[IGNORE, IGNORE, 9, IGNORE, 2]]


@pytest.mark.parametrize("args, match", [(([[1]], [[2], [3]]), "same length"), (([[]], [[2]]), "empty"),
                                         (([[1]], [[2, 3]], [[True]]), "targets\\[0\\]")])
def test_bad_rollouts_raise(args, match):
    prompts, completions, *targets = args
    with pytest.raises(ValueError, match=match):
        rollout_batch(prompts, completions, 0, *targets)


# -- bad inputs: named, never a hang or a silently misaligned batch ----------------------------
SEQ = Encoded((1, 5, 2), (IGNORE, 5, 2))


@pytest.mark.parametrize("call, match", [
    (lambda: next(prompt_rounds(0, 2, torch.Generator())), "n must be an int >= 1"),  # a hang
    (lambda: next(prompt_rounds(3, 0, torch.Generator())), "per_round must be an int >= 1"),
    (lambda: Encoded((1, 2), (1,)), "labels must have one entry per id"),
    (lambda: pad([Encoded((1.5, 2), (1, 2))], 0), "ids must be integer token ids"),
    (lambda: pad([SEQ], None), "pad_id must be an int"),
    (lambda: pad([SEQ], 0.5), "pad_id must be an int"),
    (lambda: pad([SEQ], 0, length=4.0), "length must be an int"),
    (lambda: pack([SEQ], "4", 0), "length must be an int"),
    (lambda: batches(pad([SEQ, SEQ], 0), 1, None), "seed must be an int"),
    (lambda: batches(pad([SEQ, SEQ], 0), 1, "0"), "seed must be an int"),
    (lambda: batches(pad([SEQ, SEQ], 0), 1, 0)(-1), "step must be an int >= 0"),
])
def test_bad_data_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_pad_refuses_items_that_are_not_encoded_sequences():
    with pytest.raises(TypeError, match=r"seqs\[0\] is tuple"):
        pad([(1, 2)], 0)


def test_numpy_integers_are_accepted_where_python_ints_are():
    import numpy as np

    want = pad([SEQ], 0, length=4).input_ids
    assert torch.equal(pad([SEQ], np.int64(0), length=np.int64(4)).input_ids, want)
    assert torch.equal(pack([SEQ], np.int64(4), 0).input_ids, pack([SEQ], 4, 0).input_ids)
    rows = pad([SEQ, SEQ], 0)
    assert torch.equal(batches(rows, np.int64(1), np.int64(3))(np.int64(1)).input_ids,
                       batches(rows, 1, 3)(1).input_ids)
