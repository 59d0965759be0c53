"""Word-level tokenizer: round trips, special tokens, unknown symbols, the Hugging Face export."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.model.tokenizer import SPECIAL_TOKENS, Tokenizer

SYMBOLS = ["0", "1", "2", "+", "=", "zorvak", "kel_of"]


def test_special_tokens_come_first_in_a_fixed_order():
    tok = Tokenizer(SYMBOLS)
    assert tok.tokens[:5] == SPECIAL_TOKENS == ("<pad>", "<bos>", "<eos>", "<bksp>", "<abstain>")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.bksp_id, tok.abstain_id) == (0, 1, 2, 3, 4)
    assert tok.vocab_size == 5 + len(SYMBOLS) and tok.symbols == tuple(SYMBOLS)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(SYMBOLS + list(SPECIAL_TOKENS)), max_size=20))
def test_decode_inverts_encode(words):
    tok = Tokenizer(SYMBOLS)
    assert tok.decode(tok.encode(" ".join(words))) == " ".join(words)
    assert tok.encode(words) == tok.encode(" ".join(words))


def test_decode_can_skip_special_tokens():
    tok = Tokenizer(SYMBOLS)
    assert tok.decode(tok.encode("<bos> 1 + 2 <eos> <pad>"), skip_special=True) == "1 + 2"


def test_unknown_symbol_raises_a_clear_error():
    tok = Tokenizer(SYMBOLS)
    with pytest.raises(ValueError, match="unknown symbol '7'"):
        tok.encode("1 + 7")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("symbols", [["a", "a"], ["<eos>"], ["a b"], [""]])
def test_bad_vocabularies_are_rejected(symbols):
    with pytest.raises(ValueError):
        Tokenizer(symbols)


def test_hf_export_matches_our_ids_and_adds_bos():
    tok = Tokenizer(SYMBOLS)
    hf = tok.to_hf()
    text = "zorvak kel_of 1 <bksp> 2 <abstain>"
    assert hf(text).input_ids == [tok.bos_id] + tok.encode(text)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
    assert hf.decode(tok.encode(text)) == text
    with pytest.raises(Exception, match="UNK|unk"):
        hf("1 + 7")


def test_saved_tokenizer_loads_with_autotokenizer_and_with_load(tmp_path):
    from transformers import AutoTokenizer

    tok = Tokenizer(SYMBOLS)
    tok.save(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert auto("1 + 2 =").input_ids == [1] + tok.encode("1 + 2 =")
    assert len(auto) == tok.vocab_size
    assert Tokenizer.load(tmp_path) == tok


def test_load_rejects_a_directory_without_our_vocabulary(tmp_path):
    with pytest.raises(FileNotFoundError, match="halluc_vocab.json"):
        Tokenizer.load(tmp_path)


def test_hf_export_names_unknown_symbols_instead_of_the_raw_word_level_error():
    hf = Tokenizer(SYMBOLS).to_hf()
    for encode in (hf, hf.encode, hf.tokenize, lambda t: hf([t, "1 +"]), lambda t: hf("1", t)):
        with pytest.raises(ValueError, match=r"unknown symbol\(s\) \['7', 'x'\]") as err:
            encode("1 + 7 x")
        assert "WordLevel" not in str(err.value)


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (json.dumps({"symbols": []}), "with a 'tokens' key, got keys \\['symbols'\\]"),
    (json.dumps(["<pad>"]), "with a 'tokens' key, got a JSON list"),
    (json.dumps({"tokens": "<pad> <bos>"}), "'tokens' must be a list of strings"),
    (json.dumps({"tokens": ["<pad>", 1]}), "'tokens' must be a list of strings"),
    (json.dumps({"tokens": ["a", "b"]}), "must start with"),
    (json.dumps({"tokens": [*SPECIAL_TOKENS, "a", "a"]}), "unique"),
])
def test_load_of_a_corrupt_vocabulary_file_names_the_file_and_the_problem(tmp_path, content, match):
    path = tmp_path / "halluc_vocab.json"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        Tokenizer.load(tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("ids", [[2.7], [2.0], [True], [None], ["5"], "56", None, 5])
def test_decode_refuses_ids_that_are_not_integers(ids):
    with pytest.raises(TypeError, match="ids must be"):
        Tokenizer(SYMBOLS).decode(ids)


def test_decode_accepts_numpy_and_tensor_integer_ids():
    import numpy as np
    import torch

    tok = Tokenizer(SYMBOLS)
    want = tok.decode([1, 5, 6])
    assert tok.decode(np.array([1, 5, 6])) == tok.decode(torch.tensor([1, 5, 6])) == want
    assert tok.decode([np.int64(1), np.int32(5), 6]) == want


@pytest.mark.parametrize("text", [None, 5, b"1 + 2", [5], ["1", None], {"1": 2}])
def test_encode_refuses_what_is_not_text_or_symbols_by_name(text):
    with pytest.raises(TypeError, match="text must be a str or a sequence of symbol strings"):
        Tokenizer(SYMBOLS).encode(text)
