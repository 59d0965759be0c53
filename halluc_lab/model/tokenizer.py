"""Word-level vocabularies for the synthetic tasks, exported as Hugging Face tokenizers.

Chapters 7–8. 001 Part 1 §1 describes BPE vocabularies of 50k–100k sub-word tokens; the
lab's tasks are written in a closed set of symbols (digits, invented words, node labels),
so each task gets a small *word-level* vocabulary instead: text is a space-separated
sequence of symbols and every symbol is one token. That sidesteps the BPE artefacts of
001 Part 1 footnote 5 (a number split into uneven pieces) on purpose.

Every vocabulary starts with the same five special tokens, in this order::

    <pad>=0  <bos>=1  <eos>=2  <bksp>=3  <abstain>=4

``<bksp>`` erases the previous completion token (the backtracking thread of the book,
000 §7.3); ``<abstain>`` is the knowledge-base walk's "I do not know" answer.

A :class:`Tokenizer` encodes and decodes on its own (plain Python, no dependencies) and
exports itself as a ``PreTrainedTokenizerFast`` built with the ``tokenizers`` library from
the vocabulary, so a checkpoint directory also loads with ``AutoTokenizer``. Nothing is
downloaded.

Departures: an unknown symbol raises ``ValueError`` (a real tokenizer would map it to an
``<unk>`` token; here it is always a bug in the caller). The vocabulary has no ``<unk>`` (adding
one would change every model's vocabulary size), and mapping unknown symbols to an existing
special token would hide the bug, so the export raises too: :meth:`Tokenizer.to_hf` names the
unknown symbols in a ``ValueError``. A tokenizer loaded back with ``AutoTokenizer`` is the plain
``PreTrainedTokenizerFast``, which cannot carry that check: it raises the ``tokenizers`` library's
own ``WordLevel error: Missing [UNK] token``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from numbers import Integral

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<bksp>", "<abstain>")
PAD, BOS, EOS, BKSP, ABSTAIN = SPECIAL_TOKENS
_VOCAB_FILE = "halluc_vocab.json"  # our own copy of the symbol list, beside the HF files


class Tokenizer:
    """A fixed word-level vocabulary: the special tokens, then the task's symbols.

    >>> tok = Tokenizer(["1", "2", "+", "="])
    >>> tok.encode("1 + 2 =")
    [5, 7, 6, 8]
    >>> tok.decode([1, 5, 7, 6, 2])
    '<bos> 1 + 2 <eos>'
    """

    def __init__(self, symbols: Iterable[str]):
        symbols = tuple(symbols)
        for s in symbols:
            if not isinstance(s, str) or not s or any(c.isspace() for c in s):
                raise ValueError(f"symbols must be non-empty strings without whitespace, got {s!r}")
        tokens = SPECIAL_TOKENS + symbols
        if len(set(tokens)) != len(tokens):
            dupes = sorted({t for t in tokens if tokens.count(t) > 1})
            raise ValueError("symbols must be unique and must not repeat a special token; "
                             f"repeated: {dupes}")
        self.tokens: tuple[str, ...] = tokens
        self._ids = {t: i for i, t in enumerate(tokens)}

    # -- ids of the special tokens -------------------------------------------------
    pad_id = property(lambda self: 0, doc="id of ``<pad>``")
    bos_id = property(lambda self: 1, doc="id of ``<bos>``")
    eos_id = property(lambda self: 2, doc="id of ``<eos>``")
    bksp_id = property(lambda self: 3, doc="id of ``<bksp>`` (erase the previous token)")
    abstain_id = property(lambda self: 4, doc="id of ``<abstain>`` (I do not know)")

    @property
    def vocab_size(self) -> int:
        """Number of tokens, special tokens included."""
        return len(self.tokens)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The task's symbols (the vocabulary without the special tokens)."""
        return self.tokens[len(SPECIAL_TOKENS):]

    def token_id(self, symbol: str) -> int:
        """The id of one symbol; ``ValueError`` if it is not in the vocabulary."""
        try:
            return self._ids[symbol]
        except KeyError:
            raise ValueError(f"unknown symbol {symbol!r}: not in this vocabulary of "
                             f"{self.vocab_size} tokens "
                             f"(first ones: {list(self.tokens[:12])})") from None

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Ids of a space-separated string (or a list of symbols); no tokens are added."""
        if isinstance(text, str):
            return [self.token_id(p) for p in text.split()]
        if not isinstance(text, Iterable) or isinstance(text, (bytes, Mapping)):
            kind = type(text).__name__
            raise TypeError(f"text must be a str or a sequence of symbol strings, got {kind}")
        parts = list(text)
        if bad := [p for p in parts if not isinstance(p, str)]:
            raise TypeError(f"text must be a str or a sequence of symbol strings; it holds "
                            f"{type(bad[0]).__name__} {bad[0]!r}")
        return [self.token_id(p) for p in parts]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The space-separated symbols of ``ids`` (``skip_special`` drops the special tokens)."""
        # locals: an RL round decodes thousands of answers
        out, tokens, n = [], self.tokens, len(self.tokens)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"ids must be a sequence of int token ids, got {type(ids).__name__}")
        for i in ids:
            if type(i) is not int:  # int(2.7) is 2, int(True) 1: a float or bool id is a bug
                i = _token_id(i)
            if not 0 <= i < n:
                raise ValueError(f"token id {i} out of range [0, {n})")
            if skip_special and i < len(SPECIAL_TOKENS):
                continue
            out.append(tokens[i])
        return " ".join(out)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and other.tokens == self.tokens

    def __hash__(self) -> int:
        return hash(self.tokens)

    def __repr__(self) -> str:
        return f"Tokenizer({self.vocab_size} tokens: {' '.join(self.tokens[:10])} ...)"

    # -- Hugging Face export ---------------------------------------------------------
    def to_hf(self):
        """This vocabulary as a ``PreTrainedTokenizerFast``.

        It splits on whitespace, maps each word to its id, and adds ``<bos>`` in front of
        every encoded text (as :func:`halluc_lab.stages.sft` does for prompts), so
        ``hf_tok("1 + 2 =").input_ids == [bos_id] + tok.encode("1 + 2 =")``.
        """
        return self._hf(_strict_hf_class())

    def _hf(self, hf_class: type):
        """The export as an instance of ``hf_class`` (a ``PreTrainedTokenizerFast``)."""
        from tokenizers import Tokenizer as RawTokenizer
        from tokenizers import decoders, models, pre_tokenizers, processors

        raw = RawTokenizer(models.WordLevel(dict(self._ids)))  # no unk token: unknown words raise
        raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        raw.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, self.bos_id)])
        raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
        raw.add_special_tokens(list(SPECIAL_TOKENS))
        return hf_class(
            tokenizer_object=raw, pad_token=PAD, bos_token=BOS, eos_token=EOS,
            additional_special_tokens=[BKSP, ABSTAIN], model_max_length=1 << 20)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the HF tokenizer files (``AutoTokenizer`` loads them) and our symbol list."""
        os.makedirs(directory, exist_ok=True)
        from transformers import PreTrainedTokenizerFast

        # the class AutoTokenizer knows
        self._hf(PreTrainedTokenizerFast).save_pretrained(directory)
        with open(os.path.join(directory, _VOCAB_FILE), "w") as f:
            json.dump({"tokens": list(self.tokens)}, f, indent=0)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`."""
        path = os.path.join(directory, _VOCAB_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no {_VOCAB_FILE} in {directory}: not a Halluc Lab "
                                    "tokenizer directory")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err}); "
                             "expected {\"tokens\": [...]}") from None
        if not isinstance(data, dict) or "tokens" not in data:
            got = (f"keys {sorted(data)}" if isinstance(data, dict)
                   else f"a JSON {type(data).__name__}")
            raise ValueError(f"{path}: expected a JSON object with a 'tokens' key, got {got}")
        tokens = data["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{path}: 'tokens' must be a list of strings, got {str(tokens)[:80]}")
        if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"{path}: the vocabulary must start with {SPECIAL_TOKENS}, got "
                             f"{tokens[:5]}")
        try:
            return cls(tokens[len(SPECIAL_TOKENS):])
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def _token_id(i: object) -> int:
    """``i`` as an int: a Python or numpy integer, or a 0-d integer tensor; TypeError otherwise."""
    floating = getattr(getattr(i, "dtype", None), "is_floating_point", True)
    if getattr(i, "ndim", 1) == 0 and not floating:
        i = i.item()  # a 0-d integer torch tensor, as iterating a tensor of ids gives
    if isinstance(i, bool) or not isinstance(i, Integral):
        raise TypeError(f"ids must be int token ids, got {type(i).__name__} {i!r}")
    return int(i)


@cache
def _strict_hf_class() -> type:
    """``PreTrainedTokenizerFast`` that names unknown symbols in a ``ValueError`` (built on first
    use, so that importing this module needs no ``transformers``)."""
    from transformers import PreTrainedTokenizerFast

    class StrictTokenizerFast(PreTrainedTokenizerFast):
        # Every encoding path of transformers 5 (__call__, encode, tokenize) runs _encode_plus.
        def _encode_plus(self, text, text_pair=None, *args, **kwargs):
            try:
                return super()._encode_plus(text, text_pair, *args, **kwargs)
            except Exception as err:
                if "Missing [UNK] token" not in str(err):
                    raise
                vocab = self.get_vocab()
                unknown = sorted({w for t in _strings((text, text_pair))
                                  for w in t.split()} - vocab.keys())
                raise ValueError(f"unknown symbol(s) {unknown}: not in this vocabulary of "
                                 f"{len(vocab)} tokens "
                                 "(the export has no <unk> token; "
                                 "see halluc_lab.model.tokenizer)") from None

    return StrictTokenizerFast


def _strings(x) -> Iterable[str]:
    """Every string inside nested lists and tuples (the shapes of a tokenizer's text arguments)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _strings(y)
