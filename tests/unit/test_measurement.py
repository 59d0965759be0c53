"""halluc_lab.stages.measurement: a post-trained model measured against its reference, and the
summary sentences that follow the numbers."""

import copy

import pytest
import torch

from halluc_lab.evaluation.evaluate import free_run, score_answers
from halluc_lab.evaluation.stats import Interval, said
from halluc_lab.stages import measurement, reward_model
from halluc_lab.stages.preference import PreferencePairs, sample_groups
from halluc_lab.tasks import Arithmetic, ArithmeticConfig
from tests.unit._tiny_lm import small_transformer


@pytest.fixture(scope="module")
def arithmetic():
    task = Arithmetic(ArithmeticConfig(max_digits=1))
    tok = task.tokenizer()
    return task, tok, small_transformer(tok.vocab_size).eval()


def test_completion_logps_sum_the_completion_tokens_log_probs_in_any_chunking(arithmetic):
    _, tok, lm = arithmetic
    prompts, completions = [[tok.bos_id, 5, 6], [tok.bos_id, 7]], [[8, 9], [5, 6, 7]]
    got = measurement.completion_logps(lm, prompts, completions, tok.pad_id)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            lp = torch.log_softmax(lm(ids)[0, :-1].float(), -1)  # (T-1, V): t predicts t + 1
        want = sum(float(lp[len(p) - 1 + j, tok_]) for j, tok_ in enumerate(c))
        assert float(got[i]) == pytest.approx(want, abs=1e-5)
    alone = measurement.completion_logps(lm, prompts, completions, tok.pad_id, chunk=1)  # unpadded
    assert torch.allclose(alone, got, atol=1e-5)
    with pytest.raises(ValueError, match="one length"):
        measurement.completion_logps(lm, prompts, completions[:1], tok.pad_id)


def test_measure_reads_the_verifiers_outcomes_and_is_zero_nats_from_itself(arithmetic):
    task, tok, lm = arithmetic
    examples = task.examples("heldout", 6, seed=0)
    out = measurement.measure(lm, lm, tok, task, examples, 3, seed=4)
    assert list(out) == ["greedy correct", "greedy wrong", "correct", "abstained", "wrong",
                         "gold reward", "KL"]
    assert all(len(v) == len(examples) for v in out.values())
    assert out["KL"] == [0.0] * len(examples)  # the reference is the policy
    g = sample_groups(lm, tok, task, examples, 3, seed=4)  # the same draws
    assert out["gold reward"] == pytest.approx(g.rewards.mean(1).tolist())
    assert out["wrong"] == pytest.approx((g.rewards == -1).float().mean(1).tolist())
    greedy = score_answers(task, [e.prompt for e in examples], free_run(lm, tok, examples))
    assert out["greedy correct"] == greedy.indicator("correct")
    for c, a, w in zip(out["correct"], out["abstained"], out["wrong"]):
        assert c + a + w == pytest.approx(1.0)


def test_measure_puts_the_proxys_score_first_and_a_moved_policy_has_positive_kl(arithmetic):
    task, tok, lm = arithmetic
    examples = task.examples("heldout", 4, seed=1)
    moved = copy.deepcopy(lm)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    proxy = reward_model.RewardModel.from_lm(lm).eval()
    out = measurement.measure(moved, lm, tok, task, examples, 4, seed=0, proxy=proxy)
    assert next(iter(out)) == "proxy reward" and len(out["proxy reward"]) == len(examples)
    assert sum(out["KL"]) / len(examples) > 0  # an estimate of KL(π ‖ π_ref) over several prompts


class Favouring(torch.nn.Module):
    """A model whose logit of one token is raised by a constant everywhere."""

    def __init__(self, inner, token, by):
        super().__init__()
        self.inner, self.token, self.by = inner, token, by

    def forward(self, input_ids, **kwargs):
        z = self.inner(input_ids, **kwargs).clone()
        z[..., self.token] += self.by
        return z


def test_implicit_reward_accuracy_counts_pairs_whose_chosen_answer_gained_more(arithmetic):
    _, tok, lm = arithmetic
    b = tok.bos_id
    pairs = PreferencePairs(((b, 5), (b, 6)), ((7,), (8,)), ((8,), (7,)), (True, True), tok.pad_id)
    assert measurement.implicit_reward_accuracy(lm, lm, pairs.rows()) == 0.0  # every pair ties
    assert measurement.implicit_reward_accuracy(Favouring(lm, 7, 3.0), lm, pairs.rows()) == 0.5
    assert measurement.implicit_reward_accuracy(Favouring(lm, 8, 3.0), lm, pairs.rows()) == 0.5
    all_sevens = PreferencePairs(((b, 5), (b, 6)), ((7,), (7,)), ((8,), (8,)), (True, True),
                                 tok.pad_id)
    assert measurement.implicit_reward_accuracy(Favouring(lm, 7, 3.0), lm, all_sevens.rows()) == 1.0
    assert measurement.implicit_reward_accuracy(Favouring(lm, 8, 3.0), lm, all_sevens.rows()) == 0.0


# -- the summary sentences follow the numbers ------------------------------------------------------
LOW, HIGH, FLAT = Interval(-0.1, -0.2, -0.05), Interval(0.1, 0.05, 0.2), Interval(0.0, -0.1, 0.1)


def _sft_contrasts(by_task):
    """diff and verdicts keyed as chapter 8 keys them, from {(task, baseline): interval}."""
    diff = {(t, "backspace", b, n): iv for (t, b), iv in by_task.items()
            for n in ("em_greedy", "em_sample")}
    verdicts = {k: said(iv, "backspace SFT", f"{k[2]} SFT", k[3]) for k, iv in diff.items()}
    return diff, verdicts


def test_the_backspace_headline_says_lowered_only_when_every_interval_lies_below_zero():
    diff, verdicts = _sft_contrasts({("kb_walk", "clean"): LOW, ("arithmetic", "clean"): LOW})
    text = measurement.backspace_headline(["kb_walk", "arithmetic"], diff, verdicts, {})
    assert text.startswith("Backspace SFT lowered exact match on every task it was tried on "
                           "(kb_walk, arithmetic)")
    diff, verdicts = _sft_contrasts({("kb_walk", "clean"): LOW, ("arithmetic", "clean"): FLAT})
    text = measurement.backspace_headline(["kb_walk", "arithmetic"], diff, verdicts, {})
    assert "lowered" not in text and text.startswith("Backspace SFT against clean SFT: kb_walk: ")
    assert "backspace SFT is lower than clean SFT in em_greedy (-0.100 [-0.200, -0.050])" in text
    assert "arithmetic: backspace SFT − clean SFT in em_greedy: not resolved" in text
    diff, verdicts = _sft_contrasts({("kb_walk", "clean"): HIGH})
    text = measurement.backspace_headline(["kb_walk"], diff, verdicts, {})
    assert "is higher than clean SFT" in text


def test_the_backspace_headline_adds_the_matched_compute_control_where_there_is_one():
    diff, verdicts = _sft_contrasts({("path_star", "clean"): LOW, ("path_star", "continued"): HIGH})
    text = measurement.backspace_headline(["path_star"], diff, verdicts, {"path_star": "continued"})
    assert text.endswith(
        " path_star against its matched-compute control: backspace SFT is higher than continued "
        "SFT in em_greedy (+0.100 [+0.050, +0.200]), backspace SFT is higher than continued SFT in "
        "em_sample (+0.100 [+0.050, +0.200]).")


def test_proxy_and_gold_says_the_optima_differ_only_when_the_proxy_rose_and_the_gold_did_not():
    verdicts = ("RLHF is higher than SFT in proxy reward (…)",
                "RLHF − SFT in gold reward: not resolved (…)")
    text = measurement.proxy_and_gold(HIGH, FLAT, verdicts, (0.0123, 0.4567), 1.234)
    assert text.startswith(f"* RLHF's proxy and the gold reward: {verdicts[0]}; {verdicts[1]}; ")
    assert "went from 0.012 to 0.457, at a KL of 1.23 nats." in text
    assert text.endswith(" The reward model's optimum is not the verifier's.")
    for proxy, gold in ((HIGH, HIGH), (FLAT, FLAT), (LOW, FLAT), (HIGH, LOW)):
        said_ = measurement.proxy_and_gold(proxy, gold, verdicts, (0.0, 0.0), 0.0)
        assert ("not the verifier's" in said_) == (proxy.low > 0 and gold.low <= 0)
    assert "not the verifier's" in measurement.proxy_and_gold(HIGH, LOW, verdicts, (0.0, 0.0), 0.0)


def test_masking_is_argued_only_when_every_full_sequence_loss_fell_less():
    text = measurement.masking_said({"kb_walk": (1.0, 0.2), "arithmetic": (0.5, -0.1)})
    assert text.startswith("In every task the full-sequence loss falls less than the completion "
                           "loss, and for arithmetic it rises: ")
    assert text.endswith("the prompt is context, not data to imitate.")
    assert ", and for" not in measurement.masking_said({"kb_walk": (1.0, 0.2)})
    text = measurement.masking_said({"kb_walk": (1.0, 0.2), "arithmetic": (0.5, 0.7)})
    assert text == "The full-sequence loss falls as much as the completion loss for arithmetic."


PS = dict(ends=(0.99, 0.98), chance=0.5, em=0.45)


def test_the_path_star_reading_follows_whether_the_look_up_formed_and_where_the_first_step_sits():
    near_chance = measurement.path_star_said([0.95, 0.97], [0.5, 0.55], [0, 1], lookup=0.96,
                                             first=0.525, **PS)
    assert near_chance.startswith("This is the failure Bachmann & Nagarajan describe.")
    assert "look-up steps right 96% of the time and the first step 52%" in near_chance
    far = measurement.path_star_said([0.95, 0.97], [0.9, 0.95], [0, 1], lookup=0.96, first=0.925,
                                     **PS)
    assert far.startswith("The look-up steps are right 96% of the time and the first step 92%, "
                          "well away from 1/degree = 50%")
    none = measurement.path_star_said([0.4, 0.6], [0.5, 0.5], [0, 1], lookup=0.5, first=0.5, **PS)
    assert none.startswith("These models have not learned the look-up: ")
    assert "(99% and 98% right)" in none
    mixed = measurement.path_star_said([0.95, 0.3], [0.5, 0.5], [3, 4], lookup=0.625, first=0.5,
                                       **PS)
    assert mixed.startswith("The look-up formed in 1 of 2 seeds, so the means above mix")


def test_the_path_star_reading_ends_with_every_seeds_values_and_refuses_mismatched_lists():
    text = measurement.path_star_said([0.95, 0.3], [0.5, 0.25], [3, 4], lookup=0.625, first=0.375,
                                      **PS)
    assert text.endswith(" The look-up (90% of its steps right or more) formed in 1 of 2 seeds of "
                         "the whole chain. Seed by seed (3, 4), the clean model gets the look-up "
                         "steps right 95%, 30% of the time, and the first step 50%, 25%.")
    with pytest.raises(ValueError, match="one length"):
        measurement.path_star_said([0.95], [0.5, 0.5], [0], lookup=0.95, first=0.5, **PS)


def test_the_scheduled_loss_note_adds_its_caveat_only_above_a_two_percent_rise():
    assert measurement.scheduled_loss_said({}) == ""
    flat = measurement.scheduled_loss_said({"kb_walk": 0.01})
    assert flat == ("The scheduled-sampling curves, whose inputs are corrupted ever more often: "
                    "kb_walk: its smoothed loss ends within 2% of its lowest point. ")
    risen = measurement.scheduled_loss_said({"kb_walk": 0.01, "arithmetic": 0.3})
    assert "arithmetic: its smoothed loss ends 30% above its lowest point. Such a rise" in risen


def test_recovery_says_never_only_for_an_exact_zero_and_reads_path_star_by_position():
    text = measurement.recovery_said({("kb_walk", "clean"): 0.0, ("kb_walk", "backspace"): 0.42})
    assert text == ("Without `<bksp>` a model ends right after a forced error never: it cannot "
                    "take the token back. The backspace models end right in 42% (kb_walk).")
    some = measurement.recovery_said({("kb_walk", "clean"): 0.03, ("kb_walk", "scheduled"): 0.01,
                                      ("kb_walk", "backspace"): 0.42})
    assert "in at most 3% of the answers (mean over the positions)" in some
    ps = measurement.recovery_said({("path_star", "clean"): 0.0, ("path_star", "backspace"): 0.5},
                                   [0.9, 0.2, 0.6])
    assert "a wrong one 90% of the time" in ps and "right one: 20%" in ps
    assert ps.endswith("greedily the model ends right 60% of the time.")


def test_the_toy_landing_says_closer_only_when_every_method_beats_best_of_n_at_its_best():
    kw = dict(exact=0.0012, limit=0.3456, disagreements=1)
    ns, bon = [1, 2, 4], [0.5, 0.2, 0.25]
    closer = measurement.toy_landing_said({"DPO": 0.01, "PPO": 0.03}, bon, ns, **kw)
    assert closer.startswith("DPO, RSFT with the soft rule and PPO end 0.0100–0.0300 from $\\pi^*$ "
                             "in total variation, each closer than best-of-$N$ comes at any $N$ "
                             "(its closest: 0.200 at $N$ = 2).")
    assert "within 0.0012 of $\\pi^*$ (the soft rule's at $N$ = 4)" in closer
    assert closer.endswith("it tends to 0.346. This part's tables disagree with the documents in 1 "
                           "place (see the errata).")
    farther = measurement.toy_landing_said({"DPO": 0.01, "PPO": 0.3}, bon, ns,
                                           **kw | {"disagreements": 3})
    assert "not all of them closer than best-of-$N$ at its best $N$" in farther
    assert "in 3 places (see the errata)." in farther
    with pytest.raises(ValueError, match="one best-of-N distance per N"):
        measurement.toy_landing_said({"DPO": 0.01}, bon, ns[:2], **kw)


def test_the_kb_walk_length_note_reads_missing_knowledge_only_when_knowable_chains_are_right():
    known = measurement.knowable_said([1.0, 0.6], [0.99, 0.96], [0.4, 0.1])
    assert "the share of knowable chains is 1.00, 0.60; greedy exact match is 0.99, 0.96" in known
    assert known.endswith("rather than errors compounding.")
    falling = measurement.knowable_said([1.0, 0.6], [0.99, 0.80], [0.4, 0.1])
    assert falling.endswith("part is errors compounding.") and "Even on the chains" in falling


def test_the_arithmetic_length_note_places_the_errors_by_the_token_accuracy():
    longest = measurement.carries_said(8, 4, (1.234, 0.51), 0.4, [1.0, 0.99, 0.98, 0.80])
    assert "the held-out split has only 8 of them" in longest
    assert "The longest sums (4 digits) carry 1.2 times on average against 0.5 for 3-digit sums, " \
           "make up 40% of the training examples" in longest
    assert longest.endswith("0.80: the errors sit in the longest sums rather than spreading "
                            "evenly over tokens.")
    everywhere = measurement.carries_said(8, 4, (1.2, 0.5), 0.4, [0.9, 0.85, 0.88, 0.84])
    assert everywhere.endswith("this model errs at every length, not only in the longest sums.")


def test_the_cluster_bootstrap_reading_follows_the_ratio_of_the_two_widths():
    wilson = Interval(0.5, 0.4, 0.6)
    args = (12, 6, 4, 30, 0.5, wilson)
    wider = measurement.cluster_bootstrap_said(*args, [0.35, 0.65])
    assert wider.startswith("12 erasures in 4 of 30 answers; precision 0.500 (`backspace_use` says "
                            "0.500). Wilson: [0.400, 0.600]; cluster bootstrap over answers: "
                            "[0.350, 0.650], 1.50 times as wide. Resampling answers widens")
    alike = measurement.cluster_bootstrap_said(*args, [0.4, 0.61])
    assert "within 5% of each other: at 3.0 erasures per answer that erases" in alike
    narrower = measurement.cluster_bootstrap_said(*args, [0.45, 0.55])
    assert narrower.endswith("the erasures are alike less often than independent ones would be.")
    with pytest.raises(ValueError, match="erasures must be at least 1"):
        measurement.cluster_bootstrap_said(0, 0, 0, 30, 0.0, wilson, [0.0, 1.0])
