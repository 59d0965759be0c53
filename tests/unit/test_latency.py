"""halluc_lab.book.latency: chapter 6's numbers for prose, and its paragraphs on a timing run."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from halluc_lab.book import latency
from halluc_lab.model.kv_cache import step_cost
from halluc_lab.model.transformer import ModelConfig

CFG = ModelConfig(vocab_size=256, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                  max_positions=600, tie_embeddings=False)
CONTEXTS = [16, 32, 64, 128, 256, 512]
DATASHEET = dict(hbm_bytes_per_s={"H100": 3.35e12}, peak_bf16_flops={"H100": 989e12})


def _run(cached, uncached, dtype=torch.float32, t_star=None, inv_rate=0.0):
    """A timing run with per-token seconds ``cached`` and ``uncached`` and flat totals."""
    return SimpleNamespace(
        cfg=CFG, bytes_per_value=4, dtype=dtype, title="Tiny", uncached=uncached, cached=cached,
        eager=cached, flops_uncached=np.array([step_cost(CFG, t).flops for t in CONTEXTS], float),
        flops_cached=np.array([step_cost(CFG, 1, t - 1).flops for t in CONTEXTS], float),
        exp_uncached=1.0, exp_cached=0.0, count_uncached=1.0, count_cached=0.5, c0=1e-3,
        inv_rate=inv_rate, t_star=t_star, lengths=[32, 64, 128], fit_n=[32, 64, 128],
        tot_uncached=[1.0, 2.0, 4.0], tot_eager=[0.5, 0.5, 0.5], tot_cached=[0.5, 0.5, 0.5],
        ratio=[2.0, 4.0, 8.0], exp_total_uncached=1.0, exp_total_cached=0.0,
        count_total_uncached=2.0, count_total_cached=1.0, predicted_total_uncached=1.05)


def _measured(gpu=None, graphs=False):
    return latency.Measured(CONTEXTS, len(CONTEXTS) // 2, graphs, gpu, gpu or "", 0.1, **DATASHEET)


@pytest.mark.parametrize("x, digits, text", [(1234.56, 3, "1,235"), (0.01234, 3, "0.0123"),
                                             (0.0, 3, "0"), (-2.5, 2, "-2.5"), (9.996, 3, "10.00")])
def test_sig_keeps_significant_digits_without_exponents(x, digits, text):
    assert latency.sig(x, digits) == text


def test_units_pick_their_prefix_from_the_size():
    assert latency.fmt_time(2.5e-5) == "25.0 µs" and latency.fmt_time(0.0123) == "12.3 ms"
    assert latency.fmt_time(3.0) == "3.00 s" and latency.fmt_ms(0.5) == "500 ms"
    assert latency.fmt_count(975_243_264, "B") == "975 MB" and latency.fmt_count(12) == "12.0"
    assert latency.fmt_count(4.8e12, "B/s") == "4.80 TB/s" and latency.pct(0.0123) == "1.2 %"


def test_per_token_text_says_when_a_cached_step_is_slower_and_when_there_is_no_work_term():
    slow_then_fast = _run(cached=[2e-3] * 6, uncached=[1e-3, 1.5e-3, 3e-3, 4e-3, 5e-3, 6e-3])
    text = latency.per_token_text(slow_then_fast, _measured())
    assert "with no measurable work term" in text
    assert "Up to $t$ = 32 one cached step is slower" in text
    assert text.endswith("the cached step is 3.00× faster.")
    assert "Eagerly" not in text  # on the CPU the engine's step is not a graph
    always_slow = latency.per_token_text(_run(cached=[1.0] * 6, uncached=[1e-3] * 6), _measured())
    assert always_slow.endswith("Even at the longest context the cached step is 1,000× slower.")


def test_hardware_text_sets_rates_beside_the_datasheet_only_on_a_known_gpu():
    recorded = {}
    r = _run(cached=[1e-5] * 6, uncached=[1e-3] * 6, dtype=torch.bfloat16)
    text = latency.hardware_text(r, _measured("H100", graphs=True), recorded.__setitem__)
    moved = step_cost(CFG, 1, CONTEXTS[0] - 1, bytes_per_value=4).bytes
    assert recorded["cached_step_bytes"] == moved
    assert recorded["bandwidth_fraction"] == pytest.approx(moved / 1e-5 / 3.35e12)
    assert recorded["peak_fraction"] == pytest.approx(r.flops_uncached[-1] / 1e-3 / 989e12)
    assert "of the H100's datasheet 3.35 TB/s" in text
    recorded.clear()
    cpu = latency.hardware_text(r, _measured(), recorded.__setitem__)
    assert set(recorded) == {"cached_step_bytes", "cached_step_bytes_per_s", "uncached_flops_per_s"}
    assert cpu.endswith("these are the rates this run's CPU threads reached.")


def test_totals_text_judges_the_predicted_exponent_within_the_margin():
    r = _run(cached=[1e-3] * 6, uncached=[1e-3] * 6)
    assert "the measurement bears this out: 1.00" in latency.totals_text(r, _measured())
    r.predicted_total_uncached = 1.5
    text = latency.totals_text(r, _measured())
    assert "predicts an uncached exponent of 1.50, above 1; the measurement does not: 1.00" in text
    assert ("The ratio of the two totals grows, from 2.00× at $n$ = 32 to 8.00× at $n$ = 128, "
            "as the predicted exponent implies.") in text
    assert latency.side_of_one(1.05, 0.1) == "about 1"
    assert latency.side_of_one(0.8, 0.1) == "below 1"
