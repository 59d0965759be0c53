"""The miniature vision-language model: the image enters at the embedding stage, the decoder is unchanged."""

import random

import pytest
import torch

from halluc_lab.data import batches
from halluc_lab.model import ModelConfig, Transformer
from halluc_lab.tokenizer import Tokenizer
from halluc_lab.train import TrainConfig, train
from halluc_lab.vision import GridWorld, VisionLanguageModel

WORLD = GridWorld(rows=2, cols=2, colors=4, noise=0.05)
TOK = Tokenizer(WORLD.symbols())


def vlm(seed: int = 0) -> VisionLanguageModel:
    lm = Transformer(ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, n_layers=2, n_heads=4), seed=seed)
    return VisionLanguageModel(lm, WORLD, features=16, seed=seed)


def test_the_image_reaches_the_text_only_through_the_first_embeddings():
    model = vlm().eval()
    a, b = WORLD.draw(2, random.Random(0), first=0), WORLD.draw(2, random.Random(0), first=1)
    ra, rb = model.caption_rows(a, TOK), model.caption_rows(b, TOK)
    model.noise = torch.Generator().manual_seed(0)
    la = model(ra.input_ids)
    model.noise = torch.Generator().manual_seed(0)
    lb = model(rb.input_ids)
    assert (la - lb).abs().max() > 1e-4  # another first cell: other logits downstream
    # What the decoder's blocks receive: W_proj v_j + b_proj at the L image positions, the text's own embeddings
    # after them. Nothing else of the decoder sees the image.
    seen = {}
    handle = model.lm.embed_tokens.register_forward_hook(lambda m, args, out: seen.setdefault("h", out))
    model.noise = torch.Generator().manual_seed(0)
    model(ra.input_ids)
    handle.remove()
    L = WORLD.cells
    codes = ra.input_ids[:, :L] - model.text_vocab
    visual = model.proj(model.encoder(WORLD.render(codes, torch.Generator().manual_seed(0))))
    torch.testing.assert_close(seen["h"][:, :L], visual)
    torch.testing.assert_close(seen["h"][:, L:], model.lm.embed_tokens.weight[ra.input_ids[:, L:]])


def test_the_caption_loss_trains_encoder_projection_and_decoder_to_describe_the_image():
    model = vlm()
    images = WORLD.draw(256, random.Random(1))
    rows = model.caption_rows(images, TOK)
    model.noise = torch.Generator().manual_seed(2)
    train(model, batches(rows, 32, seed=0), TrainConfig(steps=150, lr=1e-2, warmup_steps=10, weight_decay=0.0))
    seen = set(images)
    test = [c for c in WORLD.draw(400, random.Random(99)) if c not in seen][:48]  # images it never saw
    model.eval()
    said = model.describe(test, TOK)
    cells = [s == WORLD.caption(c).split()[i] for c, row in zip(test, said) for i, s in enumerate(row[:WORLD.cells])]
    assert len(test) == 48 and sum(cells) / (len(test) * WORLD.cells) > 0.9  # chance is 0.25 a cell


def test_rows_must_open_with_image_codes_and_the_world_is_checked():
    model = vlm()
    same, other = vlm(), vlm(seed=1)
    assert torch.equal(same.proj.weight, model.proj.weight) and not torch.equal(other.proj.weight, model.proj.weight)
    with pytest.raises(ValueError, match="image cell codes"):
        model(torch.tensor([[1, 2, 3, 4, 5]]))
    with pytest.raises(ValueError, match="image cell codes"):
        model(torch.tensor([[10, 11]]))  # fewer codes than cells
    for bad in (dict(rows=0), dict(colors=9), dict(noise=-0.1), dict(bias=2.0)):
        with pytest.raises(ValueError):
            GridWorld(**bad)
    with pytest.raises(TypeError):
        VisionLanguageModel(torch.nn.Linear(2, 2), WORLD)


def test_images_captions_and_the_bias_of_the_first_cell():
    world = GridWorld(colors=3, bias=0.9)
    imgs = world.draw(500, random.Random(0))
    assert 0.85 < sum(c[0] == 0 for c in imgs) / 500 < 0.97 and all(len(c) == world.cells for c in imgs)
    assert world.caption((0, 1, 2, 0)) == "red green blue red ."
    codes = torch.tensor([[0, 1, 2, 0]])
    a = world.render(codes, torch.Generator().manual_seed(0))
    assert a.shape == (1, 4, 27) and torch.equal(a, world.render(codes, torch.Generator().manual_seed(0)))
