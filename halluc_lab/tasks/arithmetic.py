"""Multi-digit addition, digit by digit: the task where errors compound visibly.

Chapters 7–8 (exposure bias, 000 §7: accuracy against answer length). A prompt is
``1 2 3 + 4 5 =``, one token per digit, and the completion is the sum ``1 6 8``. With
``reverse_output`` the sum is written least-significant digit first (``8 6 1``), the order in
which carries are computed, which makes the task much easier for a left-to-right model.

* **Splits**: each operand pair is assigned to train or held-out by a hash, so no held-out
  sum is ever seen in pre-training or SFT.
* **Pre-training** documents are train-split equations ``a + b = c .`` back to back.
* **Claims**: each answer digit is one claim; it is supported when it equals the sum's digit
  at that place, contradicted otherwise; digits beyond the sum's length are unsupported.
* **Chain of thought** (``scratchpad``, chapter 12; 001 Part 5 §2, y = (r_1:K, a)): the completion
  first writes the columns, least significant first, each as ``x y c k s ;`` (the digits, the carry
  in, the carry out and the column's digit: x + y + c = 10 k + s), then ``:`` and the sum. 001's
  ``17 + 25`` is ``1 7 + 2 5 =`` → ``7 5 0 1 2 ; 1 2 1 0 4 ; : 4 2``. The verifier asks for the
  whole completion, the reasoning included; :meth:`Arithmetic.final_answer` reads the answer alone,
  and :meth:`Arithmetic.implied_answer` the sum the written working spells (does the answer follow
  from it?).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import (CONTRADICTED, MALFORMED, SUPPORTED, UNSUPPORTED, Claim, Example,
                                   Task, check_count, check_split, completion_symbols, document,
                                   rng_for, split_of)

DIGITS = tuple("0123456789")
# the scratchpad's separators (only in a scratchpad task's vocabulary)
COLUMN_END, ANSWER = ";", ":"
_MAX_TRIES = 10_000  # rejection-sampling budget per example


@dataclass(frozen=True)
class ArithmeticConfig:
    """Operand sizes, answer order, split and corpus size."""

    min_digits: int = 1  # fewest digits in an operand
    max_digits: int = 3  # most digits in an operand
    reverse_output: bool = False  # write the sum least-significant digit first
    heldout_fraction: float = 0.1  # fraction of operand pairs held out
    n_pretrain_documents: int = 2000  # documents in the pre-training corpus
    equations_per_document: int = 4  # equations per pre-training document
    split_seed: int = 0  # salt of the train/held-out hash
    scratchpad: bool = False  # write the column sums before the answer (chain of thought)

    def __post_init__(self):
        check_count("min_digits", self.min_digits, 1)
        check_count("max_digits", self.max_digits, self.min_digits)
        check_count("n_pretrain_documents", self.n_pretrain_documents, 1)
        check_count("equations_per_document", self.equations_per_document, 1)
        check_count("split_seed", self.split_seed)
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")
        if not isinstance(self.scratchpad, bool):
            raise TypeError(f"scratchpad must be a bool, got {self.scratchpad!r}")


class Arithmetic(Task):
    """Addition of two integers written digit by digit.

    >>> task = Arithmetic(ArithmeticConfig(max_digits=2))
    >>> task.gold("4 7 + 5 =")
    '5 2'
    >>> task.reward(["4 7 + 5 ="], ["5 2"]), task.reward(["4 7 + 5 ="], ["5 1"])
    ([1.0], [0.0])
    """

    name = "arithmetic"
    config_type = ArithmeticConfig

    def __init__(self, config: ArithmeticConfig = ArithmeticConfig()):
        self.config = config

    def symbols(self) -> tuple[str, ...]:
        return DIGITS + ("+", "=", ".") + ((COLUMN_END, ANSWER) if self.config.scratchpad else ())

    def _operand(self, rng: random.Random) -> int:
        k = rng.randint(self.config.min_digits, self.config.max_digits)
        return rng.randint(0 if k == 1 else 10 ** (k - 1), 10 ** k - 1)

    def split(self, a: int, b: int) -> str:
        """The split of an operand pair."""
        return split_of(f"{a}+{b}", self.config.heldout_fraction, salt=self.config.split_seed)

    def _answer(self, a: int, b: int) -> list[str]:
        digits = list(str(a + b))
        return digits[::-1] if self.config.reverse_output else digits

    def _completion(self, a: int, b: int) -> list[str]:
        """The answer, after the columns' working when the task writes a scratchpad."""
        if not self.config.scratchpad:
            return self._answer(a, b)
        steps, carry = [], 0
        for i in range(max(len(str(a)), len(str(b)))):
            x, y = a // 10 ** i % 10, b // 10 ** i % 10
            k, digit = divmod(x + y + carry, 10)
            steps += [str(x), str(y), str(carry), str(k), str(digit), COLUMN_END]
            carry = k
        return [*steps, ANSWER, *self._answer(a, b)]

    def final_answer(self, completion: str | Sequence[str]) -> list[str]:
        """The answer a completion gives: what follows its last ``:`` with a scratchpad, all of it
        without."""
        said = completion_symbols(completion)
        if not self.config.scratchpad:
            return said
        return said[len(said) - said[::-1].index(ANSWER):] if ANSWER in said else []

    def implied_answer(self, completion: str | Sequence[str]) -> list[str] | None:
        """The sum a scratchpad's own working spells, right or wrong: its columns' digits ``s`` and
        the last carry out ``k`` (when not 0), in the task's answer order; None when the working
        before ``:`` is not whole columns ``x y c k s ;`` of digits. Beside :meth:`final_answer` it
        tells whether an answer follows from the reasoning written before it.

        >>> task = Arithmetic(ArithmeticConfig(max_digits=2, scratchpad=True))
        >>> (task.implied_answer("7 5 0 1 2 ; 1 2 1 0 4 ; : 4 3"),
        ...  task.implied_answer("7 5 0 1 2 : 4 2"))
        (['4', '2'], None)
        """
        if not self.config.scratchpad:
            raise ValueError("implied_answer needs a scratchpad task "
                             "(ArithmeticConfig(scratchpad=True))")
        said = completion_symbols(completion)
        working = said[:said.index(ANSWER)] if ANSWER in said else said
        columns = [working[i:i + 6] for i in range(0, len(working), 6)]
        if not columns or any(len(c) != 6 or c[5] != COLUMN_END
                              or not all(d in DIGITS for d in c[:5])
                              for c in columns):
            return None
        digits = [c[4] for c in columns]  # least significant first
        if columns[-1][3] != "0":  # the last carry out is the sum's leading digit
            digits.append(columns[-1][3])
        return digits if self.config.reverse_output else digits[::-1]

    def example(self, a: int, b: int) -> Example:
        """The example for ``a + b`` (whatever its split)."""
        if a < 0 or b < 0:
            raise ValueError(f"operands must be non-negative, got {a} and {b}")
        return Example(" ".join([*str(a), "+", *str(b), "="]), " ".join(self._completion(a, b)))

    def _draw(self, rng: random.Random, split: str, answer_digits: int | None) -> tuple[int, int]:
        for _ in range(_MAX_TRIES):
            a, b = self._operand(rng), self._operand(rng)
            if self.split(a, b) == split and (answer_digits is None
                                              or len(str(a + b)) == answer_digits):
                return a, b
        raise ValueError(f"could not draw a {split} pair with a {answer_digits}-digit sum in "
                         f"{_MAX_TRIES} tries")

    def examples(self, split: str, n: int, seed: int,
                 answer_digits: int | None = None) -> list[Example]:
        """``n`` equations of the split; ``answer_digits`` fixes the length of the sum."""
        check_split(split)
        check_count("n", n)
        if answer_digits is not None and not (isinstance(answer_digits, int)
                                              and 1 <= answer_digits <= self.config.max_digits + 1):
            raise ValueError(f"answer_digits must be in [1, {self.config.max_digits + 1}] or None, "
                             f"got {answer_digits!r}")
        rng = rng_for(seed, "arithmetic", split, answer_digits)
        return [self.example(*self._draw(rng, split, answer_digits)) for _ in range(n)]

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """``n`` equations of the split for each length of the sum,
        ``min_digits`` … ``max_digits + 1``."""
        return {k: self.examples(split, n, seed, answer_digits=k)
                for k in range(self.config.min_digits, self.config.max_digits + 2)}

    def _parse_prompt(self, prompt: str) -> tuple[int, int]:
        text = prompt.replace(" ", "")
        left, plus, right = text.partition("+")
        if not plus or not right.endswith("=") or not left.isdigit() or not right[:-1].isdigit():
            raise ValueError(f"not an arithmetic prompt (expected 'd d + d d ='): {prompt!r}")
        return int(left), int(right[:-1])

    def gold(self, prompt: str) -> str:
        return " ".join(self._completion(*self._parse_prompt(prompt)))

    def pretraining_documents(self, seed: int) -> list[str]:
        """Train-split equations ``a + b = c .``, ``equations_per_document`` per document."""
        return [document(eqs) for eqs in self.corpus(seed)]

    def corpus(self, seed: int) -> list[list[Example]]:
        """The equations of :meth:`pretraining_documents`, document by document."""
        rng = rng_for(seed, "arithmetic-pretrain")
        return [[self.example(*self._draw(rng, "train", None))
                 for _ in range(self.config.equations_per_document)]
                for _ in range(self.config.n_pretrain_documents)]

    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """One claim per symbol written (the answer's digits; with a scratchpad, the working's too),
        in order."""
        gold = self.gold(prompt).split()
        out = []
        for i, s in enumerate(completion_symbols(completion)):
            if i < len(gold) and s == gold[i]:
                status = SUPPORTED
            elif s not in DIGITS:
                status = MALFORMED
            else:
                status = UNSUPPORTED if i >= len(gold) else CONTRADICTED
            out.append(Claim(i, i + 1, s, status, i < len(gold) and s == gold[i]))
        return out

    def plausible_error(self, example: Example, position: int, rng: random.Random) -> str:
        """The right digit off by one (a dropped or spurious carry); at a scratchpad separator, a
        digit."""
        gold = example.completion.split()
        if not 0 <= position < len(gold):
            raise ValueError(f"position must be in [0, {len(gold)}), got {position!r}")
        if gold[position] not in DIGITS:
            return rng.choice(DIGITS)
        return str((int(gold[position]) + rng.choice((-1, 1))) % 10)
