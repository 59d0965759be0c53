"""The live sampler's computation (halluc_lab.book.live), without a browser: tests/book/test_jupyterlab.py drives
its widgets in JupyterLab."""

from __future__ import annotations

import pytest
import torch

from halluc_lab.generation import sampling
from halluc_lab.book.live import LiveSampler, distribution_html, live_sampler
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.tasks import KBWalk, KBWalkConfig


@pytest.fixture(scope="module")
def live():
    task = KBWalk(KBWalkConfig(n_entities=6, n_relations=2, common_count=20, max_hops=2))
    tok = task.tokenizer()
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                    max_positions=64), seed=0).eval()
    a, r = min(task.facts)
    return LiveSampler(model, tok, max_new_tokens=6, shown=tok.vocab_size), f"{a} {r}"


def test_the_distribution_is_samplings_under_the_knobs(live):
    sampler, prompt = live
    ids = torch.tensor([[sampler.tokenizer.bos_id, *sampler.tokenizer.encode(prompt)]])
    with torch.no_grad():
        logits = sampler.model(ids)[0, -1]
    for tau, k, p in ((1.0, 0, 1.0), (0.5, 3, 1.0), (2.0, 0, 0.5), (1.5, 4, 0.7)):
        rows = dict(sampler.distribution(prompt, LiveSampler.params(tau, k, p)))
        want = sampling.softmax(sampling.filter_logits(logits, tau, k or None, p if p < 1 else None))
        got = torch.tensor([rows[t] for t in sampler.tokenizer.tokens])
        torch.testing.assert_close(got, want.float(), atol=1e-6, rtol=1e-5)
        assert sum(v > 0 for v in rows.values()) <= (k or len(rows))
    ranked = [pr for _, pr in sampler.distribution(prompt, LiveSampler.params(1.0))]
    assert ranked == sorted(ranked, reverse=True)  # listed likeliest first


def test_a_continuation_is_reproducible_by_seed_and_a_foreign_word_is_refused(live):
    sampler, prompt = live
    tau1 = LiveSampler.params(1.0)
    a, b = sampler.continuation(prompt, tau1, seed=3), sampler.continuation(prompt, tau1, seed=3)
    assert a == b and 1 <= len(a.split()) <= 6
    with pytest.raises(ValueError, match="vocabulary: zebra"):
        sampler.distribution("zebra " + prompt, tau1)
    with pytest.raises(ValueError):
        LiveSampler.params(0.0)  # τ must be > 0
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="shown"):
            LiveSampler(sampler.model, sampler.tokenizer, shown=bad)


def test_the_widgets_redraw_when_a_knob_moves(live):
    pytest.importorskip("ipywidgets")
    sampler, prompt = live
    box = live_sampler(sampler.model, sampler.tokenizer, [prompt])
    prompt_w, temperature, top_k, _, shown, button, sampled = box.children
    before = shown.value
    temperature.value = 2.5
    assert shown.value != before and "halluc-live-distribution" in shown.value
    top_k.value = 1  # one kept token: a single bar of probability 1
    assert shown.value.count("1.000") == 1
    button.click()
    assert "halluc-live-sample" in sampled.value
    prompt_w.value = "zebra"
    assert "vocabulary" in shown.value
    with pytest.raises(ValueError, match="prompts"):
        live_sampler(sampler.model, sampler.tokenizer, [])


def test_the_distribution_table_escapes_tokens():
    out = distribution_html([("<eos>", 0.5), ("a", 0.25)])
    assert "&lt;eos&gt;" in out and "<eos>" not in out and "50.0%" in out
