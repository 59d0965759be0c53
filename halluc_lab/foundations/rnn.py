"""An Elman RNN language model and its back-propagation through time, derived by hand.

Chapter 1. Source: 003 §2 (unrolled recurrent neural network): the forward pass
a_t = W_xh x_t + W_hh h_{t-1} + b_h, h_t = f(a_t), z_t = W_ho h_t + b_o, p_t = softmax(z_t);
the loss L = Σ_t ℓ_t with ℓ_t = -y_{t+1}ᵀ log p_t; and the boxed results (i)–(vii):

    (i)   ∇_{z_t} ℓ_t = p_t - y_{t+1}
    (ii)  δ_t = ∇_{h_t} ℓ_t = W_hoᵀ (p_t - y_{t+1})
    (iii) J_t = ∂h_t / ∂h_{t-1} = D_t W_hh,  D_t = diag f'(a_t)
    (iv)  s_t = ∇_{h_t} L = δ_t + J_{t+1}ᵀ s_{t+1}
    (v)   r_t = ∇_{a_t} L = D_t s_t = f'(a_t) ⊙ s_t
    (vi)  ∇_{W_ho} L = Σ_t (p_t - y_{t+1}) h_tᵀ,  ∇_{b_o} L = Σ_t (p_t - y_{t+1})
    (vii) ∇_{W_xh} L = Σ_t r_t x_tᵀ,  ∇_{W_hh} L = Σ_t r_t h_{t-1}ᵀ,  ∇_{b_h} L = Σ_t r_t

:func:`bptt` computes them in that order; :func:`autograd_reference` gets the same quantities from
torch.autograd; :func:`gradient_check` compares the two in float64.

Where the code departs from or completes 003:

- f = tanh, so f'(a) = 1 - tanh(a)² = 1 - h².
- 003 leaves the ends of the recursion implicit: h_0 = 0 (unless given) and s_{T+1} = 0, so
  s_T = δ_T.
- Batched: every quantity gets a leading batch dimension B, and the parameter gradients sum over
  the batch as well as over t (the loss is a sum over sequences). An optional mask drops padded
  positions from the loss (ℓ_t of a masked position is 0, so its p - y is zeroed).
- (iv) is evaluated as W_hhᵀ (D_{t+1} s_{t+1}) — the same product as J_{t+1}ᵀ s_{t+1} by (iii),
  without building the H × H matrices; :func:`jacobians` builds them for the check of (iii).
- Inputs are one-hot symbols when the model reads tokens (p = R, and W_xh x_t picks a column of
  W_xh); the gradient functions take any inputs x_t ∈ R^p.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

GRADIENT_NAMES = ("dz", "delta", "J", "s", "r", "W_ho", "b_o", "W_xh", "W_hh", "b_h")


@dataclass(frozen=True)
class RNNConfig:
    """Sizes of an Elman RNN language model."""

    vocab_size: int  # R: the symbols it reads (one-hot, so p = R) and predicts
    hidden_size: int  # H: the width of the hidden state h_t
    init_scale: float = 1.0  # weights ~ N(0, init_scale² / fan_in); biases start at 0


@dataclass(frozen=True)
class Trace:
    """Every intermediate of a forward pass; a_t and h_t one tensor per step, so autograd can reach
    each."""

    a: tuple[torch.Tensor, ...]  # T × (B, H) hidden pre-activations a_1 … a_T
    h: tuple[torch.Tensor, ...]  # (T + 1) × (B, H) hidden states h_0 … h_T
    z: torch.Tensor  # (B, T, R) logits z_1 … z_T
    p: torch.Tensor  # (B, T, R) next-symbol distributions p_1 … p_T


@dataclass(frozen=True)
class Gradients:
    """The boxed quantities of 003 §2, stacked over time, and the parameter gradients."""

    loss: torch.Tensor  # () L = Σ_b Σ_t ℓ_t over unmasked positions
    dz: torch.Tensor  # (B, T, R) (i)   ∇_{z_t} ℓ_t = p_t - y_{t+1}
    delta: torch.Tensor  # (B, T, H) (ii)  δ_t = W_hoᵀ (p_t - y_{t+1})
    s: torch.Tensor  # (B, T, H) (iv)  s_t = ∇_{h_t} L
    r: torch.Tensor  # (B, T, H) (v)   r_t = ∇_{a_t} L
    W_ho: torch.Tensor  # (R, H) (vi)
    b_o: torch.Tensor  # (R,) (vi)
    W_xh: torch.Tensor  # (H, p) (vii)
    W_hh: torch.Tensor  # (H, H) (vii)
    b_h: torch.Tensor  # (H,) (vii)


class ElmanLM(nn.Module):
    """An Elman RNN language model with 003's parameter names; ``model(tokens)`` gives logits.

    Example:
        >>> model = ElmanLM(RNNConfig(vocab_size=5, hidden_size=8),
        ...                 torch.Generator().manual_seed(0))
        >>> model(torch.tensor([[0, 1, 2]])).shape        # (B, T, R)
        torch.Size([1, 3, 5])
    """

    def __init__(self, config: RNNConfig, generator: torch.Generator):
        """Initialise on the generator's device, from the generator (randomness is explicit)."""
        super().__init__()
        for name in ("vocab_size", "hidden_size"):
            value = getattr(config, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.{name} must be an int ≥ 1, got {value!r}")
        if not config.init_scale > 0:
            raise ValueError(f"config.init_scale must be > 0, got {config.init_scale!r}")
        self.config = config
        r, h, p = config.vocab_size, config.hidden_size, config.vocab_size

        def init(rows: int, cols: int) -> nn.Parameter:
            w = torch.randn(rows, cols, generator=generator, device=generator.device)
            return nn.Parameter(w * config.init_scale / cols ** 0.5)

        def bias(n: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(n, device=generator.device))

        self.W_xh, self.W_hh, self.b_h = init(h, p), init(h, h), bias(h)
        self.W_ho, self.b_o = init(r, h), bias(r)

    def trace(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> Trace:
        """The forward pass of 003 §2.2 over inputs x (B, T, p), keeping every intermediate."""
        if x.dim() != 3 or x.shape[-1] != self.W_xh.shape[1]:
            raise ValueError(f"x must have shape (B, T, {self.W_xh.shape[1]}), "
                             f"got {tuple(x.shape)}")
        b, hidden = x.shape[0], self.W_hh.shape[0]
        h_prev = x.new_zeros(b, hidden) if h0 is None else h0  # (B, H): h_0 = 0 unless given
        if h_prev.shape != (b, hidden):
            raise ValueError(f"h0 must have shape ({b}, {hidden}), got {tuple(h_prev.shape)}")
        # W_xh x_t + b_h does not depend on the past: one product for all t (the same sums as 003's)
        drive = x @ self.W_xh.T + self.b_h  # (B, T, H)
        a_s, h_s = [], [h_prev]
        for t in range(x.shape[1]):  # the recurrence itself is sequential
            a = drive[:, t] + h_prev @ self.W_hh.T  # (B, H)
            h_prev = torch.tanh(a)  # (B, H)
            a_s.append(a), h_s.append(h_prev)
        # the outputs depend on h_t alone: again one product for all t
        z = torch.stack(h_s[1:], dim=1) @ self.W_ho.T + self.b_o  # (B, T, R)
        return Trace(a=tuple(a_s), h=tuple(h_s), z=z, p=torch.softmax(z, dim=-1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, R) logits; position t predicts token t + 1."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            raise TypeError("tokens must be a (B, T) torch.long tensor")
        if bool((tokens < 0).any()) or bool((tokens >= self.config.vocab_size).any()):
            raise ValueError(f"tokens must be ids in [0, {self.config.vocab_size - 1}]")
        x = F.one_hot(tokens, self.config.vocab_size).to(self.W_xh.dtype)  # (B, T, R)
        return self.trace(x).z  # (B, T, R)


def _check_batch(model: ElmanLM, x: torch.Tensor, targets: torch.Tensor,
                 mask: torch.Tensor | None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        raise TypeError("x must be a floating-point (B, T, p) tensor of inputs")
    if (not isinstance(targets, torch.Tensor) or targets.dtype != torch.long
            or targets.shape != x.shape[:2]):
        raise ValueError(f"targets must be a torch.long tensor of shape {tuple(x.shape[:2])}")
    if bool((targets < 0).any()) or bool((targets >= model.config.vocab_size).any()):
        raise ValueError(f"targets must be ids in [0, {model.config.vocab_size - 1}]")
    if mask is None:
        return torch.ones_like(targets, dtype=torch.bool)
    if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
            or mask.shape != targets.shape):
        raise ValueError(f"mask must be a bool tensor of shape {tuple(targets.shape)}")
    return mask


def sequence_loss(model: ElmanLM, x: torch.Tensor, targets: torch.Tensor,
                  mask: torch.Tensor | None = None, h0: torch.Tensor | None = None) -> torch.Tensor:
    """L = Σ_b Σ_t ℓ_t, ℓ_t = -log p_t[target_t] (003 §2.3), over unmasked positions.

    Args:
        x: (B, T, p) inputs x_1 … x_T.
        targets: (B, T) ids of the symbols to predict, y_2 … y_{T+1}.
        mask: optional (B, T) bool, False at padding.

    Returns:
        the scalar summed loss (divide by ``mask.sum()`` for the mean per-token cross-entropy).
    """
    mask = _check_batch(model, x, targets, mask)
    z = model.trace(x, h0).z  # (B, T, R)
    nll = F.cross_entropy(z.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    return torch.where(mask, nll, torch.zeros_like(nll)).sum()


@torch.no_grad()
def bptt(model: ElmanLM, x: torch.Tensor, targets: torch.Tensor,
         mask: torch.Tensor | None = None, h0: torch.Tensor | None = None) -> Gradients:
    """The hand-derived gradients (i)–(vii) of 003 §2, computed in that order.

    Args:
        x: (B, T, p) inputs; targets: (B, T) ids; mask: optional (B, T) bool.

    Returns:
        :class:`Gradients` of :func:`sequence_loss` with the same arguments.
    """
    mask = _check_batch(model, x, targets, mask)
    tr = model.trace(x, h0)
    n_steps = x.shape[1]
    y = F.one_hot(targets, model.config.vocab_size).to(x.dtype)  # (B, T, R): y_{t+1} one-hot
    dz = (tr.p - y) * mask[..., None]  # (B, T, R)  (i), zero where masked
    delta = dz @ model.W_ho  # (B, T, H)  (ii): W_hoᵀ (p - y), as row vectors
    nll = -torch.log_softmax(tr.z, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    h = torch.stack(tr.h, dim=1)  # (B, T+1, H): h_0 … h_T
    d = 1 - h[:, 1:] ** 2  # (B, T, H): f'(a_t) = 1 - tanh²(a_t), the diagonal of D_t
    s = torch.zeros_like(delta)  # (B, T, H)
    future = torch.zeros_like(delta[:, 0])  # (B, H): J_{T+1}ᵀ s_{T+1} = 0 at the end
    for t in reversed(range(n_steps)):
        s[:, t] = delta[:, t] + future  # (iv)
        future = (d[:, t] * s[:, t]) @ model.W_hh  # (B, H): J_tᵀ s_t = W_hhᵀ D_t s_t  (iii)
    r = d * s  # (B, T, H)  (v)
    return Gradients(
        loss=torch.where(mask, nll, torch.zeros_like(nll)).sum(), dz=dz, delta=delta, s=s, r=r,
        W_ho=torch.einsum("btr,bth->rh", dz, h[:, 1:]),  # (vi) Σ (p - y) h_tᵀ
        b_o=dz.sum(dim=(0, 1)),  # (vi)
        W_xh=torch.einsum("bti,btj->ij", r, x),  # (vii) Σ r_t x_tᵀ
        W_hh=torch.einsum("bti,btj->ij", r, h[:, :-1]),  # (vii) Σ r_t h_{t-1}ᵀ
        b_h=r.sum(dim=(0, 1)),  # (vii)
    )


@torch.no_grad()
def jacobians(model: ElmanLM, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """(iii) J_t = D_t W_hh for t = 1 … T: (B, T, H, H)."""
    h = torch.stack(model.trace(x, h0).h[1:], dim=1)  # (B, T, H)
    return (1 - h ** 2)[..., None] * model.W_hh  # (B, T, H, H): row i scaled by f'(a_t)_i


def autograd_reference(model: ElmanLM, x: torch.Tensor, targets: torch.Tensor,
                       mask: torch.Tensor | None = None, h0: torch.Tensor | None = None
                       ) -> tuple[Gradients, torch.Tensor]:
    """The same quantities from torch.autograd (and J_t from autograd Jacobians), for the check.

    Returns:
        the :class:`Gradients` and J (B, T, H, H).
    """
    mask = _check_batch(model, x, targets, mask)
    if h0 is None:  # a leaf, so that autograd can differentiate h_1 with respect to h_0
        h0 = x.new_zeros(x.shape[0], model.W_hh.shape[0])
    with torch.enable_grad():
        tr = model.trace(x, h0.detach().requires_grad_())
        nll = [F.cross_entropy(tr.z[:, t], targets[:, t], reduction="none") * mask[:, t]
               for t in range(x.shape[1])]
        loss = torch.stack(nll).sum()
        params = (model.W_ho, model.b_o, model.W_xh, model.W_hh, model.b_h)
        # z_t reaches L only through ℓ_t, so ∇ of the stacked z is (i) at every t at once
        out = torch.autograd.grad(loss, [tr.z, *tr.h[1:], *tr.a, *params], retain_graph=True)
        n = x.shape[1]
        dz = out[0]
        s, r = (torch.stack(out[1 + i * n:1 + (i + 1) * n], dim=1) for i in range(2))
        # δ_t = ∇_{h_t} ℓ_t: the gradient of the t-th loss term alone
        delta = torch.stack([torch.autograd.grad(nll[t].sum(), tr.h[t + 1], retain_graph=True)[0]
                             for t in range(n)], dim=1)
        jac = []
        for t in range(n):  # ∂h_t / ∂h_{t-1}, row by row: each row is one vector-Jacobian product
            rows = [torch.autograd.grad(tr.h[t + 1][:, i].sum(), tr.h[t], retain_graph=True)[0]
                    for i in range(tr.h[t].shape[1])]
            jac.append(torch.stack(rows, dim=1))  # (B, H, H)
    w_ho, b_o, w_xh, w_hh, b_h = out[1 + 2 * n:]
    grads = Gradients(loss=loss.detach(), dz=dz, delta=delta, s=s, r=r, W_ho=w_ho, b_o=b_o,
                      W_xh=w_xh, W_hh=w_hh, b_h=b_h)
    return grads, torch.stack(jac, dim=1)


def relative_error(hand: torch.Tensor, reference: torch.Tensor) -> float:
    """max |hand - reference| / max |reference| (the absolute error where the reference is all
    0)."""
    err = (hand - reference).abs().max().item()
    scale = reference.abs().max().item()
    return err / scale if scale > 0 else err


def gradient_check(model: ElmanLM, x: torch.Tensor, targets: torch.Tensor,
                   mask: torch.Tensor | None = None) -> dict[str, float]:
    """Largest relative error of each hand-derived quantity (i)–(vii) against autograd, in float64.

    The model and inputs are copied to float64 first (the check is about the algebra, not about
    rounding). In float64 every error should be ~1e-15; chapter 1 asserts < 1e-8.

    Args:
        model: any :class:`ElmanLM` (not modified).
        x: (B, T, p) inputs; targets: (B, T) ids; mask: optional (B, T) bool.

    Returns:
        {name: error} for the names in ``GRADIENT_NAMES``.

    Example:
        >>> errors = gradient_check(model, x, targets)              # doctest: +SKIP
        >>> max(errors.values()) < 1e-8                             # doctest: +SKIP
        True
    """
    m64 = copy.deepcopy(model).to(torch.float64)
    x64 = x.to(torch.float64)
    hand = bptt(m64, x64, targets, mask)
    auto, jac = autograd_reference(m64, x64, targets, mask)
    errors = {name: relative_error(getattr(hand, name), getattr(auto, name))
              for name in GRADIENT_NAMES if name != "J"}
    errors["J"] = relative_error(jacobians(m64, x64), jac)
    return {name: errors[name] for name in GRADIENT_NAMES}


def train_lm(model: ElmanLM, tokens: torch.Tensor, mask: torch.Tensor, steps: int, batch_size: int,
             lr: float, generator: torch.Generator, progress=None) -> list[float]:
    """Train on token rows with the hand-derived gradients of :func:`bptt` and Adam; a plain loop.

    Args:
        tokens: (N, T) training sequences (BOS first); inputs are tokens[:, :-1], targets tokens[:,
        1:]. mask: (N, T - 1) bool, the real predictions (``autoregressive.prediction_mask``).
        steps, batch_size, lr: the optimisation; rows are drawn with ``generator``.
        progress: optional wrapper for the step iterator (e.g. ``halluc_lab.progress.progress``).

    Returns:
        the mean per-token cross-entropy (nats) of each step's batch.
    """
    if tokens.dim() != 2 or mask.shape != (tokens.shape[0], tokens.shape[1] - 1):
        raise ValueError(f"tokens must be (N, T) and mask (N, T - 1); got {tuple(tokens.shape)} "
                         f"and {tuple(mask.shape)}")
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {value!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    eye = torch.eye(model.config.vocab_size, dtype=model.W_xh.dtype, device=tokens.device)
    losses = []
    for _ in (progress or iter)(range(steps)):
        rows = torch.randint(0, tokens.shape[0], (batch_size,), generator=generator,
                             device=generator.device).to(tokens.device)
        batch, m = tokens[rows], mask[rows]  # (b, T), (b, T-1)
        width = int(m.any(dim=0).nonzero().max()) + 1  # drop columns that are padding in every row
        batch, m = batch[:, :width + 1], m[:, :width]
        # one-hot inputs (b, T-1, R), targets (b, T-1)
        x, targets = eye[batch[:, :-1]], batch[:, 1:]
        n_tok = m.sum().clamp_min(1)
        g = bptt(model, x, targets, m)
        losses.append(float(g.loss / n_tok))
        for name, param in model.named_parameters():  # W_xh, W_hh, b_h, W_ho, b_o
            # the mean loss: the sum's gradient over the count
            param.grad = getattr(g, name) / n_tok
        opt.step()
    return losses
