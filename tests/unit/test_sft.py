"""SFT data and loss: masking, padding, packing, the loss, label smoothing, backspace, scheduled sampling."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.sft import (IGNORE, BackspaceConfig, Encoded, backspace_demonstration, batches,
                            causal_lm_loss, encode_document, encode_example, label_smoothed_nll, pack, pad,
                            scheduled_sampling)
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, Example, KBWalk, KBWalkConfig, completion_symbols
from tests.unit._tiny_lm import TinyConfig, TinyLM

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


def test_loss_is_equation_9_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, 3, 1, IGNORE, 6], [IGNORE, IGNORE, 2, 2, 0]])
    logp = torch.log_softmax(logits, -1)
    terms = [-logp[b, t - 1, labels[b, t]] for b in range(2) for t in range(1, 5 + 0) if labels[b, t] != IGNORE]
    assert causal_lm_loss(logits, labels, reduction="sum").item() == pytest.approx(sum(terms).item(), rel=1e-12)
    assert causal_lm_loss(logits, labels).item() == pytest.approx(sum(terms).item() / len(terms), rel=1e-12)


def test_gradient_with_respect_to_logits_is_p_minus_onehot():
    torch.manual_seed(1)
    z = torch.randn(1, 2, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[IGNORE, 4]])
    causal_lm_loss(z, labels).backward()
    expected = torch.softmax(z[0, 0].detach(), -1) - F.one_hot(torch.tensor(4), 6)  # 000 §5.5
    torch.testing.assert_close(z.grad[0, 0], expected.double())
    assert torch.all(z.grad[0, 1] == 0)  # the last position predicts nothing


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 0.9), st.integers(0, 1000))
def test_label_smoothing_matches_the_reference_and_pytorch(eps, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 9, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (1, 9), generator=g)
    labels[0, 0] = IGNORE
    ours = causal_lm_loss(logits, labels, label_smoothing=eps)
    ref = label_smoothed_nll(logits[0, :-1], labels[0, 1:], eps)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_label_smoothing_with_uniform_logits_is_log_k():
    logits = torch.zeros(1, 2, 8)
    assert causal_lm_loss(logits, torch.tensor([[IGNORE, 3]]), label_smoothing=0.3).item() == pytest.approx(math.log(8))


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
def _model(seed=0):
    from halluc_lab.model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_positions=64, init_std=0.1)
    return Transformer(cfg, seed=seed).eval()


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


def test_greedy_completion_is_what_teacher_forcing_predicts():
    from halluc_lab.sft import complete, teacher_forced

    model = _model(2)
    prompts = [e.prompt for e in TASK.examples("train", 6, seed=2)]
    outs = complete(model, TOK, prompts, 5)
    for p, o in zip(prompts, outs):
        words = o.split()
        body = words[:-1] if words[-1] == "<eos>" else words
        tf = teacher_forced(model, TOK, [Example(p, " ".join(body))])
        n = len(words)  # the generated tokens, <eos> included when it was generated
        assert all(tf.correct[0][:n])
        assert all(lp <= 0 for lp in tf.logprobs[0])
