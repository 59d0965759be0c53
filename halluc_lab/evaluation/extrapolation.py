"""Reading past the training length: chapter 5's experiment on RoPE and its scalings.

Chapter 5 (positional encodings; 004 §7.4–7.5, 001 Part 1 §3 and App. A). A decoder trained on
sequences of L tokens reads sequences of 2L, 4L and 8L, with RoPE unchanged and under PI,
NTK-aware scaling and YaRN (``positional.RopeScaling``), zero-shot and after a short fine-tune.
The sequences (:class:`ChainRecall`) mix two synthetic contents whose best achievable loss is
known:

- a chain where token x_t is one of ``n_succ`` successors of x_{t−1}, and x_{t−lag} mod n_succ
  picks which, except that with probability ``noise`` a random one is taken: its perplexity
  beyond L measures whether a model tolerates positions it never trained at;
- key–value pairs written over the chain, a pair every ``tokens_per_pair`` tokens on average;
  each sequence binds each key to a value, and from a key's second appearance on its value is
  recalled. A value token names its key (value v of key k is its own token), so recall is one
  attention look-up. Evaluation sequences end with a probe: a key that appears twice, the first
  time d tokens back.

The loss counts the chain steps whose history (x_{t−1} and x_{t−lag}) is intact and the recalled
values (:meth:`Rows.batch`). :func:`run_seed` trains, fine-tunes and reads one seed;
:func:`read` gives a model's chain loss by position and its probe recall; :func:`perplexity`
and :func:`recall` turn readings over seeds into bootstrap intervals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from halluc_lab.device import Runtime
from halluc_lab.evaluation import stats
from halluc_lab.model.positional import RopeScaling
from halluc_lab.model.transformer import ModelConfig, Transformer
from halluc_lab.training.data import Batch
from halluc_lab.training.losses import IGNORE
from halluc_lab.training.train import TrainConfig, train


@dataclasses.dataclass
class Rows:
    """Sequences and what the loss and the evaluation read from them; one row per sequence."""

    ids: torch.Tensor  # (n, T) token ids
    chain: torch.Tensor  # (n, T) bool: x_t is a chain step, its history x_{t−1}, x_{t−lag} intact
    recall: torch.Tensor  # (n, T) bool: x_t is a value recalled from its key's earlier appearance
    probe: torch.Tensor  # (n,) position of the probe's recalled value; −1 where there is none
    distance: torch.Tensor  # (n,) tokens between the probe key's two appearances; 0 without a probe

    def batch(self) -> Batch:
        """Labels on the chain steps and recalled values, IGNORE elsewhere (the loss shifts)."""
        return Batch(self.ids, torch.where(self.chain | self.recall, self.ids, IGNORE))

    @staticmethod
    def cat(parts: list[Rows]) -> Rows:
        fields = dataclasses.fields(Rows)
        return Rows(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields))


def spaced_starts(n_rows: int, n: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    """(n_rows, n) sorted positions in [lo, hi], any two at least 2 apart so that a key and its
    value fit after each; uniform over such sets (n sorted draws from hi − lo − n + 2 places, the
    i-th shifted right by i)."""
    places = hi - lo - n + 2
    if places < n:
        raise ValueError(f"{n} key–value pairs do not fit between positions {lo} and {hi + 1}")
    draws = np.sort(rng.random((n_rows, places)).argsort(axis=1)[:, :n], axis=1)
    return lo + draws + np.arange(n)


@dataclasses.dataclass(frozen=True)
class ChainRecall:
    """The experiment's sequences: a chain with a ``lag``-back dependency, key–value pairs on it."""

    v_chain: int = 64  # chain tokens, ids 0 … v_chain − 1
    n_succ: int = 4  # successors of each chain token
    lag: int = 12  # x_{t−lag} mod n_succ picks the successor of x_{t−1}
    noise: float = 0.25  # probability that a random successor is taken instead
    n_keys: int = 16  # key tokens
    n_values: int = 16  # values of each key
    tokens_per_pair: int = 8  # tokens per key–value pair, on average

    @property
    def key0(self) -> int:
        """The id of the first key token."""
        return self.v_chain

    @property
    def value0(self) -> int:
        """The id of value 0 of key 0; value v of key k is value0 + k·n_values + v."""
        return self.v_chain + self.n_keys

    @property
    def vocab_size(self) -> int:
        return self.v_chain + self.n_keys + self.n_keys * self.n_values

    def successors(self, rng: np.random.Generator) -> np.ndarray:
        """(v_chain, n_succ) the successors of each chain token, distinct, drawn from ``rng``."""
        return np.stack([rng.choice(self.v_chain, self.n_succ, replace=False)
                         for _ in range(self.v_chain)])

    def chain_walks(self, successors: np.ndarray, n_rows: int, length: int,
                    rng: np.random.Generator) -> np.ndarray:
        """Walks where x_{t−lag} picks the successor of x_{t−1} (a random one with prob. noise);
        (n_rows, length)."""
        lag = self.lag
        out = np.empty((n_rows, length), dtype=np.int64)
        out[:, :lag] = rng.integers(0, self.v_chain, size=(n_rows, min(lag, length)))
        noisy = rng.random((n_rows, length)) < self.noise
        random_pick = rng.integers(0, self.n_succ, size=(n_rows, length))
        for t in range(lag, length):
            pick = np.where(noisy[:, t], random_pick[:, t], out[:, t - lag] % self.n_succ)  # (n,)
            out[:, t] = successors[out[:, t - 1], pick]
        return out

    def sequences(self, successors: np.ndarray, n_rows: int, length: int, rng: np.random.Generator,
                  probe_distance: int | None = None) -> Rows:
        """Chain walks with key–value pairs written over them, one per tokens_per_pair tokens.

        Each sequence binds every key to a value; a key can appear several times, always followed
        by its value, and from its second appearance on the value is recalled. With
        ``probe_distance`` d, the probe key appears exactly twice: as the second-to-last token, and
        d tokens earlier.
        """
        n_keys, lag = self.n_keys, self.lag
        ids = self.chain_walks(successors, n_rows, length, rng)
        n = max(2, length // self.tokens_per_pair)  # appearances of keys in a row
        lo, hi = lag, length - 2  # where a key may sit: after the random start, room for its value
        rows = np.arange(n_rows)[:, None]
        if probe_distance is None:
            starts = spaced_starts(n_rows, n, lo, hi, rng)  # (n_rows, n)
            keys = rng.integers(0, n_keys, size=(n_rows, n))
        else:
            first, last = hi - probe_distance, hi
            if first < lo:
                raise ValueError(f"a probe {probe_distance} tokens back does not fit in {length} "
                                 "tokens")
            others = spaced_starts(n_rows, n - 2, lo, hi, rng)
            near = lambda at: np.abs(others - at) <= 1  # noqa: E731  (n_rows, n − 2)
            while (clash := (near(first) | near(last)).any(axis=1)).any():
                others[clash] = spaced_starts(int(clash.sum()), n - 2, lo, hi, rng)  # redraw them
            probe_key = rng.integers(0, n_keys, size=(n_rows, 1))
            # never the probe's key
            other_keys = (probe_key + 1 + rng.integers(0, n_keys - 1, size=(n_rows, n - 2))
                          ) % n_keys
            starts = np.concatenate([np.tile([first, last], (n_rows, 1)), others], axis=1)
            keys = np.concatenate([probe_key, probe_key, other_keys], axis=1)
        order = np.argsort(starts, axis=1)
        starts = np.take_along_axis(starts, order, axis=1)
        keys = np.take_along_axis(keys, order, axis=1)
        binding = rng.integers(0, self.n_values, size=(n_rows, n_keys))  # each key's value here
        ids[rows, starts] = self.key0 + keys
        ids[rows, starts + 1] = (self.value0 + keys * self.n_values
                                 + np.take_along_axis(binding, keys, axis=1))
        planted = np.zeros(ids.shape, dtype=bool)
        planted[rows, starts] = planted[rows, starts + 1] = True
        # (n_rows, n) the key appeared before
        again = np.tril(keys[:, :, None] == keys[:, None, :], k=-1).any(axis=2)
        recall = np.zeros_like(planted)
        recall[rows, starts + 1] = again
        chain = np.zeros_like(planted)
        chain[:, lag:] = ~(planted[:, lag:] | planted[:, lag - 1:-1] | planted[:, :-lag])
        probe = np.full(n_rows, -1 if probe_distance is None else hi + 1)
        distance = np.full(n_rows, probe_distance or 0)
        return Rows(*(torch.from_numpy(a) for a in (ids, chain, recall, probe, distance)))

    def stream(self, successors: np.ndarray, n_rows: int, length: int, seed: int, tag: int):
        """``step -> Batch`` of fresh sequences (seeded by seed, tag and step): none seen twice."""
        return lambda step: self.sequences(successors, n_rows, length,
                                           np.random.default_rng([seed, tag, step])).batch()

    def pairs_consistent(self, rows: Rows) -> bool:
        """Every appearance of a key is followed by the same value, exactly the later appearances'
        values are recalled, and a probe's key appears twice: at the probe and d tokens before."""
        key0, value0 = self.key0, self.value0
        for ids, recalled, probe, d in zip(rows.ids.numpy(), rows.recall.numpy(),
                                           rows.probe.numpy(), rows.distance.numpy()):
            at = np.flatnonzero((ids >= key0) & (ids < value0))  # key positions, in order
            bound, expected = {}, np.zeros_like(recalled)
            for p in at:
                if bound.setdefault(ids[p], ids[p + 1]) != ids[p + 1]:
                    return False  # a key followed by two different values
                expected[p + 1] = np.sum(ids[at] == ids[p]) > 1 and p != at[ids[at] == ids[p]][0]
            if (recalled != expected).any():
                return False
            if probe >= 0 and list(at[ids[at] == ids[probe - 1]]) != [probe - 1 - d, probe - 1]:
                return False
        return True

    def token_name(self, tok: int) -> str:
        """c7 for a chain token, K3 for a key, 3:9 for value 9 of key 3."""
        if tok < self.key0:
            return f"c{tok}"
        if tok < self.value0:
            return f"K{tok - self.key0}"
        return "{}:{}".format(*divmod(tok - self.value0, self.n_values))


def probe_distances(mult: int, L: int, lag: int) -> list[int]:
    """The probe's distances in a sequence of mult·L tokens: three inside L, the rest beyond it."""
    near_and_far = [round(f * L) for f in (0.25, 0.5, 0.9, 1.5, 2.5, 3.5, 5, 7)]
    return [d for d in near_and_far if d <= mult * L - 2 - lag]


def evaluation_sets(world: ChainRecall, successors: np.ndarray, seed: int, L: int,
                    mults: Sequence[int], rows_per_distance: int) -> dict[int, Rows]:
    """mult -> rows_per_distance sequences of mult·L tokens for each probe distance (held out: their
    own random stream)."""
    return {m: Rows.cat([world.sequences(successors, rows_per_distance, m * L,
                                         np.random.default_rng([seed, 2, m, d]), d)
                         for d in probe_distances(m, L, world.lag)]) for m in mults}


@dataclasses.dataclass
class Reading:
    """One model read on one evaluation set."""

    curve: torch.Tensor  # (T − 1,) chain loss of targets 1 … T − 1, row mean (NaN: no chain step)
    within: np.ndarray  # (n,) each row's mean chain loss on targets lag … L − 1
    beyond: np.ndarray  # (n,) on targets L … T − 1
    correct: np.ndarray  # (n,) the probe's value is the model's most likely next token
    distance: np.ndarray  # (n,) the probe's distance


@torch.no_grad()
def read(m: Transformer, rows: Rows, L: int, lag: int, rt: Runtime) -> Reading:
    """Chain losses and probe recall of ``m`` on ``rows``, 32 rows at a time on ``rt``'s device."""
    losses, correct = [], []
    for lo in range(0, len(rows.ids), 32):
        x, at = rows.ids[lo:lo + 32].to(rt.device), rows.probe[lo:lo + 32].to(rt.device)
        with rt.autocast():
            logits = m(x)  # (b, T, V)
        losses.append(F.cross_entropy(logits[:, :-1].float().transpose(1, 2), x[:, 1:],
                                      reduction="none").cpu())
        b = torch.arange(len(x), device=rt.device)
        correct.append((logits[b, at - 1].argmax(-1) == x[b, at]).cpu())  # logits before the value
    # (n, T − 1): chain steps only
    loss = torch.cat(losses).masked_fill(~rows.chain[:, 1:], float("nan"))
    per_row_ = lambda a, b: loss[:, a - 1:b - 1].nanmean(1).numpy()  # noqa: E731  targets a … b − 1
    return Reading(loss.nanmean(0), per_row_(lag, L), per_row_(L, loss.shape[1] + 1),
                   torch.cat(correct).numpy(), rows.distance.numpy())


def with_scaling(trained: Transformer, scaling: RopeScaling | None, rt: Runtime) -> Transformer:
    """The same weights with other RoPE frequencies, in eval mode on ``rt``'s device."""
    m = Transformer(dataclasses.replace(trained.config, rope_scaling=scaling), seed=0).to(rt.device)
    m.load_state_dict(trained.state_dict())
    return m.eval()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`run_seed` trains and reads; the scalings are named by the chapter's methods."""

    L: int  # training length
    methods: Sequence[str]  # "no scaling" first; scaling(method, s) gives each one's RoPE
    freq_only: str  # the label of YaRN's frequencies without its attention factor (read zero-shot)
    mults: Sequence[int]  # read zero-shot at mult·L with s = mult
    ft_mult: int  # fine-tune at ft_mult·L
    ft_factors: Sequence[int]  # the factors s each scaled method is fine-tuned with
    train_steps: int  # pre-training steps at L
    finetune_steps: int  # fine-tuning steps at ft_mult·L
    train_rows: int  # sequences per pre-training step
    finetune_rows: int  # sequences per fine-tuning step
    rows_per_distance: int  # evaluation sequences per probe distance


@dataclasses.dataclass
class SeedRun:
    """One seed's model and readings: (seed, stage, method, s, read at mult) -> Reading."""

    model: Transformer  # the pre-trained model
    readings: dict
    final_loss: float  # the last pre-training loss
    n_eval: dict  # mult -> sequences in the evaluation set
    well_formed: bool  # the evaluation sets' pairs are as :class:`ChainRecall` says


def run_seed(world: ChainRecall, config: ModelConfig, seed: int, plan: Plan,
             scaling: Callable[[str, float], RopeScaling | None], rt: Runtime) -> SeedRun:
    """Pre-train at L on fresh sequences, read zero-shot at every mult·L under every method, then
    fine-tune each method at ft_mult·L with each factor (no scaling once) and read at ft_mult·L and
    8L."""
    L, lag, readings = plan.L, world.lag, {}
    autocast_dtype = rt.dtype if rt.device.type == "cuda" else None
    successors = world.successors(np.random.default_rng(seed))  # (v_chain, n_succ)
    evals = evaluation_sets(world, successors, seed, L, plan.mults, plan.rows_per_distance)
    well_formed = all(world.pairs_consistent(rows) for rows in evals.values())
    model = Transformer(config, seed=seed).to(rt.device)
    history = train(model, world.stream(successors, plan.train_rows, L, seed, tag=1),
                    TrainConfig(steps=plan.train_steps, lr=3e-3,
                                warmup_steps=plan.train_steps // 10, log_every=10),
                    autocast_dtype=autocast_dtype, desc=f"seed {seed}: pre-train at L = {L}")
    model.eval()
    for m in plan.mults:
        for meth in plan.methods:
            readings[(seed, "zero-shot", meth, m, m)] = read(
                with_scaling(model, scaling(meth, m), rt), evals[m], L, lag, rt)
        # YaRN's frequencies without its 1/t
        freq_only = dataclasses.replace(scaling("YaRN", m), attention_factor=1.0)
        readings[(seed, "zero-shot", plan.freq_only, m, m)] = read(
            with_scaling(model, freq_only, rt), evals[m], L, lag, rt)
    steps = plan.finetune_steps
    for meth in plan.methods:
        for f in plan.ft_factors if meth != "no scaling" else plan.ft_factors[:1]:
            tuned = with_scaling(model, scaling(meth, f), rt)
            train(tuned, world.stream(successors, plan.finetune_rows, plan.ft_mult * L, seed,
                                      tag=3),
                  TrainConfig(steps=steps, lr=1e-3, warmup_steps=steps // 10, log_every=10),
                  autocast_dtype=autocast_dtype,
                  desc=f"seed {seed}: fine-tune {meth}, s = {f:g}, at {plan.ft_mult}L")
            tuned.eval()
            for m in (plan.ft_mult, 8):
                readings[(seed, "fine-tuned", meth, f, m)] = read(tuned, evals[m], L, lag, rt)
    for f in plan.ft_factors[1:]:  # no scaling has no factor: one fine-tuned model stands for both
        for m in (plan.ft_mult, 8):
            readings[(seed, "fine-tuned", "no scaling", f, m)] = \
                readings[(seed, "fine-tuned", "no scaling", plan.ft_factors[0], m)]
    return SeedRun(model, readings, history.loss[-1], {m: len(evals[m].ids) for m in plan.mults},
                   well_formed)


def per_row(readings: dict, seeds: Sequence[int], key: tuple, field: str, keep=None) -> np.ndarray:
    """(seeds, rows) of a Reading field for ``key`` = (stage, method, s, mult), rows chosen by
    ``keep(distance)``."""
    out = []
    for s_ in seeds:
        r = readings[(s_, *key)]
        values = getattr(r, field).astype(float)
        out.append(values if keep is None else values[keep(r.distance)])
    return np.stack(out)


def perplexity(readings: dict, seeds: Sequence[int], key: tuple, field: str) -> stats.Interval:
    """Chain perplexity, exp of a row's mean loss, with a bootstrap interval over seeds and rows."""
    return stats.bootstrap_mean(per_row(readings, seeds, key, field)).map(math.exp)


def recall(readings: dict, seeds: Sequence[int], key: tuple, keep) -> stats.Interval:
    """Share of probes answered right, rows chosen by ``keep(distance)``, a bootstrap interval."""
    return stats.bootstrap_mean(per_row(readings, seeds, key, "correct", keep))


def moved(a: stats.Interval, b: stats.Interval) -> int:
    """+1 where b lies above a, −1 below, 0 where the intervals overlap (not resolved)."""
    return 1 if b.low > a.high else -1 if b.high < a.low else 0


def binned_ppl(loss: torch.Tensor, width: int) -> np.ndarray:
    """Perplexity in consecutive windows of ``width`` target positions, the last one possibly
    shorter (NaN positions, not chain steps, skipped)."""
    n = -(-len(loss) // width)  # windows, rounded up
    padded = torch.full((n * width,), float("nan"), dtype=loss.dtype)
    padded[:len(loss)] = loss
    return padded.view(n, width).nanmean(-1).exp().numpy()


def mean_curve(readings: dict, seeds: Sequence[int], key: tuple) -> torch.Tensor:
    """The chain loss by position, averaged over seeds."""
    return torch.stack([readings[(s_, *key)].curve for s_ in seeds]).nanmean(0)


def intervals(readings: dict, seeds: Sequence[int], plan: Plan, short: dict[str, str]) -> dict:
    """Every interval the chapter reports, by name: for each method (``short[method]`` in the name),
    zero-shot at each mult·L and fine-tuned with each factor read at ft_mult·L and 8L, the chain's
    perplexity inside L ("within") and beyond ("beyond") and recall at d < L ("near") and d ≥ L
    ("far"), e.g. ``"yarn_ft8_8L_recall_far"``."""
    L = plan.L
    near, far = (lambda d: d < L), (lambda d: d >= L)
    out = {}

    def add(prefix: str, key: tuple) -> None:
        out[f"{prefix}_within"] = perplexity(readings, seeds, key, "within")
        out[f"{prefix}_beyond"] = perplexity(readings, seeds, key, "beyond")
        out[f"{prefix}_recall_near"] = recall(readings, seeds, key, near)
        out[f"{prefix}_recall_far"] = recall(readings, seeds, key, far)

    for meth in plan.methods:
        for m in plan.mults:
            add(f"{short[meth]}_{m}L", ("zero-shot", meth, m, m))
        for f in plan.ft_factors:
            for m in (plan.ft_mult, 8):
                add(f"{short[meth]}_ft{f}_{m}L", ("fine-tuned", meth, f, m))
    return out
