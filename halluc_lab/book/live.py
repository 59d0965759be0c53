"""Live widgets for JupyterLab: a trained model's sampler, with the knobs of chapter 3.

The rendered book is static, so its explorers are precomputed grids
(:mod:`halluc_lab.book.interactive`). A reader who opens a chapter in JupyterLab has a kernel, and
can ask a trained model anything: type a prompt, move the temperature, top-k and top-p, and see the
next-token distribution that :func:`halluc_lab.generation.sampling.sample` would draw from, and a
continuation sampled under the same knobs by the engine.

:class:`LiveSampler` holds the computation (testable without a browser); :func:`live_sampler` puts
``ipywidgets`` controls on it. The widgets need a kernel: a chapter shows them only when it is run
live, not in a recorded run (:func:`halluc_lab.progress.in_batch`), whose widget state the static
book could not use.

Example (in JupyterLab)::

    trained = recipes.load("kb_walk-pretrain", rt)
    live_sampler(trained.model, trained.tokenizer,
                 [f"{a} {r}" for a, r in sorted(trained.task.facts)[:12]])
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.generation import sampling
from halluc_lab.generation.engine import generate
from halluc_lab.model.tokenizer import Tokenizer


@dataclass
class LiveSampler:
    """A model's next-token distribution after a prompt under temperature, top-k and top-p, and
    samples."""

    model: nn.Module  # the lab's decoder, in eval mode
    tokenizer: Tokenizer  # its vocabulary
    max_new_tokens: int = 16  # length of a sampled continuation
    shown: int = 10  # tokens listed in the distribution

    def __post_init__(self):
        for name in ("max_new_tokens", "shown"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    def _ids(self, prompt: str) -> list[int]:
        words = prompt.split()
        unknown = [w for w in words if w not in self.tokenizer.tokens]
        if unknown:
            raise ValueError(f"not in the model's vocabulary: {', '.join(unknown[:5])}"
                             f"{' …' if len(unknown) > 5 else ''}")
        return [self.tokenizer.bos_id, *self.tokenizer.encode(prompt)]

    @staticmethod
    def params(temperature: float, top_k: int = 0, top_p: float = 1.0) -> sampling.SamplingParams:
        """The sliders' setting; their "off" positions (k = 0, p = 1) are no filter."""
        return sampling.SamplingParams(temperature=temperature, top_k=top_k or None,
                                       top_p=None if top_p >= 1.0 else top_p)

    @torch.no_grad()
    def distribution(self, prompt: str, params: sampling.SamplingParams) -> list[tuple[str, float]]:
        """The ``shown`` likeliest next tokens, and their probabilities under ``params``."""
        device = next(self.model.parameters()).device
        # (V,)
        logits = self.model(torch.tensor([self._ids(prompt)], device=device))[0, -1].float().cpu()
        probs = sampling.softmax(sampling.filter_logits(logits, params.temperature, params.top_k,
                                                        params.top_p))  # (V,)
        raw = sampling.softmax(logits, params.temperature)  # (V,) the order before filtering
        order = torch.argsort(raw, descending=True, stable=True)[:self.shown]
        return [(self.tokenizer.tokens[i], float(probs[i])) for i in order.tolist()]

    def continuation(self, prompt: str, params: sampling.SamplingParams, *, seed: int = 0) -> str:
        """A continuation sampled under ``params`` by the engine, stopped after ``<eos>``."""
        device = next(self.model.parameters()).device
        out = generate(self.model, [self._ids(prompt)], self.max_new_tokens, sampling=params,
                       stop_tokens=(self.tokenizer.eos_id,),
                       generator=torch.Generator(device=device).manual_seed(seed))
        return self.tokenizer.decode(out.token_lists()[0])


def distribution_html(rows: Sequence[tuple[str, float]]) -> str:
    """The distribution as a small table of bars (HTML, no script)."""
    cells = "".join(
        f"<tr><td><code>{html.escape(t)}</code></td><td style='width:16em'><div "
        "style='background:#4c72b0;"
        f"height:0.9em;width:{100 * p:.1f}%'></div></td><td>{p:.3f}</td></tr>" for t, p in rows)
    return f"<table class='halluc-live-distribution'>{cells}</table>"


def live_sampler(model: nn.Module, tokenizer: Tokenizer, prompts: Sequence[str], *,
                 max_new_tokens: int = 16):
    """Widgets on a :class:`LiveSampler`: a prompt (one of ``prompts``, or typed), temperature,
    top-k and top-p sliders, the distribution (redrawn on every change) and a button that samples a
    continuation."""
    import ipywidgets as widgets

    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    live = LiveSampler(model.eval(), tokenizer, max_new_tokens=max_new_tokens)
    prompt = widgets.Combobox(value=prompts[0], options=list(prompts), description="prompt",
                              ensure_option=False)
    temperature = widgets.FloatSlider(value=1.0, min=0.1, max=3.0, step=0.1,
                                      description="temperature")
    top_k = widgets.IntSlider(value=0, min=0, max=min(50, tokenizer.vocab_size),
                              description="top-k (0: off)")
    top_p = widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05,
                                description="top-p (1: off)")
    button = widgets.Button(description="sample a continuation")
    shown, sampled = widgets.HTML(), widgets.HTML()
    draws = {"n": 0}  # each click draws anew; the same clicks give the same draws

    def knobs() -> tuple[str, sampling.SamplingParams]:
        return prompt.value, live.params(temperature.value, top_k.value, top_p.value)

    def redraw(_=None) -> None:
        try:
            shown.value = (f"<p>next token after <code>{html.escape(prompt.value)}</code>:</p>"
                           + distribution_html(live.distribution(*knobs())))
        except ValueError as err:  # an unknown word typed in the prompt
            shown.value = f"<p><b>{html.escape(str(err))}</b></p>"

    def draw(_=None) -> None:
        draws["n"] += 1
        try:
            text = live.continuation(*knobs(), seed=draws["n"])
            sampled.value = (f"<p class='halluc-live-sample'><code>{html.escape(prompt.value)}"
                             f"</code> → <code>{html.escape(text)}</code></p>")
        except ValueError as err:
            sampled.value = f"<p><b>{html.escape(str(err))}</b></p>"

    for w in (prompt, temperature, top_k, top_p):
        w.observe(redraw, names="value")
    button.on_click(draw)
    redraw()
    return widgets.VBox([prompt, temperature, top_k, top_p, shown, button, sampled])
