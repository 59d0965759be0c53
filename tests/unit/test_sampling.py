"""halluc_lab.generation.sampling: softmax with temperature, greedy, top-k, top-p, sampling, beam search."""

import functools
import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from halluc_lab.generation import decoding as D
from halluc_lab.generation import sampling as S

FAST = settings(max_examples=30, deadline=None)


def random_logits(shape, seed, dtype=torch.float64, scale=3.0, masked=0):
    """Random logits; ``masked`` entries of each row (after the first) set to -inf."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g, dtype=dtype) * scale
    if masked:
        z[..., 1:1 + masked] = -math.inf
    return z


def markov_step(table):
    """A bigram model as a step function: the next-token logits depend on the last token."""
    return lambda tokens: table[tokens[:, -1]]


logit_rows = st.lists(st.floats(-30, 30), min_size=1, max_size=12)
seeds = st.integers(0, 2**31 - 1)


# --- softmax, log_softmax, entropy ---------------------------------------------------------

def test_worked_example_of_001_part3_at_three_temperatures():
    z = torch.tensor([2.0, 1.0, 0.1], dtype=torch.float64)
    e = torch.exp(z)
    for tau in (1.0, 0.5, 2.0):
        expected = torch.exp(z / tau) / torch.exp(z / tau).sum()
        assert torch.allclose(S.softmax(z, tau), expected, atol=1e-15)
    assert torch.allclose(S.softmax(z), e / e.sum(), atol=1e-15)
    assert S.softmax(z)[0].item() == pytest.approx(0.659, abs=5e-4)


@FAST
@given(seed=seeds, tau=st.floats(0.05, 20.0))
def test_softmax_and_log_softmax_agree_with_torch(seed, tau):
    z = random_logits((3, 4, 7), seed, masked=2)
    assert torch.allclose(S.softmax(z, tau), torch.softmax(z / tau, dim=-1), atol=1e-12)
    expected = torch.log_softmax(z / tau, dim=-1)
    got = S.log_softmax(z, tau)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-12)


def test_temperature_matches_hugging_face_temperature_warper():
    z = random_logits((5, 11), 0, dtype=torch.float32)
    for tau in (0.3, 1.0, 1.7):
        hf = TemperatureLogitsWarper(tau)(None, z.clone())
        assert torch.allclose(S.softmax(z, tau), torch.softmax(hf, dim=-1), atol=1e-6)


def test_extreme_logits_and_temperature_are_stable():
    z = torch.tensor([[1e4, -1e4, 0.0, -math.inf], [-1e4, -1e4 + 1e-3, -math.inf, -1e4]])
    for tau in (1e-4, 1.0, 1e4):
        p = S.softmax(z, tau)
        assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(2))
        assert p[0, 3] == 0 and p[1, 2] == 0  # the -inf entries
        lp = S.log_softmax(z, tau)
        assert not torch.isnan(lp).any()
        assert torch.isfinite(S.entropy(z, tau)).all()
    assert S.softmax(z, 1e-4)[0, 0] == 1.0 and S.log_softmax(z, 1e-4)[0, 0] == 0.0


def test_bf16_logits_at_small_temperature_do_not_overflow():
    z = torch.tensor([3.0e4, 1.0e4, -2.0e4], dtype=torch.bfloat16)
    p = S.softmax(z, 1e-4)
    assert p.dtype == torch.float32 and torch.equal(p, torch.tensor([1.0, 0.0, 0.0]))


def test_entropy_in_nats_and_bits_delegates_to_information():
    from halluc_lab.foundations import information

    z = random_logits((4, 9), 1, masked=3)
    for unit in ("nats", "bits"):
        assert torch.allclose(S.entropy(z, 0.7, unit), information.entropy(S.softmax(z, 0.7), -1, unit))
    assert S.entropy(torch.zeros(8, dtype=torch.float64), unit="bits").item() == pytest.approx(3.0, abs=1e-12)
    with pytest.raises(ValueError, match="unit"):
        S.entropy(z, unit="decibans")


@FAST
@given(row=logit_rows)
def test_entropy_grows_with_temperature(row):
    # dH/dτ = Var_p(z) / τ³ ≥ 0 (derived in the chapter)
    z = torch.tensor(row, dtype=torch.float64)
    taus = torch.tensor([0.25, 0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    h = S.entropy(z.expand(5, -1), taus)  # one temperature per row
    assert (h[1:] - h[:-1] >= -1e-12).all()


# --- temperature limits (000 Proposition 1, §2.4 table, 001 remark iv) -----------------------

@FAST
@given(row=logit_rows, seed=seeds)
def test_temperature_to_zero_is_greedy(row, seed):
    z = torch.tensor(row, dtype=torch.float64)
    top2 = z.topk(min(2, len(row))).values
    gap = (top2[0] - top2[-1]).item() if len(row) > 1 else 1.0
    assume(gap > 1e-3)
    tau = gap / 200  # the runner-up is e^-200 times less likely
    p = S.softmax(z, tau)
    assert p[S.greedy(z)].item() == pytest.approx(1.0, abs=1e-12)
    g = torch.Generator().manual_seed(seed)
    draws = S.sample(z.expand(50, -1), tau, generator=g)
    assert (draws == S.greedy(z)).all()


@FAST
@given(row=logit_rows)
def test_temperature_to_infinity_is_uniform(row):
    z = torch.tensor(row, dtype=torch.float64)
    V, spread, tau = len(row), (z.max() - z.min()).item(), 1e6
    p = S.softmax(z, tau)
    # every p_v lies in [e^(-spread/τ), e^(spread/τ)] / V
    bound = math.expm1(spread / tau) / V + 1e-15
    assert (p - 1 / V).abs().max().item() <= bound


# --- greedy, top-k, top-p --------------------------------------------------------------------

def test_greedy_is_the_argmax_over_leading_dimensions():
    z = random_logits((2, 3, 5), 2)
    assert torch.equal(S.greedy(z), z.argmax(-1))
    assert S.greedy(torch.tensor([1.0, 3.0, 3.0])).item() == 1  # ties: the lower index


@FAST
@given(row=logit_rows, n_masked=st.integers(0, 3))
def test_top_k_of_v_and_top_p_of_one_change_nothing(row, n_masked):
    z = torch.tensor(row)
    z[1:1 + n_masked] = -math.inf
    assert torch.equal(S.top_k_filter(z, len(row)), z)
    assert torch.equal(S.top_k_filter(z, len(row) + 5), z)
    assert torch.equal(S.top_p_filter(z, 1.0), z)


def test_top_p_of_one_keeps_a_token_whose_mass_rounds_away():
    z = torch.tensor([0.0, -30.0])  # p(second) = 9e-14: the mass above it rounds to 1 in float32
    assert torch.equal(S.top_p_filter(z, 1.0), z)


@FAST
@given(seed=seeds, k=st.integers(1, 12))
def test_top_k_matches_hugging_face_top_k_warper(seed, k):
    z = random_logits((4, 10), seed, dtype=torch.float32)
    assert torch.equal(S.top_k_filter(z, k), TopKLogitsWarper(k)(None, z.clone()))


@FAST
@given(seed=seeds, p=st.floats(0.01, 1.0))
def test_top_p_matches_hugging_face_top_p_warper(seed, p):
    z = random_logits((4, 10), seed, dtype=torch.float32)
    # Skip draws where a partial sum lies within float32 rounding of p: there the two
    # summation orders (HF sums from the bottom) may legitimately disagree.
    mass = torch.softmax(z.double(), -1).sort(-1, descending=True).values.cumsum(-1)
    assume(((mass - p).abs() > 1e-5).all())
    assert torch.equal(S.top_p_filter(z, p), TopPLogitsWarper(p)(None, z.clone()))


def test_top_p_keeps_the_token_that_crosses_p():
    # 001's worked example: 0.659 < 0.9 ≤ 0.659 + 0.242, so Definition 7 keeps {cat, ball}
    z = torch.tensor([2.0, 1.0, 0.1], dtype=torch.float64)
    assert torch.isfinite(S.top_p_filter(z, 0.9)).tolist() == [True, True, False]
    assert torch.isfinite(S.top_p_filter(z, 0.659)).tolist() == [True, False, False]
    # reaching p exactly is enough (≥, not >): 0.5 + 0.25 = 0.75
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).log()
    assert torch.isfinite(S.top_p_filter(q, 0.75)).sum().item() == 2


@FAST
@given(row=logit_rows, p=st.floats(0.01, 1.0))
def test_top_p_set_is_the_smallest_prefix_reaching_p(row, p):
    z = torch.tensor(row, dtype=torch.float64)
    probs = S.softmax(z)
    kept = torch.isfinite(S.top_p_filter(z, p))
    order = z.argsort(descending=True, stable=True)  # the ranking, ties broken by index
    n = int(kept.sum())
    assert kept[order[:n]].all()  # a prefix of the ranking
    assert probs[kept].sum().item() >= p - 1e-12 or n == len(row)
    # one token fewer falls short (p = 1 keeps everything, even where float sums round to 1)
    assert n == 1 or p == 1.0 or probs[order[:n - 1]].sum().item() < p


def test_top_k_keeps_exactly_k_when_tied():
    z = torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0])
    assert torch.isfinite(S.top_k_filter(z, 2)).tolist() == [False, True, True, False, False]
    assert torch.isfinite(TopKLogitsWarper(2)(None, z[None].clone())).sum() == 3  # HF keeps the ties


def test_per_row_parameters_equal_row_by_row_calls():
    z = random_logits((3, 8), 3)
    taus, ks, ps = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1, 3, 8]), torch.tensor([0.3, 0.8, 1.0])
    batched = S.filter_logits(z, taus, ks, ps)
    for i in range(3):
        row = S.filter_logits(z[i], taus[i].item(), int(ks[i]), ps[i].item())
        assert torch.equal(batched[i], row)


def test_filters_keep_dtype_and_leading_dimensions():
    z = random_logits((2, 3, 6), 4, dtype=torch.bfloat16)
    for out in (S.top_k_filter(z, 2), S.top_p_filter(z, 0.5)):
        assert out.dtype == torch.bfloat16 and out.shape == z.shape


# --- sampling ----------------------------------------------------------------------------------

SAMPLERS = pytest.mark.parametrize("sampler", [S.sample, S.gumbel_max_sample], ids=["fast", "reference"])


@SAMPLERS
@pytest.mark.parametrize("top_k, top_p", [(None, None), (3, None), (None, 0.8), (4, 0.9)])
def test_sampling_frequencies_converge_to_the_probabilities(sampler, top_k, top_p):
    z = torch.tensor([1.5, 1.0, 0.2, -0.3, 0.0, -1.0])
    probs = S.softmax(S.filter_logits(z, 0.8, top_k, top_p)).double()
    n = 40_000
    g = torch.Generator().manual_seed(1234)
    draws = sampler(z.expand(n, -1), 0.8, top_k, top_p, generator=g)
    counts = torch.bincount(draws, minlength=len(z)).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0  # nothing outside the kept set, ever
    expected = n * probs[kept] / probs[kept].sum()
    chi2 = stats.chisquare(counts[kept].numpy(), expected.numpy())
    assert chi2.pvalue > 1e-3, chi2


@SAMPLERS
def test_sample_is_deterministic_given_a_generator(sampler):
    z = random_logits((64, 20), 5)
    draw = lambda seed: sampler(z, 1.3, top_k=10, top_p=0.95, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))
    assert draw(7).shape == (64,) and draw(7).dtype == torch.long


@SAMPLERS
@pytest.mark.parametrize("top_k, top_p", [(None, None), (5, None), (5, 1.0), (None, 0.999999), (6, 0.999999)])
def test_sample_never_draws_a_masked_token(sampler, top_k, top_p):
    z = random_logits((2000, 6), 6, masked=4)
    draws = sampler(z, 5.0, top_k, top_p, generator=torch.Generator().manual_seed(0))
    assert ((draws == 0) | (draws == 5)).all()


# --- the fast path (sample) against the definition (filter_logits, gumbel_max_sample) ---------------

def implied_distribution(logits, tau, k, p):
    """softmax(filter_logits(...)) as the fast path sees it: ranked probabilities, top-p's drops, order."""
    probs, drop, order = S._ranked_probs(logits, tau, k, p, validate=True)  # (..., W)
    w = probs.clone()
    if drop is not None:
        w[..., 1:] = w[..., 1:].masked_fill(drop, 0.0)
    if order is not None:
        w = torch.zeros(logits.shape, dtype=w.dtype).scatter(-1, order, w)  # back to token order
    return w / w.sum(-1, keepdim=True)


def partial_sums(logits, tau, k):
    """Per row, the cumulative masses that top_p_filter compares p with (top-k applied first)."""
    z = S.filter_logits(logits, tau, k, None)
    return torch.softmax(z.sort(dim=-1, descending=True, stable=True).values, -1).cumsum(-1)  # (..., V)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, V=st.one_of(st.integers(1, 12), st.sampled_from([100, 513])),  # long rows: vectorised sums
       dtype=st.sampled_from([torch.float32, torch.float64]),
       ties=st.booleans(), masked=st.integers(0, 3), per_row=st.booleans(),
       tau=st.sampled_from([1.0, 0.6, 2.5]), k=st.sampled_from([None, 1, 2, 5, 20, 50]),
       p_mode=st.sampled_from([None, "random", "on a partial sum", "one"]))
def test_fast_path_keeps_exactly_the_reference_set_with_the_same_probabilities(
        seed, V, dtype, ties, masked, per_row, tau, k, p_mode):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randint(0, 3, (4, V), generator=g).to(dtype) if ties  # tied logits test top-k's tie rule
         else torch.randn(4, V, generator=g, dtype=dtype) * 3)
    z[:, 1:1 + masked] = -math.inf
    if p_mode is None:
        p = None
    elif p_mode == "one":
        p = 1.0
    elif p_mode == "random":
        p = float(torch.rand((), generator=g, dtype=torch.float64)) * 0.99 + 0.01
    else:  # p lands exactly on a cumulative mass: the ≥ p boundary of Definition 7
        j = int(torch.randint(0, V, (), generator=g))
        p = float(partial_sums(z[:1], tau, k)[0, j])
        assume(0 < p <= 1)
    if per_row:  # one knob per row, as tensors
        tau = torch.full((4,), tau, dtype=dtype)
        k = None if k is None else torch.tensor([k, 1, k + 3, V])
        p = None if p is None else torch.tensor([p, 1.0, 0.5, p], dtype=dtype)
    want = S.softmax(S.filter_logits(z, tau, k, p))  # (4, V)
    got = implied_distribution(z, tau, k, p)
    assert torch.equal(got > 0, want > 0)  # the same kept set, bit for bit
    assert torch.allclose(got, want, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)


@pytest.mark.parametrize("k", [3, 10, 40])
def test_fast_path_agrees_with_top_p_filter_with_p_on_every_partial_sum(k):
    # Every row's p is one of its own cumulative masses, so every row sits on Definition 7's ≥ p
    # boundary, where a last-bit difference in the masses would change the kept set.
    z = random_logits((600, 100), 12, dtype=torch.float32)
    masses = partial_sums(z, 0.7, k)  # (600, 100)
    p = masses[torch.arange(600), torch.arange(600) % k].clamp_max(1.0)  # (600,)
    want = S.softmax(S.filter_logits(z, 0.7, k, p)) > 0
    assert torch.equal(implied_distribution(z, 0.7, k, p) > 0, want)
    assert torch.equal(implied_distribution(z, 0.7, torch.full((600,), k), p) > 0, want)


def test_fast_path_with_p_of_one_keeps_a_token_whose_mass_rounds_away():
    z = torch.tensor([[0.0, -30.0]])  # p(second) = 9e-14: the mass above it rounds to 1 in float32
    for p in (1.0, torch.tensor([1.0])):
        assert (implied_distribution(z, 1.0, None, p) > 0).all()
        assert (implied_distribution(z, 1.0, torch.tensor([2]), p) > 0).all()


@SAMPLERS
def test_per_row_knobs_sample_each_rows_own_distribution(sampler):
    z = torch.tensor([1.5, 1.0, 0.2, -0.3, 0.0, -1.0])
    knobs = [(0.8, 3, 1.0), (1.0, 6, 0.8), (2.0, 4, 0.9)]  # (τ, k, p) per block of rows
    n = 20_000
    taus, ks, ps = (torch.tensor([c[i] for c in knobs]).repeat_interleave(n) for i in range(3))
    draws = sampler(z.expand(3 * n, -1), taus, ks, ps, generator=torch.Generator().manual_seed(99))
    for i, (tau, k, p) in enumerate(knobs):
        probs = S.softmax(S.filter_logits(z, tau, k, p)).double()
        counts = torch.bincount(draws[i * n:(i + 1) * n], minlength=len(z)).double()
        kept = probs > 0
        assert counts[~kept].sum() == 0
        chi2 = stats.chisquare(counts[kept].numpy(), (n * probs[kept] / probs[kept].sum()).numpy())
        assert chi2.pvalue > 1e-3, (i, chi2)


def test_fast_sample_keeps_leading_dimensions_and_takes_half_precision():
    z = random_logits((2, 3, 7), 11, dtype=torch.bfloat16)
    for k, p in [(None, None), (3, None), (None, 0.7), (2, 0.9), (torch.full((2, 3), 4), torch.full((2, 3), 0.5))]:
        draws = S.sample(z, 0.9, k, p, generator=torch.Generator().manual_seed(0))
        assert draws.shape == (2, 3) and draws.dtype == torch.long
        assert torch.isfinite(S.filter_logits(z, 0.9, k, p).gather(-1, draws[..., None])).all()


# --- decode and beam search --------------------------------------------------------------------

def exhaustive_best(table, prompt, length):
    logp = torch.log_softmax(table, -1)
    best = max(itertools.product(range(table.shape[0]), repeat=length),
               key=lambda seq: sum(logp[a, b].item() for a, b in zip((prompt, *seq), seq)))
    return list(best), sum(logp[a, b].item() for a, b in zip((prompt, *best), best))


@FAST
@given(seed=seeds, V=st.integers(2, 6), length=st.integers(1, 5))
def test_beam_width_one_is_greedy(seed, V, length):
    table = random_logits((V, V), seed)
    step = markov_step(table)
    beams = D.beam_search(step, torch.tensor([0]), 1, length)
    assert torch.equal(beams.tokens[0], D.decode(step, torch.tensor([0]), length))


@FAST
@given(seed=seeds, V=st.integers(2, 4), length=st.integers(1, 4))
def test_a_beam_as_wide_as_the_search_space_finds_the_most_probable_sequence(seed, V, length):
    table = random_logits((V, V), seed)
    beams = D.beam_search(markov_step(table), torch.tensor([0]), V ** length, length)
    _, best = exhaustive_best(table, 0, length)
    found = beams.tokens[0].tolist()
    logp = torch.log_softmax(table, -1)
    # compare log-probs, not sequences: reordered transitions of a Markov chain can tie exactly
    assert sum(logp[a, b].item() for a, b in zip(found, found[1:])) == pytest.approx(best, abs=1e-9)
    assert beams.scores[0].item() == pytest.approx(best, abs=1e-9)


def test_beam_search_finds_what_greedy_misses():
    # 003 §1: a locally likelier first token need not start the likeliest sequence.
    p = torch.tensor([[0.0, 0.6, 0.4, 0.0, 0.0],    # start -> A 0.6, B 0.4
                      [0.0, 0.0, 0.0, 0.5, 0.5],    # A -> x 0.5 or y 0.5
                      [0.0, 0.0, 0.0, 0.9, 0.1],    # B -> x 0.9
                      [1.0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0]], dtype=torch.float64)
    step = markov_step(p.log())
    greedy = D.decode(step, torch.tensor([0]), 2)
    beams = D.beam_search(step, torch.tensor([0]), 2, 2)
    assert greedy.tolist() == [0, 1, 3]
    assert beams.tokens[0].tolist() == [0, 2, 3]
    assert math.exp(beams.log_probs[0].item()) == pytest.approx(0.36)


def test_beam_scores_are_sorted_and_recomputable_with_length_bonus_and_eos():
    V, eos, lam = 5, 4, 0.7
    table = random_logits((V, V), 9)
    table[:, eos] += 1.0
    beams = D.beam_search(markov_step(table), torch.tensor([[0], [2]]), 3, 6, eos_token=eos, length_bonus=lam)
    assert beams.tokens.shape[:2] == (2, 3) and beams.scores.shape == (2, 3)
    assert (beams.scores[:, :-1] >= beams.scores[:, 1:]).all()
    logp = torch.log_softmax(table, -1)
    for n, b in itertools.product(range(2), range(3)):
        seq, L = beams.tokens[n, b].tolist(), beams.lengths[n, b].item()
        total = sum(logp[a, c].item() for a, c in zip(seq[:L], seq[1:L + 1]))
        assert beams.log_probs[n, b].item() == pytest.approx(total, abs=1e-9)
        assert beams.scores[n, b].item() == pytest.approx(total + lam * L, abs=1e-9)
        assert all(t == eos for t in seq[L + 1:])  # padded with EOS after it is emitted
        assert L == len(seq) - 1 or seq[L] == eos


def test_length_bonus_favours_longer_hypotheses():
    # start -> EOS 0.5 or a 0.5; a -> EOS 1.0: λ = 0 ties, λ > 0 prefers the longer "a EOS".
    p = torch.tensor([[0.0, 0.55, 0.45], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    step = markov_step(p.log())
    short = D.beam_search(step, torch.tensor([0]), 2, 3, eos_token=1, length_bonus=0.0)
    long = D.beam_search(step, torch.tensor([0]), 2, 3, eos_token=1, length_bonus=1.0)
    assert short.lengths[0].item() == 1 and long.lengths[0].item() == 2


def test_decode_with_sampling_is_reproducible_and_stops_after_eos():
    table = random_logits((6, 6), 10)
    table[:, 5] += 2.0
    choose = functools.partial(S.sample, generator=torch.Generator().manual_seed(0))
    out = D.decode(markov_step(table), torch.zeros(8, 1, dtype=torch.long), 30, choose, eos_token=5)
    assert out.shape[0] == 8 and out.shape[1] <= 31
    for row in out.tolist():
        if 5 in row:
            assert all(t == 5 for t in row[row.index(5):])
    choose2 = functools.partial(S.sample, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, D.decode(markov_step(table), torch.zeros(8, 1, dtype=torch.long), 30, choose2, 5))


# --- repetition and diversity ----------------------------------------------------------------

def test_repetition_rate_on_small_cases():
    loop = torch.tensor([[1, 2, 1, 2, 1, 2]])  # bigrams 12 21 12 21 12: 2 distinct of 5
    assert D.repetition_rate(loop, 2) == pytest.approx(1 - 2 / 5)
    fresh = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    assert D.repetition_rate(fresh, 2) == 0.0
    mixed = torch.cat([loop, torch.tensor([[0, 1, 2, 3, 4, 5]])])  # the mean over sequences
    assert D.repetition_rate(mixed, 2) == pytest.approx((1 - 2 / 5) / 2)
    assert D.repetition_rate(torch.tensor([[7, 7, 7]]), 1) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="n must be in"):
        D.repetition_rate(fresh, 5)


# --- bad input ---------------------------------------------------------------------------------

Z = torch.tensor([[2.0, 1.0, 0.1]])


@pytest.mark.parametrize("tau", [0.0, -1.0, math.inf, math.nan])
def test_bad_temperature_raises_naming_the_range(tau):
    with pytest.raises(ValueError, match=r"temperature must be in \(0, inf\)"):
        S.softmax(Z, tau)
    with pytest.raises(ValueError, match="temperature"):
        S.sample(Z, tau)
    with pytest.raises(ValueError, match="temperature"):
        S.gumbel_max_sample(Z, tau)


@pytest.mark.parametrize("fn", [S.softmax, S.log_softmax, S.entropy, S.greedy, S.sample, S.gumbel_max_sample])
@pytest.mark.parametrize("bad, match", [(math.nan, "NaN"), (math.inf, r"\+inf")])
def test_nan_or_positive_inf_logits_raise(fn, bad, match):
    z = Z.clone()
    z[0, 1] = bad
    with pytest.raises(ValueError, match=match):
        fn(z)


def test_a_row_with_no_finite_logit_raises():
    z = torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])
    with pytest.raises(ValueError, match="at least one finite"):
        S.sample(z)


@pytest.mark.parametrize("k", [0, -3])
def test_k_below_one_raises(k):
    with pytest.raises(ValueError, match=r"k must be in \[1, inf\)"):
        S.top_k_filter(Z, k)
    with pytest.raises(ValueError, match=r"k must be in \[1, inf\)"):
        S.sample(Z, top_k=k)


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, math.nan])
def test_p_outside_zero_one_raises(p):
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        S.top_p_filter(Z, p)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        S.sample(Z, top_p=p)


def test_wrong_types_raise_type_errors():
    with pytest.raises(TypeError, match="k must be an int"):
        S.top_k_filter(Z, 2.5)
    with pytest.raises(TypeError, match="temperature"):
        S.softmax(Z, True)
    with pytest.raises(TypeError, match="floating-point"):
        S.softmax(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        S.softmax([1.0, 2.0])


def test_per_row_parameters_of_the_wrong_shape_or_range_raise():
    z = random_logits((3, 5), 0)
    with pytest.raises(ValueError, match="one value per row"):
        S.softmax(z, torch.ones(2))
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\] in every row"):
        S.top_p_filter(z, torch.tensor([0.5, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"k must be in \[1, inf\) in every row"):
        S.top_k_filter(z, torch.tensor([1, 0, 2]))
    with pytest.raises(TypeError, match="integer tensor"):
        S.top_k_filter(z, torch.tensor([1.0, 2.0, 3.0]))


def test_bad_beam_and_decode_arguments_raise():
    step = markov_step(random_logits((4, 4), 0))
    with pytest.raises(ValueError, match=r"beam_width must be an int in \[1, inf\)"):
        D.beam_search(step, torch.tensor([0]), 0, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        D.decode(step, torch.tensor([0]), -1)
    with pytest.raises(ValueError, match="prompt"):
        D.decode(step, torch.tensor([0.0]), 2)
    with pytest.raises(ValueError, match="eos_token"):
        D.beam_search(step, torch.tensor([0]), 2, 3, eos_token=9)
    with pytest.raises(ValueError, match="step must map tokens"):
        D.beam_search(lambda t: torch.zeros(1, 4), torch.tensor([[0], [1]]), 2, 3)
    with pytest.raises(ValueError, match="length_bonus"):
        D.beam_search(step, torch.tensor([0]), 2, 3, length_bonus=math.nan)


def test_empty_prompts_raise_naming_the_shape():
    step = markov_step(random_logits((4, 4), 0))
    for prompt in (torch.zeros(0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long),
                   torch.zeros(0, 3, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"prompt must have N >= 1 rows of T0 >= 1 tokens"):
            D.decode(step, prompt, 2)
        with pytest.raises(ValueError, match=r"prompt must have N >= 1 rows of T0 >= 1 tokens"):
            D.beam_search(step, prompt, 2, 2)


@pytest.mark.parametrize("eos", [4, -1, 2.0, True])
def test_decode_rejects_an_eos_token_outside_the_vocabulary_of_the_first_step(eos):
    step = markov_step(random_logits((4, 4), 0))  # V = 4
    with pytest.raises(ValueError, match=r"eos_token must be an int in \[0, 3\]"):
        D.decode(step, torch.tensor([0]), 3, eos_token=eos)
    one_token = lambda tokens: torch.zeros(tokens.shape[0], 1)  # V = 1: token 0 is the only valid eos
    assert D.decode(one_token, torch.tensor([0]), 3, eos_token=0).tolist() == [0, 0]


def test_repetition_rate_of_no_sequences_or_no_tokens_raises():
    for tokens in (torch.zeros(0, 5, dtype=torch.long), torch.zeros(3, 0, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"tokens must hold S >= 1 sequences of L >= 1 tokens"):
            D.repetition_rate(tokens, 1)


# --- on the GPU: no host synchronisation, CUDA-graph capture -----------------------------------

@pytest.mark.gpu
def test_batched_path_never_synchronises_with_the_host():
    z = torch.randn(8, 1000, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        S.sample(z, 0.7, top_k=50, top_p=0.9, generator=g, validate=False)
        taus, ks, ps = (torch.full((8,), v, device="cuda") for v in (0.7, 50, 0.9))  # one knob per row
        S.sample(z, taus, ks.long(), ps, generator=g, validate=False)
        S.sample(z, 0.7, generator=g, validate=False)
        S.greedy(z, validate=False)
        S.top_k_filter(z, torch.full((8,), 5, device="cuda"), validate=False)
        S.top_p_filter(z, torch.full((8,), 0.5, device="cuda"), validate=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_sampling_is_captured_by_a_cuda_graph_and_agrees_with_eager():
    z = torch.randn(16, 500, device="cuda")
    static = z.clone()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph, as CUDA graphs require
        S.filter_logits(static, 0.8, 20, 0.9, validate=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        filtered = S.filter_logits(static, 0.8, 20, 0.9, validate=False)
        best = S.greedy(filtered, validate=False)
        drawn = S.sample(static, 0.8, 20, 0.9, validate=False)
    seen = set()
    for _ in range(5):
        static.copy_(torch.randn(16, 500, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        eager = S.filter_logits(static, 0.8, 20, 0.9)
        assert torch.equal(filtered, eager)
        assert torch.equal(best, eager.argmax(-1))
        assert torch.isfinite(eager.gather(-1, drawn[:, None])).all()  # drawn from the kept set
        seen.add(tuple(drawn.tolist()))
    assert len(seen) > 1  # each replay draws fresh noise


# --- extreme temperatures and logits (the temperature floor, the shift before dividing) ---------

@pytest.mark.parametrize("tau", [1e-300, 1e-40, S.MIN_TEMPERATURE / 2, 3.5e38, 1e300])
def test_a_temperature_float32_cannot_hold_is_refused_not_rounded_to_zero_or_inf(tau):
    z = torch.tensor([[0.0, 5.0, 1.0]])
    floor = r"temperature must be in \(0, inf\), at least 1.18e-38 and at most 3.4e\+38"
    for fn in (S.softmax, S.log_softmax, S.entropy, S.sample, S.gumbel_max_sample, S.filter_logits):
        with pytest.raises(ValueError, match=floor):
            fn(z, tau)
    with pytest.raises(ValueError, match="temperature"):
        S.softmax(z, torch.tensor([1.0 * tau]))  # per row too


def test_the_smallest_allowed_temperature_samples_the_most_likely_token():
    z = torch.tensor([[0.0, 5.0, 1.0]] * 50)
    g = torch.Generator().manual_seed(0)
    for fn in (S.sample, S.gumbel_max_sample):
        assert fn(z, S.MIN_TEMPERATURE, generator=g).tolist() == [1] * 50
    assert S.softmax(z[0], S.MIN_TEMPERATURE).tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_logits_at_a_small_temperature_give_the_one_hot_not_nan(dtype):
    z = torch.tensor([[1e38, 3e38, -3e38], [-3e38, -3e38, 3e38]]).to(dtype)
    for tau in (0.01, 1e-30):
        p = S.softmax(z, tau)
        assert p.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
        assert torch.isfinite(S.entropy(z, tau)).all()
        g = torch.Generator().manual_seed(1)
        assert S.sample(z, tau, top_p=0.5, generator=g).tolist() == [1, 2]
        assert S.gumbel_max_sample(z, tau, top_k=2, generator=torch.Generator()).tolist() == [1, 2]


def test_greedy_with_a_temperature_or_a_filter_is_a_conflict_not_ignored():
    for knobs in (dict(temperature=5.0), dict(top_k=3), dict(top_p=0.9),
                  dict(temperature=0.5, top_k=2)):
        with pytest.raises(S.ConflictingSamplingParams, match="greedy=True"):
            S.SamplingParams(greedy=True, **knobs)
    assert S.SamplingParams(greedy=True) == S.GREEDY
    assert isinstance(S.ConflictingSamplingParams("x"), ValueError)


@pytest.mark.parametrize("knobs, error, match", [
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(temperature=1e-300), ValueError, "temperature"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(top_k=0), ValueError, "k must be in"),
    (dict(top_k=2.5), TypeError, "k must be an int"), (dict(top_p=1.5), ValueError, "p must be in"),
    (dict(greedy=1), TypeError, "greedy must be a bool"),
    (dict(temperature=torch.tensor(0.5)), TypeError, "not a tensor")])
def test_sampling_params_check_their_knobs_when_made(knobs, error, match):
    with pytest.raises(error, match=match):
        S.SamplingParams(**knobs)


def test_sampling_params_choose_what_the_rules_choose():
    z = random_logits((6, 9), 5)
    assert torch.equal(S.GREEDY.choose(z), S.greedy(z))
    params = S.SamplingParams(temperature=0.7, top_k=4, top_p=0.8)
    want = S.sample(z, 0.7, 4, 0.8, torch.Generator().manual_seed(2))
    assert torch.equal(params.choose(z, torch.Generator().manual_seed(2)), want)


extreme_floats = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                           st.sampled_from([3.4e38, -3.4e38, 0.0, -math.inf]))
extreme_taus = st.one_of(st.floats(0, 1e300, exclude_min=True),
                         st.sampled_from([1e-300, 1e-40, 1e-38, 1e38, 3.4028235677973366e38]))


@settings(max_examples=200, deadline=None)
@given(row=st.lists(extreme_floats, min_size=1, max_size=10), tau=extreme_taus,
       k=st.none() | st.integers(1, 12), p=st.none() | st.floats(0.01, 1.0), seed=seeds)
def test_any_finite_or_extreme_logits_and_temperature_give_finite_probabilities_or_a_named_error(
        row, tau, k, p, seed):
    z = torch.tensor([row], dtype=torch.float32)
    try:
        probs = S.softmax(z, tau)
    except ValueError as err:  # the only refusals: τ outside float32, or no finite logit in the row
        assert "temperature" in str(err) or "finite entry" in str(err), err
        assert not S.MIN_TEMPERATURE <= tau <= S.MAX_TEMPERATURE or not torch.isfinite(z).any()
        return
    assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1) < 1e-5
    assert not S.log_softmax(z, tau).isnan().any() and torch.isfinite(S.entropy(z, tau)).all()
    kept = S.softmax(S.filter_logits(z, tau, k, p))  # (1, V)
    assert torch.isfinite(kept).all()
    g = torch.Generator().manual_seed(seed)
    for fn in (S.sample, S.gumbel_max_sample):
        token = int(fn(z, tau, k, p, generator=g))
        assert 0 <= token < len(row) and kept[0, token] > 0


class _RecordingBigram(torch.nn.Module):
    """nanoGPT's interface over a bigram table, recording the width of every context it is given."""

    def __init__(self, table: torch.Tensor, block_size: int):
        super().__init__()
        self.table, self.widths = table, []
        self.config = type("Config", (), {"block_size": block_size})()

    def forward(self, idx):
        self.widths.append(idx.shape[1])
        return self.table[idx], None  # (B, T, V)


def test_listing_as_printed_runs_the_loop_but_samples_one_token_after_it():
    table = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 5.0], [9.0, 1.0, 0.0]])  # (V, V) next logits
    model = _RecordingBigram(table, block_size=2)
    idx = torch.tensor([[0, 1, 2], [2, 2, 1]])
    out = D.nanogpt_generate_as_printed(model, idx, 5, temperature=0.7, top_k=1)
    assert out.shape == (2, 4) and torch.equal(out[:, :3], idx)  # one token, not five
    assert out[:, 3].tolist() == [0, 2]  # top-1: the argmax after each row's last token
    assert model.widths == [2] * 5  # five passes over the last block_size tokens, then one draw
    with pytest.raises(ValueError, match="max_new_tokens"):
        D.nanogpt_generate_as_printed(model, idx, 0)


def _listing_loop(calls, prompt, max_length):
    """002's cached-generation loop over the helpers, the first token sampled from the prompt."""
    kv_cache = calls.compute_kv(prompt)
    new_token = calls.sample(calls.model(prompt, kv_cache=kv_cache))
    for _ in range(max_length):
        new_token = calls.sample(calls.model(new_token, kv_cache=kv_cache))
        kv_cache = calls.update_cache(kv_cache, new_token)
    return calls


@pytest.mark.parametrize("model_writes", [True, False])
def test_listing_calls_run_002s_loop_on_the_lab_cache_and_record_what_it_holds(model_writes):
    from halluc_lab.model.transformer import ModelConfig, Transformer

    config = ModelConfig(vocab_size=32, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         max_positions=64)
    model = Transformer(config, seed=0).double().eval()
    prompt = [3, 14, 15, 9, 26]
    calls = _listing_loop(D.ListingCalls(model, 32, model_writes=model_writes), prompt, 4)
    with torch.no_grad():
        uncached = D.decode(lambda x: model(x)[:, -1], torch.tensor(prompt), 5)
    uncached = uncached[len(prompt):].tolist()
    assert calls.should_hold == prompt + calls.generated[:-1]
    assert int(calls.cache.lengths[0]) == len(calls.held)  # held is what the cache holds
    if model_writes:  # a model call appends, and update_cache appends the same token again
        assert calls.held != calls.should_hold and len(calls.held) == len(prompt) * 2 + 2 * 4
    else:  # a model call only reads: each token cached once, and the tokens are the uncached ones
        assert calls.held == calls.should_hold and calls.generated == uncached


def test_listing_calls_hands_out_its_helpers_in_the_listings_order():
    from halluc_lab.model.transformer import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=8, hidden_size=16, n_layers=1, n_heads=2), seed=0)
    calls = D.ListingCalls(model, 8, model_writes=False)
    assert calls.helpers() == (calls.model, calls.compute_kv, calls.update_cache, calls.sample)
