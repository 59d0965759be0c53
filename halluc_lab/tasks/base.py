"""What every synthetic task shares: examples, claims, splits and completion parsing.

Chapters 7–8 (and every later chapter through the recipes). ARCHITECTURE.md §8: the lab trains
its own models on synthetic tasks whose answers a program can check. Each task offers

* seeded generators of prompt/completion :class:`Example` s with disjoint ``"train"`` and
  ``"heldout"`` splits, and a pre-training corpus;
* a verifier with the reward signature ``(prompts, completions, **kw) -> list[float]``
  (the signature TRL's reward functions use, so later chapters can pass it around);
* a claim-level check: which parts of a completion are supported, which are
  hallucinated (:class:`Claim`);
* wrong-but-plausible tokens for the backspace demonstrations of :mod:`halluc_lab.stages.sft`.

Text is space-separated symbols (see :mod:`halluc_lab.model.tokenizer`). A completion as a model
writes it may contain ``<bksp>`` tokens and end in ``<eos>`` and padding:
:func:`completion_symbols` turns it into what the reader of the completion sees.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real

from halluc_lab.model.tokenizer import ABSTAIN, BKSP, BOS, EOS, PAD

SPLITS = ("train", "heldout")
# Claim statuses. A hallucination is a claim the task's world does not support.
SUPPORTED, CONTRADICTED, UNSUPPORTED = "supported", "contradicted", "unsupported"
ABSTAINED, MALFORMED = "abstained", "malformed"
HALLUCINATED = (CONTRADICTED, UNSUPPORTED)


@dataclass(frozen=True)
class Example:
    """One prompt and its correct completion, as space-separated symbols (no special tokens
    except ``<abstain>``; the tokenizer adds ``<bos>``/``<eos>``)."""

    prompt: str  # e.g. "1 2 + 3 4 ="
    completion: str  # e.g. "4 6"


@dataclass(frozen=True)
class Claim:
    """One checkable statement inside a completion."""

    start: int  # index of its first symbol in the cleaned completion
    stop: int  # one past its last symbol
    text: str  # the symbols it covers
    status: str  # SUPPORTED, CONTRADICTED, UNSUPPORTED, ABSTAINED or MALFORMED
    correct: bool  # what the gold completion says here (an abstention can be correct)

    @property
    def hallucinated(self) -> bool:
        """True when the claim states something the task's world does not support."""
        return self.status in HALLUCINATED


def completion_symbols(completion: str | Sequence[str]) -> list[str]:
    """The symbols a completion finally says: cut at ``<eos>``, apply ``<bksp>``, drop padding.

    Each ``<bksp>`` erases the symbol before it; one at the start erases nothing (it cannot
    reach into the prompt).

    >>> completion_symbols("4 7 <bksp> 6 <eos> 9")
    ['4', '6']
    """
    out: list[str] = []
    for _ in writing(completion, out):
        pass
    return out


def writing(completion: str | Sequence[str], text: list[str] | None = None) -> Iterator[str]:
    """Read a completion as it was written: yields each symbol as it is about to be appended to
    ``text`` (the symbols said so far, kept up to date in place), applying every ``<bksp>`` on the
    way and stopping at ``<eos>``; afterwards ``text`` is :func:`completion_symbols`. For checks of
    what was ever written, not only what survived.

    >>> said = []
    >>> [(w, " ".join(said)) for w in writing("4 7 <bksp> 6 <eos> 9", said)]
    [('4', ''), ('7', '4'), ('6', '4')]
    """
    text = [] if text is None else text
    for p in (completion.split() if isinstance(completion, str) else completion):
        if p == EOS:
            return
        if p == BKSP:
            if text:
                text.pop()
        elif p not in (PAD, BOS):
            yield p
            text.append(p)


def split_of(key: str, heldout_fraction: float, salt: int) -> str:
    """Which split a key (a canonical description of an item) falls in: a stable hash.

    Hash-based assignment keeps the splits disjoint however many examples are drawn.
    """
    check_fraction("heldout_fraction", heldout_fraction)
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "heldout" if u < heldout_fraction else "train"


def check_split(split: str, splits: Sequence[str] = SPLITS) -> None:
    """ValueError unless ``split`` is one of ``splits`` (default: ``"train"``, ``"heldout"``)."""
    if split not in splits:
        raise ValueError(f"split must be one of {tuple(splits)}, got {split!r}")


def check_count(name: str, n: int, low: int = 0, high: int | None = None) -> None:
    """ValueError unless ``n`` is an int >= low (and <= high, when given)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < low or (high is not None and n > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {allowed}, got {n!r}")


def check_fraction(name: str, value: float, zero_ok: bool = False) -> None:
    """ValueError unless ``value`` is a number in (0, 1), or [0, 1) with ``zero_ok`` (so never NaN
    or inf)."""
    real = isinstance(value, Real) and not isinstance(value, bool)
    if not (real and (0.0 <= value if zero_ok else 0.0 < value) and value < 1.0):
        raise ValueError(f"{name} must be in {'[0' if zero_ok else '(0'}, 1), got {value!r}")


def check_finite(name: str, value: float) -> None:
    """ValueError unless ``value`` is a finite number (not NaN, not inf)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number in (-inf, inf), got {value!r}")


def document(examples: Sequence[Example]) -> str:
    """A pre-training document of worked examples back to back, each ``prompt completion .``."""
    return " ".join(f"{e.prompt} {e.completion} ." for e in examples)


def rng_for(seed: int, *tags: object) -> random.Random:
    """A Python RNG determined by a seed and tags (e.g. the split): explicit randomness."""
    check_count("seed", seed)
    return random.Random(hashlib.sha256(repr((seed, *tags)).encode()).hexdigest())


def check_lengths(prompts: Sequence, completions: Sequence) -> None:
    """ValueError unless a reward function got as many prompts as completions."""
    if len(prompts) != len(completions):
        raise ValueError(f"prompts and completions must have the same length, "
                         f"got {len(prompts)} and {len(completions)}")


def reward_values(reward: Callable, prompts: Sequence, completions: Sequence) -> list[float]:
    """``reward(prompts, completions)`` as floats, checked where rewards enter training: one real,
    finite number per completion, or an error naming the reward function, the index and the type
    (``float`` alone would turn a string ``"1"`` into 1.0, and a None into an unnamed TypeError)."""
    values = reward(prompts, completions)
    name = getattr(reward, "__qualname__", type(reward).__qualname__)
    values = values.tolist() if hasattr(values, "tolist") else values  # a tensor or an array
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"reward {name} must return one finite number per completion, got "
                        f"{type(values).__name__}")
    values = list(values)
    if len(values) != len(completions):
        raise ValueError(f"reward {name} must return one finite number per completion "
                         f"({len(completions)}), got {len(values)} values")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, Real):
            raise TypeError(f"reward {name} must return one finite number per completion; "
                            f"value {i} is {type(v).__name__} {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"reward {name} must return one finite number per completion; "
                             f"value {i} is {v!r}")
    return [float(v) for v in values]


def exact_reward(gold: list[str], said: list[str], *, correct_reward: float, abstain_reward: float,
                 wrong_reward: float) -> float:
    """The reward of one cleaned completion against the gold one.

    An abstention counts as one only if everything said before ``<abstain>`` agrees with the gold
    answer: an answer that states a wrong fact and then abstains has hallucinated that fact.
    """
    if said == gold:
        return correct_reward
    if ABSTAIN in said:
        stop = said.index(ABSTAIN)
        if said[:stop] == gold[:stop]:
            return abstain_reward
    return wrong_reward


# each config type's task, filled as task modules define them
_TASK_OF_CONFIG: dict[type, type] = {}


def make_task(config) -> Task:
    """The task a config describes: ``make_task(ArithmeticConfig())`` is an :class:`Arithmetic`.

    Each task class names its config (``config_type``), so a config's own module, imported with it,
    is the only task module this needs: a recipe's code is its task's module, not every task's.
    """
    task = _TASK_OF_CONFIG.get(type(config))
    if task is None:
        known = ", ".join(sorted(c.__name__ for c in _TASK_OF_CONFIG)) or "none defined yet"
        raise TypeError(f"config must be a task config ({known}), got {type(config).__name__}")
    return task(config)


class Task:
    """The interface every task implements; :meth:`reward` and :meth:`tokenizer` are shared.

    Subclasses set ``name`` and ``config`` and implement :meth:`symbols`, :meth:`examples`,
    :meth:`examples_by_length`, :meth:`gold`, :meth:`claims`, :meth:`pretraining_documents` and
    :meth:`plausible_error`; a task whose answers can abstain refines :meth:`abstention_warranted`.
    """

    name: str = "task"
    # the frozen config this task is built from (make_task finds it by it)
    config_type: type | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("config_type") is not None:
            _TASK_OF_CONFIG[cls.__dict__["config_type"]] = cls

    def symbols(self) -> tuple[str, ...]:
        """The task's vocabulary, without the special tokens."""
        raise NotImplementedError

    def tokenizer(self):
        """A :class:`~halluc_lab.model.tokenizer.Tokenizer` over :meth:`symbols`."""
        from halluc_lab.model.tokenizer import Tokenizer

        return Tokenizer(self.symbols())

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` examples of one split, determined by ``seed``."""
        raise NotImplementedError

    def gold(self, prompt: str) -> str:
        """The correct completion of a prompt (the verifier's reference)."""
        raise NotImplementedError

    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """Which parts of a completion the task's world supports."""
        raise NotImplementedError

    def pretraining_documents(self, seed: int) -> list[str]:
        """The pre-training corpus: documents of space-separated symbols (no special tokens)."""
        raise NotImplementedError

    def replay_documents(self, seed: int) -> list[str]:
        """The pre-training documents a later stage may replay (SFT's replay): all of them, unless
        the task keeps some facts for evaluation only, which no post-training stage may show
        again."""
        return self.pretraining_documents(seed)

    def plausible_error(self, example: Example, position: int, rng: random.Random) -> str:
        """A wrong symbol a model could plausibly write at completion ``position``."""
        raise NotImplementedError

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """``n`` examples of the split for each answer length the task has, keyed by the length in
        the task's own measure (hops, answer digits, path nodes), shortest first."""
        raise NotImplementedError

    def learning_part(self, prompt: str) -> bool:
        """Whether a held-out prompt lies in the part of the held-out split that post-training
        stages learn from (DPO, RSFT, PPO, RLVR, own-error demonstrations, reward models); the other
        part is only ever evaluated. Default: a stable hash of the prompt halves the split. A task
        whose prompts share look-ups (kb_walk's facts) refines it, so that an evaluated prompt's
        look-ups are not learned through another prompt."""
        return split_of(prompt, 0.5, salt=9) == "heldout"  # independent of the train/held-out hash

    def abstention_warranted(self, prompt: str, completion: str | Sequence[str],
                             claim: Claim) -> bool:
        """Whether an ABSTAINED claim of ``completion`` is what an expert would say in the state the
        completion reached (not only on the gold path). Default: where the gold answer abstains."""
        if claim.status != ABSTAINED:
            raise ValueError(f"claim must be an abstention (status {ABSTAINED!r}), got status "
                             f"{claim.status!r}")
        return claim.correct

    def reward(self, prompts: Sequence[str], completions: Sequence[str | Sequence[str]], *,
               correct_reward: float = 1.0, abstain_reward: float = 0.0, wrong_reward: float = 0.0,
               **kw) -> list[float]:
        """Verifier: ``correct_reward`` for exactly the gold answer (after ``<bksp>`` erasures),
        ``abstain_reward`` for an answer that abstains where the gold one does not, else
        ``wrong_reward``. Extra keyword arguments are accepted and ignored (reward-function
        signature ``(prompts, completions, **kw) -> list[float]``)."""
        check_lengths(prompts, completions)
        for name, value in (("correct_reward", correct_reward), ("abstain_reward", abstain_reward),
                            ("wrong_reward", wrong_reward)):
            check_finite(name, value)
        # G answers share a prompt
        gold = {p: completion_symbols(self.gold(p)) for p in dict.fromkeys(prompts)}
        return [exact_reward(gold[p], completion_symbols(c), correct_reward=correct_reward,
                             abstain_reward=abstain_reward, wrong_reward=wrong_reward)
                for p, c in zip(prompts, completions)]
