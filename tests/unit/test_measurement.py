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
