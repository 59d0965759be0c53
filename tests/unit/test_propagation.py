"""The residual stream, the deviation between two runs and the Jacobians of halluc_lab.evaluation.propagation, checked
against the model's own forward (logits, autograd and finite differences through a hook)."""

import pytest
import torch
import torch.nn.functional as F

from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.evaluation.propagation import block_jacobian, deviation, residual_stream, stream_jacobian

V, D, L = 16, 16, 3  # vocabulary, width, blocks


def tiny(dtype=torch.float32, **kw) -> Transformer:
    cfg = ModelConfig(vocab_size=V, hidden_size=D, n_layers=L, n_heads=4, n_kv_heads=2, max_positions=32,
                      init_std=0.1, **kw)  # init_std 0.1: branches large enough that Jacobians are far from I
    return Transformer(cfg, seed=0).to(dtype).eval()


def ids(*shape, seed=0) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def streams_with(model, input_ids, first, source, x) -> list[torch.Tensor]:
    """The model's own forward of one sequence (T,), the stream at `source` after `first` blocks set to x
    (d,): the L+1 streams (1, T, d), differentiable in x. An independent route to the Jacobians."""
    out = []

    def replace(module, args, output):
        output = output.clone()
        output[0, source] = x
        return output

    where = model.embed_tokens if first == 0 else model.layers[first - 1]
    handles = [where.register_forward_hook(replace)]  # first, so the recording hooks see the replaced stream
    handles += [m.register_forward_hook(lambda m, a, o: out.append(o)) for m in [model.embed_tokens, *model.layers]]
    try:
        model(input_ids[None])
    finally:
        for h in handles:
            h.remove()
    return out


def check_against_the_forward(J, model, input_ids, source, target, first, last, k=3):
    """J ``(d, d)`` against the model's own forward, in k random directions (which miss a wrong entry with
    probability 0): uᵀJ against autograd's vector-Jacobian product, J v against central differences. The
    model's RMSNorm computes in float32 whatever its weights: both agree to float32's precision only, and the
    differences step by 1e-3 (error ~1e-4)."""
    x0 = residual_stream(model, input_ids[None])[first, 0, source]  # (d,)
    f = lambda x: streams_with(model, input_ids, first, source, x)[last][0, target]  # (d,) -> (d,)
    g = torch.Generator().manual_seed(0)
    for u, v in torch.randn(k, 2, D, generator=g, dtype=J.dtype):
        x = x0.clone().requires_grad_(True)
        (uJ,) = torch.autograd.grad(f(x) @ u, x)  # (d,)
        torch.testing.assert_close(u @ J, uJ, rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            fd = (f(x0 + 1e-3 * v) - f(x0 - 1e-3 * v)) / 2e-3  # (d,)
        torch.testing.assert_close(J @ v, fd, rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------- residual_stream

@pytest.mark.parametrize("tie", [True, False])
def test_last_stream_through_the_final_norm_and_head_gives_the_logits(tie):
    model, x = tiny(tie_embeddings=tie), ids(2, 7)
    h = residual_stream(model, x)
    assert h.shape == (L + 1, 2, 7, D) and h.dtype == torch.float32 and not h.requires_grad
    assert torch.equal(h[0], model.embed_tokens(x).detach())
    with torch.no_grad():
        head = model.embed_tokens.weight if tie else model.lm_head.weight
        torch.testing.assert_close(F.linear(model.norm(h[L]), head), model(x), rtol=1e-5, atol=1e-5)


def test_the_stream_is_float32_for_a_bf16_model():
    assert residual_stream(tiny(torch.bfloat16), ids(1, 5)).dtype == torch.float32


def test_hooks_are_removed_and_the_mode_restored_also_after_an_error():
    model = tiny().train()
    counts = lambda: (len(model.layers[0]._forward_hooks), len(model.layers[0]._forward_pre_hooks),
                      len(model.embed_tokens._forward_hooks))
    before = counts()
    residual_stream(model, ids(1, 5))
    assert counts() == before and model.training and all(m.training for m in model.modules())
    with pytest.raises(ValueError, match="token ids in"):  # raised inside the forward, with the hooks on
        residual_stream(model, torch.tensor([[1, V]]))
    assert counts() == before and model.training
    block_jacobian(model, ids(5), layer=1, position=2)
    assert counts() == before and model.training


# ----------------------------------------------------------------------------- deviation

def test_deviation_is_zero_before_the_swapped_token_and_positive_from_it():
    model, clean = tiny(), ids(2, 8)
    wrong = clean.clone()
    wrong[:, 3] = (clean[:, 3] + 1) % V
    dev = deviation(model, clean, wrong)
    assert dev.shape == (L + 1, 2, 8)
    assert torch.all(dev[:, :, :3] == 0)  # exactly: causality
    assert torch.all(dev[:, :, 3] > 0)  # the swapped token's own stream, at every layer
    assert torch.all(dev[0, :, 4:] == 0) and torch.all(dev[1:, :, 4:] > 0)  # later tokens: only through attention


def test_identical_runs_deviate_nowhere():
    x = ids(2, 6)
    assert torch.all(deviation(tiny(), x, x.clone()) == 0)


def test_deviation_rejects_runs_of_different_shapes():
    with pytest.raises(ValueError, match="same shape"):
        deviation(tiny(), ids(2, 6), ids(2, 7))
    with pytest.raises(ValueError, match=r"perturbed_ids must have shape \(B, T\)"):
        deviation(tiny(), ids(1, 6), ids(6))


# ----------------------------------------------------------------------------- Jacobians

@pytest.mark.parametrize("layer, position", [(0, 0), (1, 4), (2, 6)])
def test_block_jacobian_equals_autograd_and_finite_differences(layer, position):
    model, x = tiny(torch.float64), ids(7)
    J = block_jacobian(model, x, layer, position)
    assert J.shape == (D, D) and J.dtype == torch.float64 and not J.requires_grad
    check_against_the_forward(J, model, x, position, position, layer, layer + 1)
    assert not torch.allclose(J, torch.eye(D, dtype=J.dtype), atol=1e-2)  # the branches do contribute


def test_a_block_with_zeroed_output_projections_is_the_identity():
    model = tiny()
    with torch.no_grad():
        model.layers[1].self_attn.o_proj.weight.zero_()
        model.layers[1].mlp.down_proj.weight.zero_()
    J = block_jacobian(model, ids(6), layer=1, position=3)
    assert J.dtype == torch.float32 and torch.equal(J, torch.eye(D))
    assert torch.equal(torch.linalg.svdvals(J), torch.ones(D))
    assert all(p.grad is None for p in model.parameters())  # the Jacobian leaves the weights' gradients alone


@pytest.mark.parametrize("source, target, first, last", [
    (1, 5, 0, None),  # embeddings to the last block's output: 001's "with respect to earlier tokens"
    (2, 2, 0, None),  # the same position through every block
    (0, 6, 1, 3),  # across positions through the middle blocks
    (3, 4, 2, 3),  # one block, across positions: only attention carries it
    (4, 4, 0, 1),
])
def test_stream_jacobian_equals_autograd_and_finite_differences(source, target, first, last):
    model, x = tiny(torch.float64), ids(7, seed=1)
    J = stream_jacobian(model, x, source, target, first=first, last=last)
    check_against_the_forward(J, model, x, source, target, first, L if last is None else last)
    assert J.abs().max() > 0


@pytest.mark.parametrize("layer", range(L))
def test_one_block_at_one_position_is_the_block_jacobian(layer):
    model, x = tiny(), ids(6)
    assert torch.equal(stream_jacobian(model, x, 4, 4, first=layer, last=layer + 1),
                       block_jacobian(model, x, layer, 4))


def test_a_later_source_cannot_reach_an_earlier_target():
    with pytest.raises(ValueError, match="source must be <= target.*cannot reach"):
        stream_jacobian(tiny(), ids(6), source=4, target=2)


@pytest.mark.parametrize("call, error, message", [
    (lambda m: block_jacobian(m, ids(6), layer=L, position=0), ValueError, r"layer must be an int in \[0, 3\)"),
    (lambda m: block_jacobian(m, ids(6), layer=-1, position=0), ValueError, "layer must be"),
    (lambda m: block_jacobian(m, ids(6), layer=True, position=0), ValueError, "layer must be"),
    (lambda m: block_jacobian(m, ids(6), layer=0, position=6), ValueError, r"position must be an int in \[0, 6\)"),
    (lambda m: block_jacobian(m, ids(1, 6), layer=0, position=0), ValueError, r"shape \(T,\): one sequence"),
    (lambda m: block_jacobian(m, ids(6).float(), layer=0, position=0), TypeError, "int64 or int32"),
    (lambda m: stream_jacobian(m, ids(6), 0, 6), ValueError, r"target must be an int in \[0, 6\)"),
    (lambda m: stream_jacobian(m, ids(6), 0, 1, first=2, last=2), ValueError, r"first must be an int in \[0, 2\)"),
    (lambda m: stream_jacobian(m, ids(6), 0, 1, last=L + 1), ValueError, r"last must be an int in \[1, 4\)"),
    (lambda m: stream_jacobian(m, ids(6), 0, 1, last=0), ValueError, "last must be"),
    (lambda m: stream_jacobian(m, ids(1, 6), 0, 1), ValueError, "one sequence"),
    (lambda m: residual_stream(m, ids(6)), ValueError, r"input_ids must have shape \(B, T\)"),
    (lambda m: residual_stream(m, [[1, 2]]), TypeError, "tensor of token ids"),
])
def test_bad_arguments_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(tiny())
