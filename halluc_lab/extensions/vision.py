"""A vision-language model in miniature: images enter the lab's decoder at the embedding stage,
nowhere else.

Chapter 12. Source: 001 Part 1 §5: an image becomes visual features v_1 … v_L (a vision encoder),
projected into the model's embedding space, h_j = W_proj v_j + b_proj, and placed beside the text
embeddings; "the modification is confined to the input embedding stage" — the blocks, RoPE over the
joint positions, the causal mask and the next-token loss are unchanged. Here:

* **Images** are grids of coloured cells (:class:`GridWorld`): ``rows × cols`` cells, each one of
  ``colors`` colours, drawn as RGB pixels with a little noise. The caption names each cell's colour
  in raster order (``red blue … .``). ``bias`` makes one colour usual in the first cell, so a model
  can learn what is usual there as well as what is there: with an image whose first cell is another
  colour, does the caption describe the image or the habit? That is hallucination in a second
  modality. ``distinct`` draws fixed held-out sets (none of them in a training set; ``first`` can
  break the habit) and :func:`cells_right` scores captions.
* **The vision module** (:class:`PatchEncoder`) turns each cell's pixels into a feature v_j (one
  patch per cell, a small MLP); :class:`VisionLanguageModel` projects them with ``W_proj`` and
  writes them over the embeddings of the first L positions of the sequence, by a forward hook on the
  decoder's embedding table. The decoder itself is the lab's
  :class:`~halluc_lab.model.transformer.Transformer`, unchanged.
* **How an image travels.** The lab's training loop moves token rows, so a row carries its image as
  L cell codes (ids ``vocab + colour``) in its first L positions. The model renders them to pixels
  (with noise drawn from a generator the caller seeds) before the encoder sees them. The codes are
  never embedded: their ids are clamped into the table and the rows it returns for them overwritten.
* **Generation** is the lab's text loop, :func:`halluc_lab.generation.decoding.decode`, unchanged:
  ``describe`` renders each image once and every decoding step reads those same pixels.

Departures: 001 names a ViT or CLIP-style encoder; a cell here is one patch and its encoder a small
MLP, enough to tell the palette's colours apart through the noise. 001's "next-token objective over
the joint sequence" has text targets only: an image position is followed by an image feature, not a
token, so the loss is over the caption.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, Batch, Encoded, pad
from halluc_lab.generation.decoding import decode
from halluc_lab.model.transformer import Transformer

Tensor = torch.Tensor
PALETTE = ((0.9, 0.1, 0.1), (0.1, 0.7, 0.2), (0.1, 0.2, 0.9), (0.9, 0.8, 0.1), (0.6, 0.2, 0.7),
           (0.1, 0.8, 0.8), (0.95, 0.5, 0.1), (0.5, 0.5, 0.5))
COLOR_NAMES = ("red", "green", "blue", "yellow", "purple", "cyan", "orange", "grey")
# the largest pixel noise a world allows: far past the point where no colour can be read
MAX_NOISE = 4.0


@dataclass(frozen=True)
class GridWorld:
    """Images of ``rows × cols`` coloured cells and their captions."""

    rows: int = 2
    cols: int = 2
    colors: int = 4  # how many of PALETTE's colours appear
    pixels: int = 3  # a cell is pixels × pixels RGB values
    # std of the Gaussian noise on every pixel value (palette values lie in [0, 1])
    noise: float = 0.05
    # probability that the first cell takes colour 0 (the rest: uniform over all colours)
    bias: float = 0.0

    def __post_init__(self):
        for name, low, high in (("rows", 1, 8), ("cols", 1, 8), ("colors", 2, len(PALETTE)),
                                ("pixels", 1, 8)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ValueError(f"{name} must be an int in [{low}, {high}], got {v!r}")
        if not (0.0 <= self.noise <= MAX_NOISE and 0.0 <= self.bias <= 1.0):
            raise ValueError(f"noise must be in [0, {MAX_NOISE}] and bias in [0, 1], got "
                             f"{self.noise!r} and "
                             f"{self.bias!r}")

    @property
    def cells(self) -> int:
        """L: cells per image, one visual feature each."""
        return self.rows * self.cols

    def symbols(self) -> tuple[str, ...]:
        """The caption vocabulary: the colour names and the full stop."""
        return COLOR_NAMES[:self.colors] + (".",)

    def draw(self, n: int, rng: random.Random,
             first: int | Sequence[int] | None = None) -> list[tuple[int, ...]]:
        """``n`` images as colour codes in raster order. ``first``: the first cell's colour (an
        int), or the colours it is drawn from uniformly (a sequence); None: the world's own rule
        (``bias``)."""
        heads = self._heads(first)
        out = []
        for _ in range(n):
            if heads is None:
                head = 0 if rng.random() < self.bias else rng.randrange(self.colors)
            else:
                head = heads[rng.randrange(len(heads))]
            out.append((head, *(rng.randrange(self.colors) for _ in range(self.cells - 1))))
        return out

    def _heads(self, first: int | Sequence[int] | None) -> tuple[int, ...] | None:
        """``first`` checked, as a tuple of colours (None stays None)."""
        if first is None:
            return None
        heads = (first,) if isinstance(first, int) else tuple(first)
        if not heads or any(isinstance(c, bool) or not isinstance(c, int)
                            or not 0 <= c < self.colors for c in heads):
            raise ValueError(f"first must be a colour in [0, {self.colors - 1}] or a non-empty "
                             "sequence of them, "
                             f"got {first!r}")
        return heads

    def distinct(self, n: int, seed: int, exclude: Iterable[tuple[int, ...]] = (),
                 first: int | Sequence[int] | None = None) -> list[tuple[int, ...]]:
        """``n`` distinct images, none of them in ``exclude`` (a training set): a held-out set,
        drawn in order from ``random.Random(seed)``. Raises if the world has too few such images to
        find them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        rng, seen, out = random.Random(seed), set(exclude), []
        for _ in range(100 * n):
            img = self.draw(1, rng, first)[0]
            if img not in seen:
                seen.add(img)
                out.append(img)
                if len(out) == n:
                    return out
        raise ValueError(f"found only {len(out)} distinct held-out images of the {n} asked "
                         "for: the world "
                         f"({self.colors} colours, {self.cells} cells) has too few outside exclude")

    def caption(self, codes: tuple[int, ...]) -> str:
        """The colours of the cells in raster order, then a full stop."""
        return " ".join([*(COLOR_NAMES[c] for c in codes), "."])

    def render(self, codes: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``(B, L)`` colour codes → ``(B, L, 3·pixels²)`` noisy RGB patches (one per cell)."""
        palette = torch.tensor(PALETTE[:self.colors], device=codes.device)  # (C, 3)
        # (B, L, 3·p²), a flat colour
        clean = palette[codes].repeat_interleave(self.pixels ** 2, dim=-1)
        if not self.noise:
            return clean
        noise = torch.randn(clean.shape, generator=generator,
                            device="cpu" if generator is None else generator.device)
        return clean + self.noise * noise.to(codes.device)

    def to_image(self, patches: Tensor) -> Tensor:
        """One image's patches ``(L, 3·pixels²)`` as an RGB picture
        ``(rows·pixels, cols·pixels, 3)`` in [0, 1] (for ``imshow``; values the noise pushed out of
        range are clipped for display only)."""
        p = self.pixels
        if patches.shape != (self.cells, 3 * p * p):
            raise ValueError(f"patches must have shape {(self.cells, 3 * p * p)}, got "
                             f"{tuple(patches.shape)}")
        # a patch is channel-major
        cells = patches.detach().float().cpu().view(self.rows, self.cols, 3, p, p)
        return cells.permute(0, 3, 1, 4, 2).reshape(self.rows * p, self.cols * p, 3).clamp(0, 1)


class PatchEncoder(nn.Module):
    """The vision module: each cell's pixels → a feature v_j ∈ R^{d_v} (a two-layer MLP per
    patch)."""

    def __init__(self, world: GridWorld, features: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3 * world.pixels ** 2, features), nn.GELU(),
                                 nn.Linear(features, features))

    def forward(self, patches: Tensor) -> Tensor:
        return self.net(patches)  # (B, L, d_v)


class VisionLanguageModel(nn.Module):
    """The lab's decoder with an image in front: rows of ``L`` cell codes (ids
    ``text_vocab + colour``) then text.

    ``forward(input_ids)`` renders the codes, encodes them, projects them (h_j = W_proj
    v_j + b_proj) and writes them over the first L embeddings; everything after the embedding table
    is the decoder's own computation. ``noise``: the generator of the rendering noise (None: torch's
    global one); ``seed`` draws the encoder's and the projection's initial weights.
    """

    def __init__(self, lm: Transformer, world: GridWorld, features: int = 32, *, seed: int = 0):
        super().__init__()
        if not isinstance(lm, Transformer):
            raise TypeError(f"lm must be the lab's Transformer, got {type(lm).__name__}")
        self.lm, self.world = lm, world
        self.text_vocab = lm.config.vocab_size
        # the new layers' initialisation follows seed, nothing else
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = PatchEncoder(world, features)
            self.proj = nn.Linear(features, lm.config.hidden_size)  # W_proj, b_proj
        self.noise: torch.Generator | None = None
        self._visual: Tensor | None = None
        lm.embed_tokens.register_forward_hook(self._place)

    def _place(self, module, args, out: Tensor) -> Tensor:
        if self._visual is None:
            return out
        L = self._visual.shape[1]
        # image positions first, then text
        return torch.cat([self._visual.to(out.dtype), out[:, L:]], dim=1)

    def image_ids(self, codes: Tensor) -> Tensor:
        """Colour codes ``(B, L)`` as the ids a row carries."""
        return codes + self.text_vocab

    def see(self, codes: Tensor, generator: torch.Generator | None = None,
            noise: float | None = None) -> Tensor:
        """The pixels of images ``(B, L)`` → ``(B, L, 3·pixels²)``, rendered with the world's noise
        or ``noise``."""
        world = self.world if noise is None else replace(self.world, noise=noise)
        return world.render(codes, generator)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                segment_ids: Tensor | None = None, *, pixels: Tensor | None = None) -> Tensor:
        """Logits ``(B, T, V)`` of rows ``(B, T)`` that open with L cell codes. ``pixels``
        ``(B, L, 3·pixels²)``: the images as seen (default: the codes rendered with the generator
        ``self.noise``)."""
        L = self.world.cells
        codes = input_ids[:, :L] - self.text_vocab
        if input_ids.shape[1] < L or bool((codes < 0).any() | (codes >= self.world.colors).any()):
            raise ValueError(f"every row must open with {L} image cell codes (ids "
                             f"{self.text_vocab}.."
                             f"{self.text_vocab + self.world.colors - 1}), then its text")
        pixels = self.see(codes, self.noise) if pixels is None else pixels
        if pixels.shape != (*codes.shape, self.encoder.net[0].in_features):
            raise ValueError("pixels must have shape "
                             f"{(*codes.shape, self.encoder.net[0].in_features)}, "
                             f"got {tuple(pixels.shape)}")
        weight = self.proj.weight
        # (B, L, d): W_proj v + b
        self._visual = self.proj(self.encoder(pixels.to(weight.device, weight.dtype)))
        try:  # the placeholder ids are clamped into the table; their embeddings are overwritten
            return self.lm(input_ids.clamp_max(self.text_vocab - 1), position_ids, segment_ids)
        finally:
            self._visual = None

    def caption_rows(self, images: list[tuple[int, ...]], tok) -> Batch:
        """Training rows: each image's L cell codes, then its caption and ``<eos>`` as targets (the
        image is context: its positions carry no loss). ``tok``: a tokenizer over
        ``world.symbols()``."""
        seqs = []
        for codes in images:
            text = [*tok.encode(self.world.caption(codes)), tok.eos_id]
            ids = (*self.image_ids(torch.tensor(codes)).tolist(), *text)
            seqs.append(Encoded(ids, (IGNORE,) * len(codes) + tuple(text)))
        return pad(seqs, tok.pad_id)

    @torch.no_grad()
    def describe(self, images: list[tuple[int, ...]], tok, *,
                 generator: torch.Generator | None = None, noise: float | None = None,
                 max_new_tokens: int | None = None) -> list[list[str]]:
        """Greedy captions of ``images``: the symbols the model writes after each image, up to
        ``<eos>``.

        Each image is rendered once (noise from ``generator``; ``noise`` overrides the world's
        level) and every step of the lab's decoding loop
        (:func:`~halluc_lab.generation.decoding.decode`) sees those pixels.
        """
        if not images:
            raise ValueError("images must not be empty")
        budget = self.world.cells + 2 if max_new_tokens is None else max_new_tokens
        device = next(self.parameters()).device
        codes = torch.tensor(images, device=device)  # (B, L)
        pixels = self.see(codes, generator, noise)  # (B, L, 3·p²), fixed for the whole caption
        ids = decode(lambda t: self(t, pixels=pixels)[:, -1], self.image_ids(codes), budget,
                     eos_token=tok.eos_id)
        rows = [row[:row.index(tok.eos_id)] if tok.eos_id in row else row
                for row in ids[:, self.world.cells:].tolist()]
        return [tok.decode(row).split() for row in rows]


def cells_right(images: Sequence[tuple[int, ...]],
                said: Sequence[Sequence[str]]) -> list[list[bool]]:
    """Per image, per cell: is the caption's word in the cell's place its colour? (A caption too
    short is wrong in the places it lacks; the whole caption is right when
    ``said == world.caption(codes).split()``.)

    >>> cells_right([(0, 1)], [["red", "blue", "."]]), cells_right([(0, 1)], [["red"]])
    ([[True, False]], [[True, False]])
    """
    if len(images) != len(said):
        raise ValueError(f"images and said must be as long, got {len(images)} and {len(said)}")
    return [[i < len(words) and words[i] == COLOR_NAMES[c] for i, c in enumerate(codes)]
            for codes, words in zip(images, said)]
