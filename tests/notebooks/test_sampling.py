"""Chapter 3 (notebooks/03_sampling.ipynb) at scale=smoke: the claims it checks and what it measures."""

import math

import numpy as np
import pytest

NOTEBOOK = "03_sampling"
pytestmark = pytest.mark.notebook


def test_worked_example_disagreements_are_the_five_recorded_in_the_errata(glue):
    # Σ e^z = 11.22; p(cat) at τ = 0.5; the three probabilities at τ = 2 (001 Part 3 §4)
    assert glue["sampling_worked_disagreements"] == 5
    assert glue["sampling_worked_p_cat"] == pytest.approx([0.659, 0.8638, 0.5017], abs=1e-4)


def test_other_claim_tables_find_exactly_the_recorded_disagreements(glue):
    assert glue["sampling_attention_disagreements"] == 1  # 004 §5.1.1 "bigger τ: sharper"
    assert glue["sampling_temperature_disagreements"] == 1  # Proposition 1 with tied maxima
    assert glue["sampling_code_disagreements"] == 3  # 002 nucleus_sampling (×2), 001 Listing 4 as printed
    assert glue["sampling_prose_disagreements"] == 1  # 000 §4.5 "exceeds p" vs Definition 7
    assert glue["sampling_decoding_disagreements"] == 0
    assert glue["sampling_disagreements"] == 11


def test_sample_frequencies_converge_to_the_probabilities(glue):
    # total variation after 1e5 draws; its standard deviation is about 1e-3
    assert glue["sampling_tv_at_most_draws"] < 0.01


def test_beam_search_finds_the_sequence_greedy_misses(glue):
    assert glue["sampling_beam_finds_best"] is True


def test_top_p_set_size_adapts_while_top_k_stays_at_ten(glue):
    low, high = glue["sampling_topp_size_range"]
    assert low <= 2 and high >= 40


def test_deterministic_rules_repeat_and_sampling_does_not(glue):
    assert glue["sampling_greedy_rep2"] > 0.8
    assert glue["sampling_beam_rep2"] > 0.8
    assert glue["sampling_pure_rep2"] < 0.5 * glue["sampling_greedy_rep2"]


def test_temperature_trades_repetition_for_incoherence(glue):
    exact, sampled = glue["sampling_exact_tail_by_tau"], glue["sampling_sampled_tail_by_tau"]
    diversity, rep2 = glue["sampling_exact_diversity_by_tau"], glue["sampling_rep2_by_tau"]
    assert exact == sorted(exact) and exact[0] < 0.01 < 0.2 < exact[-1]
    assert diversity == sorted(diversity)
    assert rep2 == sorted(rep2, reverse=True)
    assert sampled == sorted(sampled)
    assert glue["sampling_max_tail_gap"] < 0.02  # the samples agree with the exact rates


def test_top_p_cuts_the_tail_that_pure_sampling_takes(glue):
    assert glue["sampling_top_p09_tail"] < 0.01 < 0.05 < glue["sampling_pure_tail"]


def test_interactive_sampler_covers_the_whole_grid(glue):
    assert glue["sampling_sampler_frames"] == 9 * 7 * 8


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_the_temperature_for_a_90_percent_choice_is_the_gap_over_ln_9(glue):
    gap, by_formula, by_bisection = glue["sampling_ex_tau90"]
    assert gap == pytest.approx(1.9)
    assert by_formula == pytest.approx(1.9 / math.log(9), rel=1e-12)
    assert by_bisection == pytest.approx(by_formula, rel=1e-9)


def test_exercise_solutions_gumbel_max_draws_softmax_within_chance(glue):
    tv, chance, n = glue["sampling_ex_gumbel"]
    assert n == 200_000 and 0.0 < chance < 0.002
    assert tv < 4 * chance


def test_exercise_solutions_greedy_switches_at_one_half_and_beam_at_0_28(glue):
    greedy, beam = glue["sampling_ex_beam_switch"]
    assert greedy == pytest.approx(0.5, abs=1e-9) and beam == pytest.approx(0.35 / 1.25, abs=1e-9)


def test_exercise_solutions_top_p_keeps_fewer_tokens_the_steeper_the_zipf(glue):
    kept = glue["sampling_ex_zipf_kept"]
    for s, k in zip((0.5, 1.0, 2.0), kept):  # the smallest k whose top-k mass reaches 0.9
        mass = np.cumsum(np.arange(1, 51) ** -s) / np.sum(np.arange(1, 51) ** -s)
        assert k == int(np.argmax(mass >= 0.9)) + 1
    assert kept == sorted(kept, reverse=True)
