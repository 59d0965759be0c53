"""The confidence-threshold baseline: answers below t become <abstain>, judged by the task's
verifier; the best threshold is the sweep's maximum of C − λW; a tiny model's confidences are the
probabilities of its greedy answers."""

import itertools
import math

import pytest
import torch

from halluc_lab.evaluation import abstention
from halluc_lab.evaluation.scoring import ABSTAINED, CORRECT, WRONG
from halluc_lab.tasks import Arithmetic
from halluc_lab.tasks.base import Example

TASK = Arithmetic()
PROMPTS = ["1 + 1 ="] * 4
SAID = ["2", "3", "2", "4"]  # right, wrong, right, wrong
CONF = [0.9, 0.8, 0.3, 0.2]


def test_answers_below_the_threshold_abstain_and_the_rest_stand():
    s = abstention.abstain_below(TASK, PROMPTS, SAID, CONF, 0.5)
    assert s.outcomes == (CORRECT, WRONG, ABSTAINED, ABSTAINED)
    assert abstention.abstain_below(TASK, PROMPTS, SAID, CONF, 0.0).outcomes == (CORRECT, WRONG) * 2
    assert set(abstention.abstain_below(TASK, PROMPTS, SAID, CONF, 1.5).outcomes) == {ABSTAINED}
    for bad in (-0.1, math.nan, True):
        with pytest.raises(ValueError, match="t must be"):
            abstention.abstain_below(TASK, PROMPTS, SAID, CONF, bad)
    with pytest.raises(ValueError, match="one length"):
        abstention.abstain_below(TASK, PROMPTS, SAID[:3], CONF, 0.5)
    with pytest.raises(ValueError, match="probabilities"):
        abstention.abstain_below(TASK, PROMPTS, SAID, [0.9, 1.2, 0.3, 0.2], 0.5)


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0, 3.0, 10.0])
def test_the_best_threshold_is_the_sweeps_maximum(lam):
    confs = [0.9, 0.8, 0.3, 0.2, 0.8, 0.05]
    said = ["2", "3", "2", "4", "2", "5"]
    prompts = ["1 + 1 ="] * 6
    t = abstention.best_threshold(TASK, prompts, said, confs, lam)
    brute = {c: abstention.abstain_below(TASK, prompts, said, confs, c).penalised_score(lam)
             for c in sorted({0.0, *confs})}
    assert brute[t] == pytest.approx(max(brute.values()))
    assert t == min(c for c, v in brute.items() if v == pytest.approx(max(brute.values())))


def test_confidence_is_the_probability_of_the_greedy_answer():
    from halluc_lab.model.transformer import ModelConfig, Transformer

    tok = TASK.tokenizer()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, n_layers=1, n_heads=2,
                         n_kv_heads=1, max_positions=32)
    model = Transformer(config)
    examples = [Example("1 + 2 =", "3"), Example("4 + 4 =", "8")]
    texts, conf = abstention.greedy_with_confidence(model, tok, examples)
    for e, text, c in zip(examples, texts, conf):
        ids = [tok.bos_id, *tok.encode(e.prompt)]
        answer = tok.encode(text)
        with torch.no_grad():
            logits = model(torch.tensor([ids + answer]))[0].float()
        logp = torch.log_softmax(logits, -1)
        want = sum(logp[len(ids) - 1 + i, a].item() for i, a in enumerate(answer))
        assert c == pytest.approx(math.exp(want), rel=1e-4)
    assert all(0.0 <= c <= 1.0 for c in itertools.chain(conf))
