"""Softmax, temperature and decoding rules: greedy, top-k, top-p and sampling.

Chapter 3 (softmax, temperature and decoding). Sources: 000 §2.3 (Definition 2), §2.4
(temperature, Proposition 1), §4.1–4.5 (greedy, beam search with a length term, sampling,
Definitions 6 and 7); 001 Part 3 eq. (10) and remark (iv); 002 "Sampling Strategies"; 003 §1
(greedy). The generation loop and beam search that use these rules are
:mod:`halluc_lab.generation.decoding`.

Every function takes logits of shape (..., V) and works over any leading dimensions. The
per-row knobs (``temperature``, ``k``, ``p``) are a Python number or a tensor of shape (...)
holding one value per row. ``validate=True`` checks tensor *values* (NaN, +inf, a row with no
finite logit, per-row knobs out of range), which waits for the device; the generation engine
passes ``validate=False`` inside a CUDA graph, and then nothing here synchronises with the host:
no ``.item()``, no branching on tensor values, no data-dependent shapes. :class:`SamplingParams`
names one setting of the rules (the engine keeps a captured step per setting).

Where this departs from the documents (the chapter shows each):

- Top-k keeps exactly k tokens; ties at the k-th logit are broken towards the lower index.
  Hugging Face's ``TopKLogitsWarper`` and nanoGPT (001 Listing 4) keep every token tied with
  the k-th, so they can keep more than k. k > V keeps everything, as they do.
- Top-p follows 000 Definition 7: the smallest set, in decreasing probability, whose mass is
  ≥ p, so the token that crosses p is kept. 000 §4.5's prose and 002 say "exceeds p", and
  002's ``nucleus_sampling`` (``cumulative <= p``) drops the crossing token (see the errata).
- ``gumbel_max_sample`` defines sampling: ``filter_logits``, then the Gumbel-max trick, which has
  the distribution of ``torch.multinomial`` but, unlike it, needs no check on the host. ``sample``
  (what the engine calls) draws from it in a third to a half of the kernels: it sorts once
  and races exponentials over the ranks (its comments say why), so with a filter its tokens differ.
- Softmaxes are computed in float32 at least (float64 stays float64), so that bf16 logits
  divided by a small temperature do not overflow. The row maximum is subtracted *before* dividing by
  τ ≠ 1, so every scaled logit is ≤ 0: huge logits (3e38) at a small τ give a one-hot distribution,
  not inf − inf = NaN.
- The temperature floor: τ below :data:`MIN_TEMPERATURE` (float32's smallest normal number, about
  1.2e-38) is refused with a ValueError, never rounded to 0 (which gave NaN and token 0). For τ → 0
  decode greedily (:func:`greedy`, ``SamplingParams(greedy=True)``), the limit Proposition 1 names.
  Likewise τ above :data:`MAX_TEMPERATURE` (3.4e38), which float32 holds as inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from halluc_lab.foundations import information  # chapter 1's module owns the definition of entropy

Param = float | int | torch.Tensor  # a scalar, or a tensor with one value per row
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny  # the smallest τ accepted (module docstring)
MAX_TEMPERATURE = torch.finfo(torch.float32).max  # the largest: beyond it float32 holds inf


# --- checks -----------------------------------------------------------------------------------

def _check_logits(logits: torch.Tensor, validate: bool, name: str = "logits") -> None:
    """Shape and dtype always; values (NaN, +inf, all -inf rows) only when ``validate``."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (..., V), got "
                        f"{type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")
    if not validate or logits.numel() == 0:
        return
    checks = [torch.isnan(logits).any(), (logits == math.inf).any(),
              (logits == -math.inf).all(dim=-1).any()]
    # one wait for the device, not three
    has_nan, has_posinf, has_empty_row = torch.stack(checks).tolist()
    if has_nan:
        raise ValueError(f"{name} contain NaN; allowed: finite values or -inf")
    if has_posinf:
        raise ValueError(f"{name} contain +inf; allowed: finite values or -inf")
    if has_empty_row:
        raise ValueError(f"every row of {name} needs at least one finite entry (a row is all -inf)")


def _row_param(value: Param, name: str, logits: torch.Tensor, allowed: str,
               ok: Callable[[object], object], integer: bool, validate: bool) -> Param:
    """A knob as a Python number or a (..., 1) tensor that broadcasts against (..., V) logits."""
    if isinstance(value, torch.Tensor):
        if value.shape != logits.shape[:-1]:
            raise ValueError(f"{name} as a tensor must have one value per row, shape "
                             f"{tuple(logits.shape[:-1])}, got {tuple(value.shape)}")
        if integer and (value.is_floating_point() or value.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
        if validate and value.numel() and not bool(ok(value).all()):
            raise ValueError(f"{name} must be in {allowed} in every row")
        return value.to(logits.device)[..., None]
    kinds = (Integral,) if integer else (Real,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {kind} or a tensor, got {type(value).__name__}")
    if not ok(value):
        raise ValueError(f"{name} must be in {allowed}, got {value!r}")
    return value


def _temperature(value: Param, logits: torch.Tensor | None, validate: bool) -> Param:
    # A finite τ: -inf / inf is NaN, and τ → ∞ is a limit, not a setting (000 §2.4). Below the
    # floor float32 rounds τ to 0 or loses its digits: τ → 0 is greedy, a rule of its own.
    allowed = (f"(0, inf), at least {MIN_TEMPERATURE:.3g} and at most {MAX_TEMPERATURE:.3g} "
               "(float32's normal numbers; for tau -> 0 decode greedily)")
    return _row_param(value, "temperature", logits, allowed,
                      lambda t: (t >= MIN_TEMPERATURE) & (t <= MAX_TEMPERATURE), integer=False,
                      validate=validate)


def _top_k(value: int | torch.Tensor, logits: torch.Tensor | None, validate: bool) -> Param:
    return _row_param(value, "k", logits, "[1, inf)", lambda x: x >= 1, integer=True,
                      validate=validate)


def _top_p(value: float | torch.Tensor, logits: torch.Tensor | None, validate: bool) -> Param:
    return _row_param(value, "p", logits, "(0, 1]", lambda x: (x > 0) & (x <= 1), integer=False,
                      validate=validate)


def _work(logits: torch.Tensor) -> torch.Tensor:
    """Promote half precision to float32; float32 and float64 stay as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _is_one(tau: Param) -> bool:
    return not isinstance(tau, torch.Tensor) and tau == 1


def _scaled(logits: torch.Tensor, tau: Param) -> torch.Tensor:
    """z/τ up to a per-row constant, (..., V): (z − max z)/τ, every entry ≤ 0 and the largest 0, so
    nothing overflows to inf and no inf − inf makes a NaN."""
    z = _work(logits)  # (..., V)
    shifted = z - z.amax(dim=-1, keepdim=True)  # (..., V)
    return shifted if _is_one(tau) else shifted / tau


# --- softmax, temperature, entropy (000 §2.3–2.4, 001 eq. 10) ----------------------------------

def log_softmax(logits: torch.Tensor, temperature: Param = 1.0, *,
                validate: bool = True) -> torch.Tensor:
    """log p^τ(v) = z_v/τ − log Σ_v' exp(z_v'/τ) along the last dimension (000 Definition 2).

    Args:
        logits: (..., V) logits z; -inf entries get log-probability -inf.
        temperature: τ in [MIN_TEMPERATURE, MAX_TEMPERATURE], a number or one per row, shape (...).

    Returns:
        (..., V) log-probabilities, float32 or float64.

    Example:
        >>> log_softmax(torch.tensor([2.0, 1.0, 0.1])).exp()   # 001 Part 3 §4
        tensor([0.6590, 0.2424, 0.0986])
    """
    _check_logits(logits, validate)
    # Subtracting the row maximum changes nothing mathematically (it cancels) but keeps every
    # exponent ≤ 0, so logits of ±1e4 at τ = 1e-4 neither overflow nor lose the top token.
    shifted = _scaled(logits, _temperature(temperature, logits, validate))  # (..., V)
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


def softmax(logits: torch.Tensor, temperature: Param = 1.0, *,
            validate: bool = True) -> torch.Tensor:
    """p^τ(v) = exp(z_v/τ) / Σ_v' exp(z_v'/τ) along the last dimension (000 eq. in §2.4).

    Example:
        >>> softmax(torch.tensor([2.0, 1.0, 0.1]), temperature=0.5)   # 001 Part 3 §4
        tensor([0.8638, 0.1169, 0.0193])
    """
    return log_softmax(logits, temperature, validate=validate).exp()


def entropy(logits: torch.Tensor, temperature: Param = 1.0, unit: str = "nats", *,
            validate: bool = True) -> torch.Tensor:
    """Entropy of softmax(z/τ), shape (...), in "nats" or "bits" (002 "Entropy").

    The probabilities come from :func:`softmax`; the entropy itself is
    :func:`halluc_lab.foundations.information.entropy` (0 · log 0 = 0 for masked tokens).

    Example:
        >>> round(float(entropy(torch.zeros(8), unit="bits")), 6)   # uniform over 8 tokens
        3.0
    """
    return information.entropy(softmax(logits, temperature, validate=validate), dim=-1, unit=unit)


# --- decoding rules (000 §4.1, §4.4, §4.5) -----------------------------------------------------

def greedy(logits: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """argmax_v z_v over the last dimension, shape (...) (000 §4.1); ties go to the lower index."""
    _check_logits(logits, validate)
    return logits.argmax(dim=-1)


def _keep_sorted(logits: torch.Tensor,
                 keep_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Sort each row (descending, stable), decide which ranks to keep, mask the rest with -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # (..., V)
    keep_sorted = keep_fn(sorted_logits, order).expand_as(order)  # (..., V) bool, in rank order
    keep = torch.zeros(order.shape, dtype=torch.bool, device=order.device)
    keep = keep.scatter(-1, order, keep_sorted)  # back to token order
    return logits.masked_fill(~keep, -math.inf)


def top_k_filter(logits: torch.Tensor, k: int | torch.Tensor, *,
                 validate: bool = True) -> torch.Tensor:
    """Keep the k largest logits of each row, set the rest to -inf (000 Definition 6).

    Args:
        logits: (..., V).
        k: an int ≥ 1 or one per row, shape (...); k ≥ V keeps every token.

    Returns:
        (..., V) logits of the same dtype; exactly min(k, V) entries of each row are unchanged
        (ties at the k-th value are broken towards the lower index).

    Example:
        >>> top_k_filter(torch.tensor([2.0, 1.0, 0.1]), 2)
        tensor([2., 1., -inf])
    """
    _check_logits(logits, validate)
    k = _top_k(k, logits, validate)
    rank = torch.arange(logits.shape[-1], device=logits.device)  # (V,)
    return _keep_sorted(logits, lambda sorted_logits, order: rank < k)


def top_p_filter(logits: torch.Tensor, p: float | torch.Tensor, *,
                 validate: bool = True) -> torch.Tensor:
    """Keep the smallest set of top tokens whose probability reaches p; the rest become -inf.

    000 Definition 7: tokens are added in decreasing probability until their mass is ≥ p, so the
    token that crosses p is kept. A token is therefore kept exactly when the tokens ranked
    above it hold less than p. p = 1 keeps every token.

    Args:
        logits: (..., V); the probabilities are softmax(logits) (apply a temperature first).
        p: in (0, 1], a number or one per row, shape (...).

    Returns:
        (..., V) logits of the same dtype with the excluded entries set to -inf.

    Example:
        >>> top_p_filter(torch.tensor([2.0, 1.0, 0.1]), 0.9)   # 0.659 < 0.9 ≤ 0.659 + 0.242
        tensor([2., 1., -inf])
    """
    _check_logits(logits, validate)
    p = _top_p(p, logits, validate)

    def keep(sorted_logits: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        # (..., V), decreasing; as sample() computes it
        probs = torch.softmax(_work(sorted_logits), dim=-1)
        cumulative = probs.cumsum(dim=-1)  # (..., V)
        mass_above = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]],
                               dim=-1)
        # p = 1 keeps all, even where rounding makes the mass above the last token reach 1.
        return (mass_above < p) | (p >= 1)

    return _keep_sorted(logits, keep)


def filter_logits(logits: torch.Tensor, temperature: Param = 1.0,
                  top_k: int | torch.Tensor | None = None,
                  top_p: float | torch.Tensor | None = None, *,
                  validate: bool = True) -> torch.Tensor:
    """The logits that :func:`sample` draws from: z/τ, then top-k, then top-p (Hugging Face's
    order).

    Returns (..., V) in float32 or float64, shifted so that each row's largest entry is 0 (which
    keeps huge logits at a small τ finite); ``softmax`` of it is the sampling distribution.
    """
    _check_logits(logits, validate)
    z = _scaled(logits, _temperature(temperature, logits, validate))  # (..., V), all ≤ 0
    if top_k is not None:
        z = top_k_filter(z, top_k, validate=validate)
    if top_p is not None:
        z = top_p_filter(z, top_p, validate=validate)
    return z


def gumbel_max_sample(logits: torch.Tensor, temperature: Param = 1.0,
                      top_k: int | torch.Tensor | None = None,
                      top_p: float | torch.Tensor | None = None,
                      generator: torch.Generator | None = None, *,
                      validate: bool = True) -> torch.Tensor:
    """The definition of :func:`sample` (same arguments and distribution, other draws):
    Gumbel-max."""
    z = filter_logits(logits, temperature, top_k, top_p, validate=validate)  # (..., V)
    # Gumbel-max: argmax_v (log p_v + G_v) with G_v = -log(-log U_v) i.i.d. is distributed as p.
    # log p_v and z_v differ by a per-row constant, which the argmax ignores.
    u = torch.rand(z.shape, generator=generator, device=z.device, dtype=z.dtype)  # (..., V)
    u = u.clamp_min(torch.finfo(z.dtype).tiny)  # U = 0 would give -inf noise (probability 2^-24)
    gumbel = -torch.log(-torch.log(u))  # (..., V)
    return (z + gumbel).argmax(dim=-1)


def _ranked_probs(logits: torch.Tensor, temperature: Param, top_k: int | torch.Tensor | None,
                  top_p: float | torch.Tensor | None, validate: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """What :func:`sample` draws from: rank r (token ``order[..., r]``, or token r if ``order`` is
    None) has probability ``probs[..., r]`` (..., W) within the top-k set, and top-p drops rank
    r + 1 where ``drop[..., r]`` (..., W - 1) (None: drops nothing). Fixed shapes, no host sync."""
    _check_logits(logits, validate)
    tau = _temperature(temperature, logits, validate)
    k = None if top_k is None else _top_k(top_k, logits, validate)
    p = None if top_p is None else _top_p(top_p, logits, validate)
    V = logits.shape[-1]
    fixed_k, fixed_p = not isinstance(k, torch.Tensor), not isinstance(p, torch.Tensor)
    # filters that keep every token cost nothing
    k = None if fixed_k and k is not None and k >= V else k
    p = None if fixed_p and p is not None and p >= 1 else p
    # At τ = 1 softmax's own shift by the row maximum gives _scaled's bits, with one kernel less.
    z = _work(logits) if _is_one(tau) else _scaled(logits, tau)  # (..., V)
    if k is None and p is None:
        return torch.softmax(z, dim=-1), None, None
    # Rank space, never scattered back: sample a rank, then read its token from `order`. The stable
    # sort breaks ties towards the lower index as top_k_filter does, so top-k is the first k ranks,
    # and top-p then sees what top_p_filter's own sort sees (the same values, -inf past rank k):
    # bitwise the same softmax and cumsum, so the same kept set.
    ranked, order = z.sort(dim=-1, descending=True, stable=True)  # (..., V) each
    if not fixed_k:
        ranked = ranked.masked_fill(torch.arange(V, device=z.device) >= k, -math.inf)
    elif k is not None and p is None:
        ranked, order = ranked[..., :k], order[..., :k]  # (..., k) views: no kernel
    elif k is not None:
        ranked[..., k:].fill_(-math.inf)
    probs = torch.softmax(ranked, dim=-1)  # (..., W)
    if p is None:
        return probs, None, order
    # Definition 7 keeps rank r + 1 while the ranks above it hold < p (top_p_filter's mass_above
    # without its cat); p ≥ 1 keeps every rank, as there.
    drop = probs.cumsum(dim=-1)[..., :-1] >= p  # (..., W - 1)
    return probs, (drop if fixed_p else drop & (p < 1)), order


def sample(logits: torch.Tensor, temperature: Param = 1.0, top_k: int | torch.Tensor | None = None,
           top_p: float | torch.Tensor | None = None, generator: torch.Generator | None = None, *,
           validate: bool = True) -> torch.Tensor:
    """Draw one token per row from softmax(filter_logits(...)) (000 §4.3–4.5, 001 eq. 10).

    The distribution of :func:`gumbel_max_sample` in a third to a half of its kernels (what a decode
    graph pays for). Knobs as in :func:`filter_logits` (None skips a filter); ``generator`` on the
    logits' device: the same state gives the same tokens. Returns (...) token ids (int64).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> sample(torch.tensor([[2.0, 1.0, 0.1]] * 4), temperature=0.5, generator=g).shape
        torch.Size([4])
    """
    probs, drop, order = _ranked_probs(logits, temperature, top_k, top_p, validate)  # (..., W)
    # The exponential race: for E_r ~ Exp(1) i.i.d., E_r / p_r ~ Exp(p_r), and the least of
    # independent exponentials is the r-th with probability p_r / Σ p (the chapter's proof of
    # Gumbel-max, whose noise is -log E): the least E / p samples the kept ranks in proportion to p,
    # unrenormalised. E = -log U, U on [tiny, 1) (gumbel_max_sample's clamped U, in one kernel), is
    # finite and > 0, so p / log U is ≤ 0, never NaN; its argmin wins, and a dropped rank set to 0
    # never does (rank 0 is kept, < 0).
    # (..., W)
    u = torch.empty_like(probs).uniform_(torch.finfo(probs.dtype).tiny, 1.0, generator=generator)
    race = probs / u.log_()  # (..., W)
    if drop is not None:
        race[..., 1:].masked_fill_(drop, 0.0)
    rank = race.argmin(dim=-1, keepdim=True)  # (..., 1)
    return (rank if order is None else order.gather(-1, rank))[..., 0]


class ConflictingSamplingParams(ValueError):
    """Sampling settings that contradict each other: greedy=True with a temperature or a filter."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen (000 §4, 001 eq. 10): the one object that carries these knobs
    from a notebook through :mod:`halluc_lab.evaluation.evaluate` and the RL loops down to the
    engine.

    Checked when made: a bad knob raises ValueError/TypeError naming it, and ``greedy=True`` with a
    temperature other than 1, a ``top_k`` or a ``top_p`` raises :class:`ConflictingSamplingParams`
    (the argmax would silently ignore them).

    Example:
        >>> SamplingParams(temperature=0.7, top_p=0.9)
        SamplingParams(greedy=False, temperature=0.7, top_k=None, top_p=0.9)
        >>> SamplingParams(greedy=True, temperature=5.0)  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ConflictingSamplingParams: greedy=True ... would ignore temperature=5.0; ...
    """

    greedy: bool = False  # argmax of the logits; temperature, top_k and top_p then left unset
    temperature: float = 1.0  # τ in [MIN_TEMPERATURE, MAX_TEMPERATURE]: logits are divided by it
    top_k: int | None = None  # keep the k most likely tokens (000 Def. 6); None = all
    top_p: float | None = None  # keep the smallest set with mass ≥ p (000 Def. 7); None = all

    def __post_init__(self) -> None:
        if not isinstance(self.greedy, bool):
            raise TypeError(f"greedy must be a bool, got {self.greedy!r}")
        for name in ("temperature", "top_k", "top_p"):
            if isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(f"{name} must be a Python number in SamplingParams, not a tensor")
        _temperature(self.temperature, None, validate=True)
        if self.top_k is not None:
            _top_k(self.top_k, None, validate=True)
        if self.top_p is not None:
            _top_p(self.top_p, None, validate=True)
        if self.greedy:
            unset = {"temperature": 1.0, "top_k": None, "top_p": None}
            given = [f"{name}={getattr(self, name)!r}" for name, default in unset.items()
                     if getattr(self, name) != default]
            if given:
                raise ConflictingSamplingParams(
                    f"greedy=True takes the argmax and would ignore {', '.join(given)}; pass "
                    "greedy=True alone, or greedy=False with the sampling settings")

    def choose(self, logits: torch.Tensor, generator: torch.Generator | None = None, *,
               validate: bool = True) -> torch.Tensor:
        """One token per row of ``logits`` (..., V) under this setting: :func:`greedy` or
        :func:`sample` (whose arguments these are)."""
        if self.greedy:
            return greedy(logits, validate=validate)
        return sample(logits, self.temperature, self.top_k, self.top_p, generator,
                      validate=validate)


GREEDY = SamplingParams(greedy=True)  # the argmax: evaluation's default
