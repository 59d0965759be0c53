"""Named training recipes: every model of the book, trained on first use and cached after.

Chapters 7–8 define and train them; every later chapter gets its models only from here
(DESIGN.md §3). A recipe is a frozen config: the task's world, the model's shape, the
optimisation, the data (pre-training corpus or SFT examples, with or without backspace
demonstrations or scheduled sampling) and, for SFT, the recipe it starts from::

    import halluc_lab as hl
    from halluc_lab import recipes
    rt = hl.setup()
    kb = recipes.load("kb_walk-sft-clean", rt)   # trains kb_walk-pretrain, then this; or loads both
    kb.model, kb.tokenizer, kb.task, kb.history

Names are ``<task>-<stage>`` with task in :data:`TASKS` and stage in :data:`STAGES`; each
exists at both scales (``recipes.get(name, "smoke")``).

**Cache.** Checkpoints live in ``$HALLUC_CACHE/recipes/<name>/<key>/``; without
``$HALLUC_CACHE``, in ``$XDG_CACHE_HOME/halluc_lab`` or ``~/.cache/halluc_lab``. The key is a
hash of the whole recipe (its parent included), the autocast dtype, :data:`FORMAT_VERSION`
and :func:`code_fingerprint` — a hash of the code that shapes the trained weights (the
model, the loop, the loss, the data pipeline, the tasks) with comments, docstrings and
formatting left out. So a changed config or a changed line of that code trains afresh and
never loads another's weights; editing prose does not. Bump :data:`FORMAT_VERSION` for a
change the fingerprint cannot see (a new library version that computes differently). A directory is complete only once its ``DONE`` marker
is written; an interrupted run resumes from its last checkpoint; a file lock keeps two
processes from training the same recipe at once. The model directory holds a Hugging
Face checkpoint and tokenizer (``AutoModelForCausalLM``/``AutoTokenizer`` load it).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

from halluc_lab.model import ModelConfig, Transformer
from halluc_lab.data import Batch, batches, encode_document, encode_example, pack
from halluc_lab.sft import BackspaceConfig, backspace_demonstration, scheduled_sampling
from halluc_lab.tasks import (ArithmeticConfig, KBWalkConfig, PathStarConfig, Task, TaskConfig, make_task)
from halluc_lab.tokenizer import Tokenizer
from halluc_lab.train import History, TrainConfig, latest_checkpoint, train

FORMAT_VERSION = 1  # bump when code that determines trained weights changes
TASKS = ("kb_walk", "arithmetic", "path_star")
STAGES = ("pretrain", "sft-clean", "sft-backspace", "sft-scheduled")
SCALES = ("smoke", "full")
ENV_CACHE = "HALLUC_CACHE"


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a trained model."""

    name: str  # "<task>-<stage>", e.g. "kb_walk-sft-clean"
    scale: str  # "smoke" or "full"
    task: TaskConfig  # the task's world, splits and corpus
    model: ModelConfig  # the decoder's shape (an SFT recipe repeats its parent's)
    train: TrainConfig  # optimisation
    batch_size: int  # packed rows per optimizer step
    seq_len: int  # tokens per packed row
    parent: Recipe | None = None  # the recipe whose weights this one starts from (None: random init)
    n_examples: int = 0  # SFT: training examples drawn from the task's train split
    completion_only: bool = True  # SFT: loss on the completion only (000 §5.4)
    replay_fraction: float = 0.0  # SFT: pre-training documents mixed in, per SFT example
    backspace: BackspaceConfig | None = None  # SFT: inject errors + <bksp> + correction
    scheduled_sampling: float = 0.0  # SFT: final rate of scheduled sampling (ramped up linearly from 0)
    seed: int = 0  # model initialisation, data order and data draws

    @property
    def stage(self) -> str:
        """"pretrain" or the SFT variant."""
        return self.name.split("-", 1)[1]

    @property
    def pretraining(self) -> Recipe:
        """The pre-training recipe at the root of this one's parents (itself for a pre-training recipe)."""
        return self if self.parent is None else self.parent.pretraining


# -- the registry --------------------------------------------------------------------------------
def _task_config(task: str, scale: str) -> TaskConfig:
    full = scale == "full"
    if task == "kb_walk":
        return KBWalkConfig(n_entities=120 if full else 24, n_relations=6 if full else 4,
                            common_count=3400 if full else 600, facts_per_document=7, max_hops=4 if full else 3)
    if task == "arithmetic":
        return ArithmeticConfig(max_digits=3 if full else 2, reverse_output=False,
                                n_pretrain_documents=192_000 if full else 4000, equations_per_document=3)
    # 20 labels at full scale, not more: the edge look-up is learned abruptly, and later the more labels
    # there are (a 4 x 128 model fine-tuned on 30 labels had not learned it after 3,000 steps, on 20 it had
    # by step 1,000; book/results/training.md). Bachmann & Nagarajan train far longer on larger graphs.
    return PathStarConfig(degree=2, path_length=5 if full else 4, n_nodes=20 if full else 16,
                          n_pretrain_documents=192_000 if full else 6000)


def _sft_parent(task: str, stage: str) -> str:
    """The recipe an SFT recipe starts from: the task's pre-trained model, except path_star's backspace SFT.

    On path_star every injected error is a graph node, and the correction after ``y w <bksp>`` needs the
    child of the node three tokens back, while the simple rule "child of the last node written" points at
    ``w``'s child: from the pre-trained model these demonstrations keep the edge look-up from forming at
    all (full scale, 2,000 steps: greedy exact match 0.005 against clean SFT's 0.515; the same plateau in a
    4,000-step CPU run). Starting from the clean SFT model, which has the look-up, they only add ``<bksp>``.
    """
    return f"{task}-sft-clean" if (task, stage) == ("path_star", "sft-backspace") else f"{task}-pretrain"


def _sft_steps(task: str, stage: str, scale: str) -> int:
    """SFT optimizer steps: path_star's look-up needs the most (see :func:`_task_config`); its backspace
    SFT continues from the clean model and needs only a few hundred (see :func:`_sft_parent`)."""
    if scale == "full":
        if task == "path_star":
            return 500 if stage == "sft-backspace" else 2000
        return 400
    return 250 if task == "kb_walk" else 300


def _sft_examples(task: str, scale: str) -> int:
    """Train-split examples an SFT recipe draws: at full scale the 400- and 2,000-step recipes see each
    about three to five times (path_star's 500-step backspace recipe about once)."""
    if scale == "full":
        return {"kb_walk": 50_000, "arithmetic": 150_000, "path_star": 250_000}[task]
    return 3000


def _batch_size(scale: str) -> int:
    """Packed rows per step: large on a GPU, where a step costs about the same whatever its size."""
    return 128 if scale == "full" else 16


def _model_config(vocab_size: int, scale: str) -> ModelConfig:
    if scale == "full":
        return ModelConfig(vocab_size=vocab_size, hidden_size=256, n_layers=4, n_heads=8, n_kv_heads=4,
                           max_positions=256)
    return ModelConfig(vocab_size=vocab_size, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                       max_positions=128)


@lru_cache(maxsize=None)
def get(name: str, scale: str) -> Recipe:
    """The recipe called ``name`` at ``scale``: ``get("arithmetic-sft-backspace", "smoke")``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    task, _, stage = name.partition("-")
    if task not in TASKS or stage not in STAGES:
        raise ValueError(f"unknown recipe {name!r}; names are '<task>-<stage>' with task in {TASKS} "
                         f"and stage in {STAGES}")
    full = scale == "full"
    tcfg = _task_config(task, scale)
    mcfg = _model_config(make_task(tcfg).tokenizer().vocab_size, scale)
    seq_len = 128 if full else 64
    if stage == "pretrain":
        steps = _pretrain_steps(task, scale)
        return Recipe(name, scale, tcfg, mcfg, TrainConfig(steps=steps, lr=2e-3 if full else 5e-3,
                                                           warmup_steps=min(100, steps // 10), weight_decay=0.0,
                                                           log_every=50),
                      batch_size=_batch_size(scale), seq_len=seq_len, seed=0)
    parent = get(_sft_parent(task, stage), scale)
    steps = _sft_steps(task, stage, scale)
    return Recipe(name, scale, tcfg, mcfg,
                  TrainConfig(steps=steps, lr=1e-3 if full else 3e-3, warmup_steps=steps // 20, weight_decay=0.0,
                              log_every=50),
                  batch_size=_batch_size(scale), seq_len=seq_len, parent=parent,
                  n_examples=_sft_examples(task, scale), replay_fraction=0.5 if task == "kb_walk" else 0.0,
                  backspace=BackspaceConfig(rate=0.1) if stage == "sft-backspace" else None,
                  scheduled_sampling=0.25 if stage == "sft-scheduled" else 0.0, seed=1)


def _pretrain_steps(task: str, scale: str) -> int:
    """Pre-training is exactly one pass over the corpus (so a rare kb_walk fact is seen 1–3 times)."""
    full = scale == "full"
    rows = _pretrain_rows(_task_config(task, scale), 128 if full else 64, 0).input_ids.shape[0]
    return rows // _batch_size(scale)


NAMES = tuple(f"{t}-{s}" for t in TASKS for s in STAGES)


# -- data --------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _pretrain_rows(task_cfg: TaskConfig, seq_len: int, seed: int) -> Batch:
    task = make_task(task_cfg)
    tok = task.tokenizer()
    return pack([encode_document(tok, d) for d in task.pretraining_documents(seed)], seq_len, tok.pad_id)


def training_rows(recipe: Recipe) -> Batch:
    """The packed rows a recipe trains on (the whole set; :func:`halluc_lab.data.batches` draws from it)."""
    if recipe.parent is None:
        return _pretrain_rows(recipe.task, recipe.seq_len, recipe.seed)
    task = make_task(recipe.task)
    tok = task.tokenizer()
    rng = random.Random(recipe.seed)
    seqs = []
    for ex in task.examples("train", recipe.n_examples, seed=recipe.seed):
        if recipe.backspace is not None:
            seqs += backspace_demonstration(tok, task, ex, recipe.backspace, rng)
        else:
            seqs.append(encode_example(tok, ex, completion_only=recipe.completion_only))
    if recipe.replay_fraction > 0:
        docs = task.pretraining_documents(seed=recipe.pretraining.seed)
        seqs += [encode_document(tok, d) for d in rng.sample(docs, int(recipe.replay_fraction * recipe.n_examples))]
    rng.shuffle(seqs)
    return pack(seqs, recipe.seq_len, tok.pad_id)


# -- the cache --------------------------------------------------------------------------------
def cache_root() -> str:
    """``$HALLUC_CACHE``, else ``$XDG_CACHE_HOME/halluc_lab``, else ``~/.cache/halluc_lab``."""
    if os.environ.get(ENV_CACHE):
        return os.environ[ENV_CACHE]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "halluc_lab")


def _canonical(recipe: Recipe) -> dict:
    """The recipe as plain data, with the task config's type (asdict would drop it)."""
    d = dataclasses.asdict(recipe)
    d["task_type"] = type(recipe.task).__name__
    if recipe.parent is not None:
        d["parent"] = _canonical(recipe.parent)
    return d


# The modules whose code determines a recipe's trained weights.
WEIGHT_MODULES = ("model", "attention", "positional", "sampling", "train", "sft", "data", "losses", "tokenizer", "recipes",
                  "tasks.base", "tasks.kb_walk", "tasks.arithmetic", "tasks.path_star")


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the syntax trees of :data:`WEIGHT_MODULES` without docstrings (comments and
    layout are not in the tree): it changes when their code does, not when their prose does."""
    h = hashlib.sha256()
    for name in WEIGHT_MODULES:
        spec = importlib.util.find_spec(f"halluc_lab.{name}")
        with open(spec.origin, encoding="utf-8") as f:
            tree = _strip_docstrings(ast.parse(f.read()))
        h.update(name.encode() + b"\0" + ast.dump(tree).encode())
    return h.hexdigest()[:16]


def _identity(recipe: Recipe, dtype: torch.dtype) -> dict:
    """Everything the cache key covers, as plain data."""
    return {"format": FORMAT_VERSION, "code": code_fingerprint(), "dtype": str(dtype), "recipe": _canonical(recipe)}


def key(recipe: Recipe, dtype: torch.dtype = torch.float32) -> str:
    """The cache key: a hash of the recipe, the autocast dtype, :data:`FORMAT_VERSION` and the code."""
    blob = json.dumps(_identity(recipe, dtype), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def directory(recipe: Recipe, dtype: torch.dtype = torch.float32) -> str:
    """Where a recipe's checkpoint lives."""
    return os.path.join(cache_root(), "recipes", recipe.name, key(recipe, dtype))


@dataclass
class Trained:
    """A recipe's model, ready to use."""

    recipe: Recipe  # what was trained
    model: Transformer  # on the requested device, in eval mode
    tokenizer: Tokenizer  # the task's vocabulary
    task: Task  # the task (verifier, examples)
    history: History  # the training metrics
    path: str  # the cache directory (``path/model`` is the Hugging Face checkpoint)
    seconds: float  # training wall time, as recorded when it was trained
    trained_now: bool  # True if this call trained it (False: loaded from the cache)


@contextlib.contextmanager
def _lock(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): no lock, a concurrent run would just train twice
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load(name: str | Recipe, rt, *, verbose: bool = True) -> Trained:
    """The trained model of a recipe on ``rt.device`` (a :class:`~halluc_lab.device.Runtime`):
    loaded from the cache, or trained now (its parent first) and cached."""
    recipe = name if isinstance(name, Recipe) else get(name, rt.scale)
    return load_recipe(recipe, rt.device, rt.dtype, verbose=verbose)


def load_recipe(recipe: Recipe, device: torch.device | str, dtype: torch.dtype = torch.float32, *,
                verbose: bool = True) -> Trained:
    """:func:`load` with an explicit device and autocast dtype (bfloat16 on CUDA, else float32)."""
    device = torch.device(device)
    path = directory(recipe, dtype)
    if not _complete(path, recipe, dtype):
        with _lock(path + ".lock"):
            if not _complete(path, recipe, dtype):  # another process may have finished it meanwhile
                _train(recipe, path, device, dtype, verbose)
                return _read(path, recipe, device, trained_now=True)
    out = _read(path, recipe, device, trained_now=False)
    if verbose:
        print(f"{recipe.name} ({recipe.scale}): loaded from {path}")
    return out


def _complete(path: str, recipe: Recipe, dtype: torch.dtype) -> bool:
    if not os.path.exists(os.path.join(path, "DONE")):
        return False
    with open(os.path.join(path, "recipe.json")) as f:
        saved = json.load(f)
    now = json.loads(json.dumps(_identity(recipe, dtype), sort_keys=True, default=str))
    if saved != now:
        raise ValueError(f"{path} holds a checkpoint of a different recipe (same key, other config): "
                         "delete the directory or bump recipes.FORMAT_VERSION")
    return True


def _train(recipe: Recipe, path: str, device: torch.device, dtype: torch.dtype, verbose: bool) -> None:
    task = make_task(recipe.task)
    tok = task.tokenizer()
    if recipe.parent is not None:
        model = load_recipe(recipe.parent, device, dtype, verbose=verbose).model
        if model.config != recipe.model:
            raise ValueError(f"{recipe.name}: its model config differs from its parent's ({recipe.parent.name})")
    else:
        model = Transformer(recipe.model, seed=recipe.seed).to(device)
    rows = training_rows(recipe).to(device)
    prepare = None
    if recipe.scheduled_sampling > 0:
        def prepare(m, batch, step):
            g = torch.Generator(device=batch.input_ids.device).manual_seed(recipe.seed * 1_000_003 + step)
            return scheduled_sampling(m, batch, recipe.scheduled_sampling * step / recipe.train.steps, g)
    if verbose:
        where = "resuming" if latest_checkpoint(os.path.join(path, "checkpoints")) else "training"
        print(f"{recipe.name} ({recipe.scale}): {where} on {device.type}, {recipe.train.steps} steps "
              f"of {recipe.batch_size}×{recipe.seq_len} tokens")
    start = time.perf_counter()
    hist = train(model, batches(rows, recipe.batch_size, recipe.seed), recipe.train,
                 checkpoint_dir=os.path.join(path, "checkpoints"), resume=True, prepare=prepare,
                 autocast_dtype=dtype, desc=recipe.name)
    seconds = time.perf_counter() - start
    model.save_pretrained(os.path.join(path, "model"), bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
                          pad_token_id=tok.pad_id)
    tok.save(os.path.join(path, "model"))
    with open(os.path.join(path, "history.json"), "w") as f:
        json.dump(hist.to_dict(), f)
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"seconds": seconds, "device": str(device), "date": datetime.date.today().isoformat()}, f)
    with open(os.path.join(path, "recipe.json"), "w") as f:
        json.dump(_identity(recipe, dtype), f, sort_keys=True, default=str, indent=1)
    shutil.rmtree(os.path.join(path, "checkpoints"), ignore_errors=True)
    open(os.path.join(path, "DONE"), "w").close()
    if verbose:
        print(f"{recipe.name} ({recipe.scale}): trained in {seconds:.1f} s, final loss {hist.loss[-1]:.3f}")


def _read(path: str, recipe: Recipe, device: torch.device, trained_now: bool) -> Trained:
    model = Transformer.from_pretrained(os.path.join(path, "model"))
    if model.config != recipe.model:
        raise ValueError(f"{path}: the saved model's config differs from the recipe's")
    with open(os.path.join(path, "history.json")) as f:
        hist = History.from_dict(json.load(f))
    with open(os.path.join(path, "meta.json")) as f:
        seconds = json.load(f)["seconds"]
    task = make_task(recipe.task)
    tok = Tokenizer.load(os.path.join(path, "model"))
    if tok != task.tokenizer():
        raise ValueError(f"{path}: the saved tokenizer differs from the task's vocabulary")
    return Trained(recipe, model.to(device).eval(), tok, task, hist, path, seconds, trained_now)
