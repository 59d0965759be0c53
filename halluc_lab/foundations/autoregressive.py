"""The chain rule on a model: sequence log-probabilities two ways, and free-running generation.

Chapter 1. Sources: 000 §2.1 (Definition 1, the autoregressive factorisation) and §5.6 (causal
language modelling), 002 "Autoregressive Property", "Teacher Forcing", "Training vs Generation",
"Sequence Probability", 003 (the chain rule P(w_1:T) = Π P(w_t | w_<t)).

Named after the concept the chapter teaches — the autoregressive factorisation — rather than after
one model: every function here works on *any* next-token model, a callable
``model(tokens) -> logits`` mapping (B, T) token ids to (B, T, V) logits (or log-probabilities,
``-inf`` allowed) where position t scores the token at t + 1. The n-gram tables of
:mod:`halluc_lab.foundations.ngram` and the RNN of :mod:`halluc_lab.foundations.rnn` are both such
callables.

Conventions, made explicit where the documents leave them implicit:

- Every sequence starts with a start symbol (BOS) that is given, never predicted, so
  P(w_1 … w_n) = Π_{t=1}^{n+1} P(w_t | BOS, w_<t), the last factor being the end symbol (EOS).
  002's ``sequence_probability`` loop starts at i = 1, which is this convention: without a start
  symbol it leaves out P(x_1) (see the chapter's errata).
- After its first EOS a sequence is padded with EOS; :func:`prediction_mask` marks which targets
  are real predictions (every token after BOS up to and including the first EOS).
- Free-running generation here is ancestral sampling from the model's own distribution (τ = 1),
  which samples exactly the joint the chain rule defines. Other decoding strategies (greedy,
  temperature, top-k, top-p, beam) are chapter 3's (:mod:`halluc_lab.generation.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Model = Callable[[torch.Tensor], torch.Tensor]  # (B, T) long -> (B, T, V) logits


def _check_tokens(tokens: torch.Tensor, min_len: int = 1) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
        raise TypeError("tokens must be a torch.long tensor of token ids")
    if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] < min_len:
        raise ValueError(f"tokens must have shape (B, T) with B ≥ 1 and T ≥ {min_len}, "
                         f"got {tuple(tokens.shape)}")
    if bool((tokens < 0).any()):
        raise ValueError("tokens must be non-negative ids")


def _log_probs(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """Call the model and normalise: (B, T) -> (B, T, V) log-probabilities."""
    logits = model(tokens)
    if (not isinstance(logits, torch.Tensor) or logits.dim() != 3
            or logits.shape[:2] != tokens.shape):
        raise ValueError(f"model must map tokens of shape {tuple(tokens.shape)} to logits of shape "
                         f"(B, T, V); got {getattr(logits, 'shape', type(logits).__name__)}")
    if bool(torch.isnan(logits).any()):
        raise ValueError("model returned NaN logits")
    if int(tokens.max()) >= logits.shape[-1]:
        raise ValueError(f"tokens has id {int(tokens.max())} but the model scores only "
                         f"{logits.shape[-1]} symbols")
    work = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: normalise in float32
    return torch.log_softmax(logits.to(work), dim=-1)


def prediction_mask(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Which targets tokens[:, 1:] are real predictions: those up to and including the first EOS.

    Args:
        tokens: (B, T) ids, each row BOS, words, EOS, then EOS padding.
        eos_id: the end symbol's id.

    Returns:
        (B, T - 1) bool; a row that never reaches EOS (truncated) counts all its targets.

    Example:
        >>> prediction_mask(torch.tensor([[0, 5, 9, 9]]), eos_id=9)
        tensor([[ True,  True, False]])
    """
    _check_tokens(tokens, min_len=2)
    is_eos = tokens[:, :-1] == eos_id  # (B, T-1): the *context* is already EOS: padding
    return torch.cumsum(is_eos.long(), dim=1) == 0


def teacher_forced_log_probs(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """log P(x_{t+1} | x_≤t) for every position from ONE forward pass on the true sequence.

    Teacher forcing (002): every prediction conditions on the ground-truth prefix, so all T - 1
    factors of the chain rule come out of a single call, in parallel.

    Args:
        model: (B, T) -> (B, T, V) logits, position t scoring token t + 1.
        tokens: (B, T) ids, starting with BOS.

    Returns:
        (B, T - 1) log-probabilities of tokens[:, 1:].

    Example:
        >>> lp = teacher_forced_log_probs(model, tokens)        # doctest: +SKIP
        >>> (lp * prediction_mask(tokens, eos)).sum(-1)          # log P(sequence)  # doctest: +SKIP
    """
    _check_tokens(tokens, min_len=2)
    log_probs = _log_probs(model, tokens)  # (B, T, V)
    return log_probs[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, T-1)


def stepwise_log_probs(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """The same factors the slow way: 002's ``sequence_probability`` loop, one call per prefix.

    For i = 1 … T - 1 the model sees only tokens[:, :i] and its last position scores token i.
    Equal to :func:`teacher_forced_log_probs` for any causal model (the chain rule is exact);
    costs T - 1 calls instead of one.

    Returns:
        (B, T - 1) log-probabilities of tokens[:, 1:].
    """
    _check_tokens(tokens, min_len=2)
    factors = []
    for i in range(1, tokens.shape[1]):
        log_probs = _log_probs(model, tokens[:, :i])  # (B, i, V): the context is the prefix only
        factors.append(log_probs[:, -1].gather(-1, tokens[:, i, None]).squeeze(-1))  # (B,)
    return torch.stack(factors, dim=1)  # (B, T-1)


def sequence_log_prob(model: Model, tokens: torch.Tensor, eos_id: int,
                      stepwise: bool = False) -> torch.Tensor:
    """log P(sequence) = Σ_t log P(x_t | x_<t) over the real predictions of each row.

    Args:
        tokens: (B, T) ids, BOS first, EOS-padded.
        eos_id: the end symbol's id.
        stepwise: use the one-call-per-prefix loop instead of one teacher-forced pass.

    Returns:
        (B,) log-probabilities (natural log; ``-inf`` if the model rules a token out).
    """
    lp = (stepwise_log_probs if stepwise else teacher_forced_log_probs)(model, tokens)  # (B, T-1)
    mask = prediction_mask(tokens, eos_id)
    return torch.where(mask, lp, torch.zeros_like(lp)).sum(dim=-1)


@torch.no_grad()
def generate(model: Model, prompt: torch.Tensor, max_new_tokens: int, generator: torch.Generator,
             eos_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Free-running (ancestral) sampling: each token is drawn from the model given its OWN prefix.

    002 "Generation: Sequential": n tokens need n calls. A row that has emitted EOS keeps emitting
    EOS (absorbing end) with log-probability 0, so finished rows do not change. A model with a
    ``context_window`` attribute (an n-gram model reads only its last n - 1 symbols) is shown only
    that many last tokens, which gives the same distribution at a fraction of the cost.

    Args:
        model: (B, T) -> (B, T, V) logits.
        prompt: (B, P) ids to continue, e.g. a column of BOS.
        max_new_tokens: how many tokens to append (≥ 0).
        generator: a torch.Generator on the model's device; same seed, same tokens.
        eos_id: the end symbol's id, or None for no end.

    Returns:
        tokens (B, P + max_new_tokens) and the model's log-probability of each new token
        (B, max_new_tokens).

    Example:
        >>> bos = torch.zeros(4, 1, dtype=torch.long)
        >>> g = torch.Generator().manual_seed(0)
        >>> tokens, lp = generate(model, bos, 20, g, eos_id=9)  # doctest: +SKIP
    """
    _check_tokens(prompt)
    if (not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool)
            or max_new_tokens < 0):
        raise ValueError(f"max_new_tokens must be an int ≥ 0, got {max_new_tokens!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError("generator must be a torch.Generator (randomness is explicit)")
    window = getattr(model, "context_window", None)  # a model that reads only its last n tokens
    tokens, new_lp = prompt, []
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)  # (B,)
    for _ in range(max_new_tokens):
        # 002 "Keep only recent context"
        context = tokens if window is None else tokens[:, -window:]
        log_probs = _log_probs(model, context)[:, -1]  # (B, V): the model's next-token distribution
        nxt = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)  # (B,)
        lp = log_probs.gather(-1, nxt[:, None]).squeeze(-1)  # (B,)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            lp = torch.where(done, torch.zeros_like(lp), lp)
            done = done | (nxt == eos_id)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, T+1)
        new_lp.append(lp)
    empty = torch.zeros(prompt.shape[0], 0, device=prompt.device)
    return tokens, torch.stack(new_lp, dim=1) if new_lp else empty
