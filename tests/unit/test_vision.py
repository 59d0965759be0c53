"""The miniature vision-language model: the image enters at the embedding stage, the decoder is unchanged."""

import random

import pytest
import torch

from halluc_lab.training.data import batches
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.model.tokenizer import Tokenizer
from halluc_lab.training.train import TrainConfig, train
from halluc_lab.extensions.vision import MAX_NOISE, PALETTE, GridWorld, VisionLanguageModel, cells_right

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
    for bad in ({"rows": 0}, {"colors": 9}, {"noise": -0.1}, {"noise": MAX_NOISE + 0.1}, {"bias": 2.0}):
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


def test_held_out_images_are_distinct_outside_the_training_set_and_break_the_habit_when_asked():
    world = GridWorld(rows=2, cols=2, colors=3, bias=0.9)
    train_set = world.draw(40, random.Random(0))
    held = world.distinct(30, seed=1, exclude=train_set, first=(1, 2))
    assert len(set(held)) == 30 and not set(held) & set(train_set) and all(c[0] in (1, 2) for c in held)
    assert held == world.distinct(30, seed=1, exclude=train_set, first=(1, 2))  # a fixed set for a seed
    assert all(c[0] == 2 for c in world.draw(20, random.Random(0), first=2))
    with pytest.raises(ValueError, match="distinct held-out"):
        GridWorld(rows=1, cols=1, colors=2).distinct(3, seed=0)  # the world has two images
    for bad in (3, (), (0, 5), True):
        with pytest.raises(ValueError, match="first"):
            world.draw(1, random.Random(0), first=bad)


def test_a_caption_sees_one_rendering_of_its_image_at_every_step():
    model = vlm().eval()
    images = WORLD.draw(5, random.Random(3))
    said = model.describe(images, TOK, generator=torch.Generator().manual_seed(4), noise=0.5)
    assert said == model.describe(images, TOK, generator=torch.Generator().manual_seed(4), noise=0.5)
    # The same captions by hand: render once, then greedy steps that all read those pixels.
    codes = torch.tensor(images)
    pixels = GridWorld(rows=2, cols=2, colors=4, noise=0.5).render(codes, torch.Generator().manual_seed(4))
    ids = model.image_ids(codes)
    with torch.no_grad():
        for _ in range(WORLD.cells + 2):
            ids = torch.cat([ids, model(ids, pixels=pixels)[:, -1].argmax(-1, keepdim=True)], 1)
    by_hand = [TOK.decode(row[:row.index(TOK.eos_id)] if TOK.eos_id in row else row).split()
               for row in ids[:, WORLD.cells:].tolist()]
    assert said == by_hand
    with pytest.raises(ValueError, match="pixels"):
        model(ids, pixels=pixels[:, :2])


def test_the_model_runs_in_float64_and_the_text_decoder_without_an_image_is_the_text_model():
    model = vlm().eval()
    text_model = Transformer(model.lm.config)
    text_model.load_state_dict(model.lm.state_dict())
    text = model.caption_rows(WORLD.draw(3, random.Random(5)), TOK).input_ids[:, WORLD.cells:]  # captions alone
    assert torch.equal(model.lm(text), text_model(text))  # the hook is idle without an image: same logits
    ours = {k.removeprefix("lm."): v.shape for k, v in model.state_dict().items() if k.startswith("lm.")}
    assert ours == {k: v.shape for k, v in text_model.state_dict().items()}
    model64 = model.to(torch.float64)
    rows = model64.caption_rows(WORLD.draw(2, random.Random(6)), TOK)
    model64.noise = torch.Generator().manual_seed(0)
    assert model64(rows.input_ids).dtype == torch.float64


def test_patches_become_a_picture_cell_by_cell():
    world = GridWorld(rows=2, cols=3, colors=4, pixels=2, noise=0.0)
    codes = torch.tensor([[0, 1, 2, 3, 0, 1]])
    picture = world.to_image(world.render(codes)[0])
    assert picture.shape == (4, 6, 3)
    for k, c in enumerate(codes[0].tolist()):
        r, col = divmod(k, 3)
        cell = picture[2 * r:2 * r + 2, 2 * col:2 * col + 2]  # (2, 2, 3)
        assert torch.allclose(cell, torch.tensor(PALETTE[c]).expand(2, 2, 3))
    with pytest.raises(ValueError, match="patches"):
        world.to_image(torch.zeros(5, 12))


def test_cells_right_compares_place_by_place():
    assert cells_right([(0, 1, 2)], [["red", "green", "blue", "."]]) == [[True, True, True]]
    assert cells_right([(0, 1, 2)], [["green", "red", "blue", "."]]) == [[False, False, True]]
    assert cells_right([(0, 1, 2)], [["red"]]) == [[True, False, False]]
    with pytest.raises(ValueError, match="as long"):
        cells_right([(0, 1)], [])
