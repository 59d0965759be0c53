"""The backspace controller: log-probs in the context each token was sampled in, the text after take-backs,
training rows, masking, and bad input."""

import pytest
import torch

from halluc_lab.generation import sampling
from halluc_lab.generation.backtrack import BacktrackEngine, erase_text, rollout, training_rows
from halluc_lab.training.data import IGNORE, pad
from halluc_lab.generation.engine import SamplingParams
from halluc_lab.training.losses import token_logprobs
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer

V, BKSP, EOS = 61, 3, 2
HOT = SamplingParams(temperature=1.5)


def tiny(n_kv_heads=2, bksp_boost=0.0, seed=0) -> Transformer:
    """A random decoder; ``bksp_boost`` scales up <bksp>'s output row so it is sampled often."""
    config = ModelConfig(vocab_size=V, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                         max_positions=128, tie_embeddings=False, init_std=0.15)
    model = Transformer(config, seed=seed).eval()
    with torch.no_grad():
        model.lm_head.weight[BKSP] *= 1 + bksp_boost
    return model


def prompts(n=4, seed=0, lengths=(5, 2, 7, 1)):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(5, V, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def run(model, ps, context, *, forced=None, steps=24, n_samples=1, allow=True, params=HOT, seed=7):
    """Step a BacktrackEngine, forcing ``forced[step] = {row: token}``; its Rollout."""
    eng = BacktrackEngine(model, 16, 64, bksp_id=BKSP, context=context, allow_bksp=allow, cuda_graph=False)
    eng.start(ps, steps, params, generator=torch.Generator().manual_seed(seed), n_samples=n_samples)
    for i in range(steps):
        eng.step(force=(forced or {}).get(i))
    return eng.result()


@torch.no_grad()
def reference_logprobs(model, ps, out, context, n_samples=1):
    """log π of every logged token, recomputed without a cache from the rows of training_rows (all as targets)."""
    want = []
    for i, toks in enumerate(out.token_lists()):
        rows = training_rows(ps[i // n_samples], toks, [True] * len(toks), BKSP, context)
        batch = pad(rows, 0)
        lp = token_logprobs(model(batch.input_ids), batch.labels)  # (R, T-1)
        target = batch.labels[:, 1:] != IGNORE
        want.append(lp[target].tolist())  # rows in log order, targets left to right
    return want


FORCED = {2: {0: BKSP, 1: BKSP}, 3: {0: BKSP}, 6: {2: 9}, 7: {2: BKSP}, 8: {2: BKSP}, 9: {2: BKSP}, 0: {3: BKSP}}


@pytest.mark.parametrize("context", ["erase", "keep"])
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_logprobs_are_those_of_the_context_each_token_was_sampled_in(context, n_kv_heads):
    """erase: as if the erased tokens had never been sampled; keep: the explicit token sequence."""
    model, ps = tiny(n_kv_heads, bksp_boost=2.0), prompts()
    out = run(model, ps, context, forced=FORCED)
    assert sum(t == BKSP for row in out.token_lists() for t in row) > len(FORCED)  # sampled ones too
    for got, want in zip(out.logprobs.tolist(), reference_logprobs(model, ps, out, context)):
        assert got[:len(want)] == pytest.approx(want, abs=1e-5)


def test_erase_continues_exactly_as_a_run_that_never_sampled_the_erased_tokens():
    model, ps = tiny(), prompts(2)
    erased = run(model, ps, "erase", forced={0: {0: 11}, 1: {0: 12}, 2: {0: BKSP}, 3: {0: BKSP}, 4: {0: 13},
                                            5: {0: 14}}, steps=6)
    clean = run(model, ps, "erase", forced={0: {0: 13}, 1: {0: 14}}, steps=2)
    assert erased.text_lists()[0][0] == 13 == clean.text_lists()[0][0]
    assert erased.logprobs[0, 4].item() == pytest.approx(clean.logprobs[0, 0].item(), abs=1e-5)
    assert erased.logprobs[0, 5].item() == pytest.approx(clean.logprobs[0, 1].item(), abs=1e-5)


@pytest.mark.parametrize("context", ["erase", "keep"])
def test_text_is_the_log_with_take_backs_applied_and_alive_marks_it(context):
    model, ps = tiny(bksp_boost=2.0), prompts(3)
    out = run(model, ps, context, forced=FORCED, n_samples=2)
    texts = out.text_lists()
    assert texts == [erase_text(row, BKSP) for row in out.token_lists()]
    assert out.text_lengths.tolist() == [len(t) for t in texts] == out.alive.sum(1).tolist()
    assert not (out.alive & (out.tokens == BKSP)).any()
    on_host = out.to_host()()  # the same rollout, every field copied (a Rollout still)
    assert type(on_host) is type(out) and all(torch.equal(getattr(on_host, f), getattr(out, f)) for f in (
        "tokens", "logprobs", "sampled_mask", "lengths", "stopped", "alive", "text_lengths"))


def test_a_bksp_at_an_empty_answer_removes_nothing_and_the_row_goes_on_from_its_prompt():
    model, ps = tiny(), prompts(1)
    out = run(model, ps, "erase", forced={0: {0: BKSP}, 1: {0: 17}}, steps=3)
    plain = run(model, ps, "erase", forced={0: {0: 17}}, steps=2)
    assert out.token_lists()[0][:2] == [BKSP, 17] and out.text_lists()[0][0] == 17
    assert out.logprobs[0, 1].item() == pytest.approx(plain.logprobs[0, 0].item(), abs=1e-5)


def test_the_budget_counts_emitted_tokens_take_backs_included():
    model, ps = tiny(bksp_boost=3.0), prompts(4)
    out = rollout(model, ps, 10, bksp_id=BKSP, generator=torch.Generator().manual_seed(1), n_samples=4)
    assert out.lengths.max().item() == 10 and (out.lengths <= 10).all()
    assert (out.text_lengths < out.lengths).any()


def test_masked_bksp_is_never_emitted_and_log_probs_are_the_masked_policys():
    model, ps = tiny(bksp_boost=50.0), prompts(4)
    free = rollout(model, ps, 8, bksp_id=BKSP, generator=torch.Generator().manual_seed(2), n_samples=4)
    masked = rollout(model, ps, 8, bksp_id=BKSP, allow_bksp=False, generator=torch.Generator().manual_seed(2),
                     n_samples=4)
    assert (free.tokens == BKSP).float().mean() > 0.3
    assert not (masked.tokens == BKSP).any()
    with torch.no_grad():  # the first token: log-softmax of the prompt's logits with <bksp> removed
        logits = model(torch.tensor([ps[0]]))[0, -1]
        logits[BKSP] = float("-inf")
        want = sampling.log_softmax(logits[None])[0, masked.tokens[0, 0]]
    assert masked.logprobs[0, 0].item() == pytest.approx(want.item(), abs=1e-5)


def test_same_generator_state_same_rollouts_and_stop_tokens_end_rows():
    model, ps = tiny(bksp_boost=1.0), prompts(4)
    a, b = (rollout(model, ps, 12, bksp_id=BKSP, stop_tokens=(EOS, 7, 8, 9, 10), n_samples=2,
                    generator=torch.Generator().manual_seed(3)) for _ in range(2))
    assert a.token_lists() == b.token_lists()
    for row, stopped in zip(a.token_lists(), a.stopped.tolist()):
        assert stopped == (row[-1] in (EOS, 7, 8, 9, 10))
        assert not any(t in (EOS, 7, 8, 9, 10) for t in row[:-1])


def test_training_rows_make_every_sampled_token_a_target_once():
    tokens, sampled = [5, 6, BKSP, BKSP, 7, 8, BKSP, 9, 2], [True, False, True, True, True, True, False, True, True]
    rows = training_rows([1, 4], tokens, sampled, BKSP, "erase")
    assert [(r.ids, r.labels) for r in rows] == [
        ((1, 4, 5, 6, BKSP), (IGNORE, IGNORE, 5, IGNORE, BKSP)),  # 6 was forced: context, not a target
        ((1, 4, 5, BKSP), (IGNORE, IGNORE, IGNORE, BKSP)),  # the second <bksp> erases 5, sampled after <bos> 4
        ((1, 4, 7, 8, BKSP), (IGNORE, IGNORE, 7, 8, IGNORE)),  # a forced <bksp> is no target; 7 and 8 are
        ((1, 4, 7, 9, 2), (IGNORE, IGNORE, IGNORE, 9, 2))]  # the final text: only 9 and <eos> are new
    keep = training_rows([1, 4], tokens, sampled, BKSP, "keep")
    assert keep[0].ids == (1, 4, *tokens)
    assert [t for t in keep[0].labels if t != IGNORE] == [t for t, s in zip(tokens, sampled) if s]


def test_a_forced_bksp_leaves_the_erased_token_a_target_in_its_branch():
    rows = training_rows([1], [7, 8, BKSP, 9], [True, True, False, True], BKSP, "erase")
    assert [(r.ids, r.labels) for r in rows] == [((1, 7, 8, BKSP), (IGNORE, 7, 8, IGNORE)), ((1, 7, 9), (IGNORE, IGNORE, 9))]


@pytest.mark.parametrize("call, error, match", [
    (lambda m: BacktrackEngine(m, 2, 16, bksp_id=V), ValueError, "bksp_id"),
    (lambda m: BacktrackEngine(m, 2, 16, bksp_id=True), ValueError, "bksp_id"),
    (lambda m: BacktrackEngine(m, 2, 16, bksp_id=BKSP, context="undo"), ValueError, "context"),
    (lambda m: BacktrackEngine(m, 2, 16, bksp_id=BKSP, allow_bksp=1), TypeError, "allow_bksp"),
    (lambda m: rollout(m, [[1, 5]], 0, bksp_id=BKSP), ValueError, "max_new_tokens"),
    (lambda m: rollout(m, [], 4, bksp_id=BKSP), ValueError, "at least one prompt"),
    (lambda m: training_rows([1], [5], [True, True], BKSP, "erase"), ValueError, "one length"),
    (lambda m: training_rows([], [5], [True], BKSP, "erase"), ValueError, "prompt"),
])
def test_bad_input_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call(tiny())


def test_rollback_is_not_offered():
    eng = BacktrackEngine(tiny(), 2, 16, bksp_id=BKSP)
    eng.start([[1, 5]], 4, HOT)
    with pytest.raises(NotImplementedError, match="bksp"):
        eng.rollback([0], 1)


@pytest.mark.gpu
@pytest.mark.parametrize("context, allow", [("erase", True), ("keep", True), ("keep", False)])
def test_cuda_graph_rollouts_equal_eager_ones(context, allow):
    """Graphed, and graphed with the step fused (compiled): the same draws from the same generator; in fp32 on
    this tiny model no sampled token sits within rounding of a boundary, so the rollouts are the same."""
    model, ps = tiny(n_kv_heads=1, bksp_boost=2.0).cuda(), prompts(6)
    results = []
    for graph, fused in ((False, False), (True, False), (True, True)):
        eng = BacktrackEngine(model, 16, 64, bksp_id=BKSP, context=context, allow_bksp=allow, cuda_graph=graph,
                              fused=fused)
        eng.start(ps, 24, HOT, generator=torch.Generator("cuda").manual_seed(5), n_samples=2)
        for i in range(24):
            eng.step(force=FORCED.get(i))
        results.append(eng.result())
    eager = results[0]
    for other in results[1:]:
        assert other.token_lists() == eager.token_lists()
        assert torch.equal(other.alive, eager.alive)
        torch.testing.assert_close(other.logprobs, eager.logprobs, atol=1e-4, rtol=0)
