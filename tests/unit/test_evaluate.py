"""Evaluation: free-running completion against teacher forcing."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.evaluate import complete, teacher_forced
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, Example, KBWalk, KBWalkConfig, completion_symbols
from tests.unit._tiny_lm import small_transformer

TASK = Arithmetic(ArithmeticConfig(max_digits=3))
TOK = TASK.tokenizer()


def test_greedy_completion_is_what_teacher_forcing_predicts():
    model = small_transformer(TOK.vocab_size, seed=2)
    prompts = [e.prompt for e in TASK.examples("train", 6, seed=2)]
    outs = complete(model, TOK, prompts, 5)
    for p, o in zip(prompts, outs):
        words = o.split()
        body = words[:-1] if words[-1] == "<eos>" else words
        tf = teacher_forced(model, TOK, [Example(p, " ".join(body))])
        n = len(words)  # the generated tokens, <eos> included when it was generated
        assert all(tf.correct[0][:n])
        assert all(lp <= 0 for lp in tf.logprobs[0])

