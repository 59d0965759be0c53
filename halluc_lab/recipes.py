"""Named training recipes: every model of the book, its stages, trained on first use and cached.

Chapters 7–8 define and train them; every later chapter gets its models only from here
(ARCHITECTURE.md §3). A recipe (:class:`Recipe`) is a frozen config: the task's world, the model's
shape, the optimisation, the stage and the recipe whose weights it starts from::

    import halluc_lab as hl
    from halluc_lab import recipes
    rt = hl.setup()
    kb = recipes.load("kb_walk-sft-clean", rt)   # trains kb_walk-pretrain, then this; or loads both
    kb.model, kb.tokenizer, kb.task, kb.history

**Stages** own how their data are assembled and what their training needs (the :class:`Stage`
interface of :mod:`halluc_lab.recipe`); each is defined beside its training and re-exported here:
:class:`Pretraining` and :class:`SFT` (:mod:`halluc_lab.sft`), :class:`DPO`, :class:`RSFT` and
:class:`OwnErrorsSFT` (:mod:`halluc_lab.preference`), :class:`PPO` (:mod:`halluc_lab.rlhf`), :class:`RLVR`
(:mod:`halluc_lab.rlvr`). Nothing chooses a stage by its name.

**Names** are ``<task>-<stage>`` with task in :data:`TASKS` and stage in :data:`STAGES`, each at both
scales (``recipes.get(name, "smoke")``). The registry is three tables (:data:`SCALE_PLANS`,
:data:`TASK_PLANS`, :data:`STAGE_PLANS`): a new stage is a row, not a branch. :func:`with_seed`
runs a whole chain under another seed.

**The cache** — keys derived from the code that can change each recipe's bits and the platform,
checksummed entries, resumable training, the lock — is :mod:`halluc_lab.recipe_cache`; its public names
are re-exported here. :func:`chains` trains and loads every named recipe under several seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import tempfile
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from halluc_lab.data import Batch
from halluc_lab.model import ModelConfig
from halluc_lab.preference import DPO, RSFT, OwnErrorsSFT
from halluc_lab.pretraining import Pretraining
from halluc_lab.recipe import SCALES, Recipe, Stage, with_seed
from halluc_lab.recipe_cache import (CacheError, CacheWarning, Platform, Trained, cache_root, code_fingerprint,
                                     code_hashes, code_modules, directory, key, load_recipe, used, used_code)
from halluc_lab.reward_model import AgreeableAnnotator
from halluc_lab.rlhf import PPO, PPOConfig, RewardModelPlan
from halluc_lab.rlvr import RLVR, RLVRConfig
from halluc_lab.sft import SFT, BackspaceConfig, RetrievedContext, ScheduledSampling
from halluc_lab.tasks import (ArithmeticConfig, DeadEndsConfig, InContextConfig, KBWalkConfig, PathStarConfig,
                              SycophancyConfig, TaskConfig, make_task)
from halluc_lab.train import TrainConfig

__all__ = ["Recipe", "with_seed", "Stage", "Pretraining", "SFT", "ScheduledSampling", "DPO", "RSFT", "PPO",
           "OwnErrorsSFT", "RLVR", "get", "NAMES", "TASKS", "STAGES", "SCALES", "training_rows", "load",
           "load_recipe", "chains", "Trained", "CacheWarning", "CacheError", "Platform", "key", "directory",
           "cache_root", "code_modules", "code_hashes", "code_fingerprint", "used", "used_code", "prefetch"]


# -- the registry ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalePlan:
    """What every recipe of one scale shares (a row of :data:`SCALE_PLANS`)."""

    model: ModelConfig  # the decoder's shape; get() replaces the placeholder vocab_size by the task's
    batch_size: int  # packed rows per step: large on a GPU, where a step costs about the same whatever its size
    seq_len: int  # tokens per packed row


@dataclass(frozen=True)
class TaskPlan:
    """One task's recipes at one scale (a row of :data:`TASK_PLANS`)."""

    world: TaskConfig  # the task's world, splits and corpus
    sft: SFT  # the task's clean SFT: examples drawn, pre-training replay
    steps: Mapping[str, int]  # optimizer steps per stage; a stage not listed makes one pass over its rows
    parents: Mapping[str, str] = field(default_factory=dict)  # stage -> the stage it starts from, if not the usual
    preference_prompts: int | None = None  # prompts the preference stages learn from (held-out, learning half)
    ppo: PPOConfig | None = None  # the PPO stages' rounds (their steps and rate come from the tables here)
    reward_model: RewardModelPlan | None = None  # how RLHF fits its reward model
    rlvr: RLVRConfig | None = None  # the RLVR stages' rounds (their steps and rate come from the tables here)


@dataclass(frozen=True)
class StagePlan:
    """What a stage name means for every task (a row of :data:`STAGE_PLANS`)."""

    stage: Callable[[TaskPlan], Stage]  # the stage, from the task's plan
    lr: Mapping[str, float]  # peak learning rate at each scale
    warmup_divisor: int  # warmup steps = min(100, steps // warmup_divisor)
    seed: int  # model initialisation, data order and data draws (SFT draws other numbers than pre-training)
    parent: str | None = None  # the stage it usually starts from (None: random weights)


SCALE_PLANS = {
    "smoke": ScalePlan(ModelConfig(vocab_size=1, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                   max_positions=128), batch_size=16, seq_len=64),
    "full": ScalePlan(ModelConfig(vocab_size=1, hidden_size=256, n_layers=4, n_heads=8, n_kv_heads=4,
                                  max_positions=256), batch_size=128, seq_len=128),
}


RLVR_LAMBDA = 3.0  # the RLVR stages' penalty of a wrong answer (chapter 10)


def _sft(**changes) -> StagePlan:
    """An SFT stage: the task's clean SFT with ``changes``, started from the task's pre-trained model."""
    return StagePlan(lambda plan: dataclasses.replace(plan.sft, **changes), lr={"smoke": 3e-3, "full": 1e-3},
                     warmup_divisor=20, seed=1, parent="pretrain")


def _preference(stage: Callable[[TaskPlan], Stage], lr: Mapping[str, float], seed: int) -> StagePlan:
    """A chapter-9 stage, started from the task's clean SFT model (its reference policy)."""
    return StagePlan(stage, lr=lr, warmup_divisor=10, seed=seed, parent="sft-clean")


STAGE_PLANS = {
    "pretrain": StagePlan(lambda plan: Pretraining(), lr={"smoke": 5e-3, "full": 2e-3}, warmup_divisor=10, seed=0),
    "sft-clean": _sft(),
    "sft-backspace": _sft(backspace=BackspaceConfig(rate=0.1)),  # 000 §7.3
    "sft-scheduled": _sft(scheduled_sampling=0.25),  # 002, "Scheduled Sampling"
    # Chapter 11 (001 Part 3 §3, RAG): a model fine-tuned to read retrieved context, half its prompts preceded by
    # 1–4 passages (each supporting fact kept with probability 1/2, the rest distractors). Matched compute with
    # sft-clean, the model never trained on x': the same examples, steps and rate, from the same pre-trained
    # model. kb_walk only (its facts are the passages): the other tasks' plans give it no steps.
    "sft-rag": _sft(retrieved=RetrievedContext()),
    # Its reader: the same, but in half the examples with passages one fact's passage names another entity and the
    # answer follows it, so reading, not recall, is what the loss rewards there (sft.RetrievedContext).
    "sft-rag-reader": _sft(retrieved=RetrievedContext(counterfactual=0.5)),
    # The matched-compute control of a backspace recipe that continues from clean SFT: clean SFT continued
    # for the same extra steps, so "more training" and "backspace demonstrations" can be told apart.
    "sft-continued": dataclasses.replace(_sft(), parent="sft-clean"),
    # Chapter 9: each learns from N = 8 own samples per prompt of the clean SFT model (the same samples drawn
    # by every method); DPO's annotator flips a tenth of its labels, as people disagree. Learning rates are a
    # tenth (RSFT, supervised like SFT) and a fiftieth (DPO, whose loss keeps pushing the rejected answer's
    # log-probability down, and with it everything the pair shares) of clean SFT's, as preference tuning
    # of larger models runs far below their SFT rate. The soft rule's β = 1 keeps a right answer e² ≈ 7.4
    # times as readily as a wrong one, per sample: a tilt, not a hard maximum.
    "dpo": _preference(lambda plan: DPO(plan.preference_prompts, samples=8, beta=0.1, flip_rate=0.1),
                       lr={"smoke": 6e-5, "full": 2e-5}, seed=2),
    "rsft": _preference(lambda plan: RSFT(plan.preference_prompts, samples=8), lr={"smoke": 3e-4, "full": 1e-4},
                        seed=2),
    "rsft-soft": _preference(lambda plan: RSFT(plan.preference_prompts, samples=8, beta=1.0),
                             lr={"smoke": 3e-4, "full": 1e-4}, seed=2),
    # PPO, β = 0.1, against the verifier (001 Part 2 §3: a reward that cannot be gamed) and against a reward
    # model fit to the same 8 samples per prompt that DPO ranks, a tenth of the labels flipped (RLHF).
    "ppo": _preference(lambda plan: PPO(plan.preference_prompts, plan.ppo), lr={"smoke": 3e-4, "full": 2e-5}, seed=2),
    "rlhf": _preference(lambda plan: PPO(plan.preference_prompts, plan.ppo, reward_model=plan.reward_model),
                        lr={"smoke": 3e-4, "full": 2e-5}, seed=2),
    # Chapter 12 (001 Part 4 §2): the same RLHF, its reward model fit to raters who like being agreed with — an
    # answer that repeats the user's stated number ranks 2.5 higher than the verifier alone would put it.
    "rlhf-agreeable": _preference(lambda plan: PPO(plan.preference_prompts, plan.ppo, reward_model=dataclasses.replace(
        plan.reward_model, annotator=AgreeableAnnotator(bonus=2.5))), lr={"smoke": 3e-4, "full": 2e-5}, seed=2),
    # Chapter 10: RLVR with GRPO's loss on the verifier's reward with abstention, λ = 3 (answering pays when
    # P(correct) > 3/4), from clean SFT with <bksp> masked (the baseline without take-backs) and from backspace
    # SFT with <bksp> allowed, in the context chapter 8 trained it in ("keep"). Same rounds, rollouts and rate.
    "rlvr": StagePlan(lambda plan: RLVR(plan.preference_prompts, dataclasses.replace(plan.rlvr, allow_bksp=False),
                                        lam=RLVR_LAMBDA), lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3,
                      parent="sft-clean"),
    "rlvr-bksp": StagePlan(lambda plan: RLVR(plan.preference_prompts, plan.rlvr, lam=RLVR_LAMBDA),
                           lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3, parent="sft-backspace"),
    # The arm that isolates the key: RLVR from backspace SFT (the same start as rlvr-bksp) with <bksp> masked
    # during RL, so "RLVR + bksp" against it differs only in whether the token may be used, not in the start.
    "rlvr-bksp-masked": StagePlan(lambda plan: RLVR(plan.preference_prompts, dataclasses.replace(
        plan.rlvr, allow_bksp=False), lam=RLVR_LAMBDA), lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3,
        parent="sft-backspace"),
    # The third starting point: backspace demonstrations from the clean SFT model's own errors (2 answers per
    # prompt at τ = 1, cut at the first wrong symbol), at a third of clean SFT's rate; then RLVR from it.
    "sft-own-errors": StagePlan(lambda plan: OwnErrorsSFT(plan.preference_prompts, samples=2),
                                lr={"smoke": 1e-3, "full": 3e-4}, warmup_divisor=10, seed=3, parent="sft-clean"),
    "rlvr-own": StagePlan(lambda plan: RLVR(plan.preference_prompts, plan.rlvr, lam=RLVR_LAMBDA),
                          lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3, parent="sft-own-errors"),
    # Its control: the same prompts, samples and gold answers without the take-back (a correction carries the
    # verifier's gold answer, information RLVR's scalar reward never gives), then RLVR with <bksp> masked.
    "sft-corrections": StagePlan(lambda plan: OwnErrorsSFT(plan.preference_prompts, samples=2, take_back=False),
                                 lr={"smoke": 1e-3, "full": 3e-4}, warmup_divisor=10, seed=3, parent="sft-clean"),
    "rlvr-corrections": StagePlan(lambda plan: RLVR(plan.preference_prompts, dataclasses.replace(plan.rlvr,
                                                                                            allow_bksp=False),
                                                    lam=RLVR_LAMBDA),
                                  lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3,
                                  parent="sft-corrections"),
}
# Chapter 10: chapter 9's RSFT and DPO from the two backspace starting points (random errors, the model's own
# errors), with the same samples, steps and rates. Their samples may hold <bksp>, which stays in the context (as
# those models were trained) and which the verifier applies before it judges: a kept or preferred sample teaches
# its take-backs. And from the own-errors arm's control (the same gold answers, no take-back), which separates
# what the take-back does from what the corrections' information does.
_SUFFIX_PARENTS = (("bksp", "sft-backspace"), ("own", "sft-own-errors"), ("corrections", "sft-corrections"))
for _suffix, _parent in _SUFFIX_PARENTS:
    for _method in ("rsft", "dpo"):
        STAGE_PLANS[f"{_method}-{_suffix}"] = dataclasses.replace(STAGE_PLANS[_method], parent=_parent)
STAGES = tuple(STAGE_PLANS)
_SFT_STAGES = ("sft-clean", "sft-backspace", "sft-scheduled")
# Chapter 9's stages on kb_walk and arithmetic, about three passes over their rows: DPO's pairs (one per prompt
# whose 8 samples do not all tie) and RSFT's kept samples, packed (about ten to a row).
_PREFERENCE_STEPS = {"smoke": {"dpo": 40, "rsft": 9, "rsft-soft": 9, "ppo": 8, "rlvr": 16, "rlvr-bksp": 16,
                               "rlvr-bksp-masked": 16,
                               "sft-own-errors": 24, "rlvr-own": 16, "sft-corrections": 24, "rlvr-corrections": 16},
                     "full": {"dpo": 60, "rsft": 8, "rsft-soft": 8, "ppo": 48, "rlvr": 100, "rlvr-bksp": 100,
                              "rlvr-bksp-masked": 100,
                              "sft-own-errors": 40, "rlvr-own": 100, "sft-corrections": 40, "rlvr-corrections": 100}}
for _steps in _PREFERENCE_STEPS.values():  # chapter 10's RSFT and DPO (_SUFFIX_PARENTS): chapter 9's steps
    _steps |= {f"{method}-{suffix}": _steps[method] for method in ("rsft", "dpo") for suffix, _ in _SUFFIX_PARENTS}
# PPO's rounds: 64 prompts × 8 rollouts at full scale, 2 epochs of 2 minibatches each (rounds: the steps above).
_PPO = {"smoke": PPOConfig(prompts_per_iteration=16, samples_per_prompt=8, kl_coef=0.1, value_lr=3e-4),
        "full": PPOConfig(prompts_per_iteration=64, samples_per_prompt=8, kl_coef=0.1, value_lr=1e-4)}
# RLVR's rounds: 64 prompts × G = 8 rollouts at full scale, one GRPO step per round (on-policy).
_RLVR = {"smoke": RLVRConfig(prompts_per_iteration=16, samples_per_prompt=8),
         "full": RLVRConfig(prompts_per_iteration=64, samples_per_prompt=8)}
_REWARD_MODEL = {"smoke": RewardModelPlan(steps=60, lr=1e-3, batch_size=16), "full": RewardModelPlan()}
_PREFERENCE = {scale: dict(preference_prompts=n, ppo=_PPO[scale], reward_model=_REWARD_MODEL[scale], rlvr=_RLVR[scale])
               for scale, n in (("smoke", 256), ("full", 3072))}

# Pre-training is exactly one pass over the corpus (no "pretrain" in steps), so a rare kb_walk fact is seen
# 1–3 times. SFT examples drawn: at full scale the 400- and 2,000-step recipes see each about three to five
# times (path_star's 500-step backspace recipe about once).
TASK_PLANS = {
    ("kb_walk", "smoke"): TaskPlan(
        KBWalkConfig(n_entities=24, n_relations=4, common_count=600, facts_per_document=7, max_hops=3),
        SFT(n_examples=3000, replay_fraction=0.5),
        {**dict.fromkeys(_SFT_STAGES, 250), "sft-rag": 250, "sft-rag-reader": 250, **_PREFERENCE_STEPS["smoke"],
         "rlhf": _PREFERENCE_STEPS["smoke"]["ppo"]},
        **_PREFERENCE["smoke"]),
    ("kb_walk", "full"): TaskPlan(
        KBWalkConfig(n_entities=120, n_relations=6, common_count=3400, facts_per_document=7, max_hops=4),
        SFT(n_examples=50_000, replay_fraction=0.5),
        {**dict.fromkeys(_SFT_STAGES, 400), "sft-rag": 400, "sft-rag-reader": 400, **_PREFERENCE_STEPS["full"],
         "rlhf": _PREFERENCE_STEPS["full"]["ppo"]},
        **_PREFERENCE["full"]),
    ("arithmetic", "smoke"): TaskPlan(
        ArithmeticConfig(max_digits=2, reverse_output=False, n_pretrain_documents=4000, equations_per_document=3),
        SFT(n_examples=3000), {**dict.fromkeys(_SFT_STAGES, 300), **_PREFERENCE_STEPS["smoke"]}, **_PREFERENCE["smoke"]),
    ("arithmetic", "full"): TaskPlan(
        ArithmeticConfig(max_digits=3, reverse_output=False, n_pretrain_documents=192_000, equations_per_document=3),
        SFT(n_examples=150_000), {**dict.fromkeys(_SFT_STAGES, 400), **_PREFERENCE_STEPS["full"]},
        **_PREFERENCE["full"]),
    # 20 labels at full scale, not more: the edge look-up is learned abruptly, and later the more labels there
    # are (a 4 x 128 model fine-tuned on 30 labels had not learned it after 3,000 steps, on 20 it had by step
    # 1,000; book/results/training.md). Bachmann & Nagarajan train far longer on larger graphs. Hence the most
    # SFT steps; backspace SFT continues from the clean model and needs only a few hundred.
    #
    # It continues from clean SFT because every injected error is a graph node, and the correction after
    # ``y w <bksp>`` needs the child of the node three tokens back, while the simple rule "child of the last
    # node written" points at ``w``'s child: from the pre-trained model these demonstrations keep the edge
    # look-up from forming at all (full scale, 2,000 steps: greedy exact match 0.005 against clean SFT's 0.515;
    # the same plateau in a 4,000-step CPU run). From clean SFT, which has the look-up, they only add <bksp>.
    ("path_star", "smoke"): TaskPlan(
        PathStarConfig(degree=2, path_length=4, n_nodes=16, n_pretrain_documents=6000),
        SFT(n_examples=3000), {**dict.fromkeys(_SFT_STAGES, 300), "sft-continued": 300},
        parents={"sft-backspace": "sft-clean"}),
    ("path_star", "full"): TaskPlan(
        PathStarConfig(degree=2, path_length=5, n_nodes=20, n_pretrain_documents=192_000),
        SFT(n_examples=250_000), {**dict.fromkeys(_SFT_STAGES, 2000), "sft-backspace": 500, "sft-continued": 500},
        parents={"sft-backspace": "sft-clean"}),
}
# Chapter 12. In-context learning: a fresh rule x -> x + c (mod 10) in every prompt, 0-4 demonstrations; clean SFT
# on such prompts. Chain of thought: arithmetic's world, model, SFT examples and steps with a written scratchpad (the
# direct arm is arithmetic-sft-clean); its pre-training documents hold two equations where arithmetic's hold three, as
# a scratchpad is three to four times longer. Sycophancy: arithmetic's world with half the prompts (and half the
# pre-training equations) opened by the user's stated sum, half of those wrong; clean SFT, RLHF with a reward model
# fit to the verifier's ranking or to raters who like agreement, and RLVR.
# A rule inferred from the context is a composition (read a demonstration, subtract, add to the query): its SFT
# runs 2,000 steps at full scale, as path_star's does for its look-up. At smoke scale the 2 × 64 model does not learn
# it in 300 steps either, so the smoke recipes of these three chains are kept small: they prove the code path, and
# chapter 12's smoke run (which trains them) stays within its 90 s. At full scale CoT and sycophancy take arithmetic's
# corpus size, SFT examples and steps, so the direct arm (arithmetic-sft-clean) is matched.
for _scale, _icl, _icl_steps, _cot_documents, _sft_steps in (
        ("smoke", InContextConfig(max_shots=4, n_pretrain_documents=3000, prompts_per_document=2), 150, 2000, 150),
        ("full", InContextConfig(max_shots=4, n_pretrain_documents=150_000), 2000, None, None)):
    _plan = TASK_PLANS["arithmetic", _scale]
    _sft_steps = _sft_steps or _plan.steps["sft-clean"]
    TASK_PLANS["in_context", _scale] = TaskPlan(_icl, SFT(n_examples=_plan.sft.n_examples),
                                                {"sft-clean": _icl_steps})
    TASK_PLANS["arithmetic_cot", _scale] = TaskPlan(
        dataclasses.replace(_plan.world, scratchpad=True, equations_per_document=2,
                            n_pretrain_documents=_cot_documents or _plan.world.n_pretrain_documents),
        _plan.sft, {"sft-clean": _sft_steps})
    TASK_PLANS["sycophancy", _scale] = dataclasses.replace(
        _plan, world=SycophancyConfig(_plan.world, p_stated=0.5, p_wrong=0.5),
        steps={"sft-clean": _sft_steps, "rlhf-agreeable": _PREFERENCE_STEPS[_scale]["ppo"],
               "rlhf": _PREFERENCE_STEPS[_scale]["ppo"], "rlvr": _PREFERENCE_STEPS[_scale]["rlvr"]})
# Chapter 10's fair test (tasks.dead_ends): path-star graphs whose wrong first step meets a dead end k tokens
# later (k = 1, 2, 4), or never (the control that behaves like kb_walk, answers as long as k = 2's). Each k has
# a clean corpus and a retry corpus (half its documents walk a wrong arm to its leaf, <bksp> back to the centre,
# then the gold path; Ye et al. 2024), token-matched, so the arms differ only in the retry data. Pre-training
# steps are given, the same for both corpora of a k (token-matched corpora pack into different row counts), and
# sized by a one-seed pilot of the clean models' teacher-forced look-up (book/results/rlvr.md).
_DEAD_ENDS = {"smoke": dict(n_nodes=16, pretrain_tokens=200_000), "full": dict(n_nodes=20, pretrain_tokens=16_000_000)}
_DEAD_ENDS_STEPS = {"smoke": 300, "full": 6000}
for _scale in SCALES:
    for _k, _world in (("k1", dict(reveal=1)), ("k2", dict(reveal=2)), ("k4", dict(reveal=4)),
                       ("never", dict(reveal=None, steps=3))):
        for _suffix, _retry in (("", 0.0), ("_retry", 0.5)):
            if _world["reveal"] is None and _retry:
                continue  # no dead end is ever written: nothing to take back
            TASK_PLANS[f"dead_ends_{_k}{_suffix}", _scale] = TaskPlan(
                DeadEndsConfig(degree=2, retry_fraction=_retry, **_world, **_DEAD_ENDS[_scale]),
                SFT(n_examples=3000 if _scale == "smoke" else 50_000), {"pretrain": _DEAD_ENDS_STEPS[_scale]})
TASKS = tuple(dict.fromkeys(task for task, _ in TASK_PLANS))
# A stage exists for a task when the task's plan gives it steps (pre-training: one pass, always).
_PARTS = {f"{task}-{stage}": (task, stage) for task in TASKS for stage in STAGES
          if stage == "pretrain" or stage in TASK_PLANS[task, "full"].steps}
NAMES = tuple(_PARTS)


@lru_cache(maxsize=None)
def get(name: str, scale: str) -> Recipe:
    """The recipe called ``name`` at ``scale``: ``get("arithmetic-sft-backspace", "smoke")``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if name not in _PARTS:
        raise ValueError(f"unknown recipe {name!r}; names are '<task>-<stage>' with task in {TASKS} "
                         f"and stage in {STAGES}")
    task, stage = _PARTS[name]
    plan, how, shape = TASK_PLANS[task, scale], STAGE_PLANS[stage], SCALE_PLANS[scale]
    parent = plan.parents.get(stage, how.parent)
    model = dataclasses.replace(shape.model, vocab_size=make_task(plan.world).tokenizer().vocab_size)
    draft = Recipe(name, scale, plan.world, model, TrainConfig(steps=1, warmup_steps=0), shape.batch_size,
                   shape.seq_len, how.stage(plan), None if parent is None else get(f"{task}-{parent}", scale),
                   how.seed)
    steps = plan.steps.get(stage) or _one_pass(draft)
    return dataclasses.replace(draft, train=TrainConfig(
        steps=steps, lr=how.lr[scale], warmup_steps=min(100, steps // how.warmup_divisor), weight_decay=0.0,
        log_every=50, checkpoint_every=max(1, min(200, steps // 4))))  # a killed run loses a quarter at most


def _one_pass(recipe: Recipe) -> int:
    """Optimizer steps of one pass over the recipe's rows.

    Counting them means generating and packing the whole corpus (seconds at smoke scale, about ten per task at
    full scale), so the count is kept in the cache beside the models, under the recipe's key: the key covers the
    recipe and the code that builds its rows, so a changed corpus is counted again. The file records the key and
    a checksum of the count; a file that does not match (edited, garbled, another key's) is reported and the rows
    counted again, so it can never decide how long a recipe trains.
    """
    k = key(recipe)
    path = os.path.join(cache_root(), "steps", recipe.name, f"{k}.json")
    if os.path.exists(path):
        steps = _read_count(path, k)
        if steps is not None:
            return steps
    rows = training_rows(recipe).input_ids.shape[0]
    steps = rows // recipe.batch_size
    if steps < 1:
        raise ValueError(f"{recipe.name}: its {rows} rows make no whole batch of {recipe.batch_size}: "
                         "make the corpus bigger or the batch smaller")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp", delete=False) as f:
            json.dump({"key": k, "steps": steps, "check": _count_check(k, steps)}, f)
        os.replace(f.name, path)  # whole or not at all: another process may read it now
    except OSError:
        pass  # a read-only cache still counts, only every time
    return steps


def _count_check(k: str, steps: int) -> str:
    return hashlib.sha256(f"{k}:{steps}".encode()).hexdigest()[:16]


def _read_count(path: str, k: str) -> int | None:
    """The count a step file holds if it is whole and checks out, else None (reported with its path)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        steps = data["steps"]
        if (data["key"] == k and isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
                and data["check"] == _count_check(k, steps)):
            return steps
        fault = "its count does not match its key and checksum"
    except (OSError, ValueError, KeyError, TypeError) as e:
        fault = f"it is not a step count ({type(e).__name__}: {e})"
    warnings.warn(f"{path}: {fault}; counting the rows again", CacheWarning, stacklevel=3)
    return None


def training_rows(recipe: Recipe) -> Batch:
    """The packed rows a recipe trains on (the whole set; :func:`halluc_lab.data.batches` draws from it)."""
    return recipe.stage.rows(recipe)


def load(name: str | Recipe, rt, *, verbose: bool = False) -> Trained:
    """The trained model of a recipe on ``rt.device`` (a :class:`~halluc_lab.device.Runtime`): loaded
    from the cache, or trained now (its parent first) and cached. A name is the registry's recipe at
    ``rt.scale`` under the run's seed (``with_seed(get(name, rt.scale), rt.seed)``); a :class:`Recipe` is
    taken as it is. ``verbose``: one line per recipe."""
    recipe = name if isinstance(name, Recipe) else with_seed(get(name, rt.scale), rt.seed)
    return load_recipe(recipe, rt.device, rt.dtype, verbose=verbose)


def chains(names: Sequence[str] | Mapping[Hashable, str], seeds: Sequence[int], rt) -> dict[tuple, Trained]:
    """Every named recipe under every seed, each seed covering its whole chain, trained at once where the
    device allows (:func:`prefetch`) and loaded: ``{(label, seed): Trained}``. ``names``: recipe names (each
    its own label), or ``{label: name}``, e.g. ``{"SFT": "kb_walk-sft-clean", "RLVR": "kb_walk-rlvr"}``.

    A chapter that compares arms over seeds starts with this line instead of building the chains itself."""
    labelled = dict(names) if isinstance(names, Mapping) else {n: n for n in names}
    if isinstance(names, str) or not labelled:
        raise ValueError(f"names must be a non-empty sequence of recipe names or a mapping label -> name, "
                         f"got {names!r}")
    if isinstance(seeds, (str, bytes)) or not list(seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints >= 0, got {seeds!r}")
    todo = {(label, s): with_seed(get(name, rt.scale), s) for label, name in labelled.items() for s in seeds}
    prefetch(list(todo.values()), rt.device, rt.dtype)
    return {k: load_recipe(r, rt.device, rt.dtype) for k, r in todo.items()}


# -- several chains at once ----------------------------------------------------------------------------
def _train_chains(groups: list[list[Recipe]], device: str, dtype: torch.dtype, gpu: int | None = None,
                  threads: int | None = None) -> None:
    """Worker: load (train if needed) each chain's recipes in order, deterministic kernels on; ``gpu``: the
    index of the GPU that ``"cuda"`` means in this process; ``threads``: the CPU threads of the process that
    asked (they are in a CPU recipe's key, so the worker trains the model that process would)."""
    from halluc_lab.device import set_deterministic

    if gpu is not None:
        torch.cuda.set_device(gpu)
    if threads is not None:
        torch.set_num_threads(threads)
    set_deterministic(True)
    for chain in groups:
        for recipe in chain:
            load_recipe(recipe, device, dtype)


def prefetch(recipes: Sequence[Recipe], device: torch.device | str, dtype: torch.dtype = torch.float32, *,
             processes: int | None = None) -> None:
    """Make sure every recipe is trained and cached, training independent chains at once.

    Recipes that share a pre-training root (one seed's chain) train one after another in one process,
    parents first; chains of different roots (other seeds, other tasks) train in parallel processes.
    A training step of the lab's models is launch-bound on a GPU, so several processes keep it busy
    where one cannot (the speed-up is on the results page). ``processes``: how many at once (default:
    one per chain on CUDA, 1 elsewhere, where the work runs in this process). On a machine with several
    GPUs and ``device`` "cuda" (no index), the processes take the GPUs in turn: one seed's chain per GPU.
    Afterwards :func:`load` reads every recipe from the cache.
    """
    device = torch.device(device)
    by_root: dict[Recipe, list[Recipe]] = {}
    for r in recipes:
        by_root.setdefault(r.pretraining, []).append(r)
    groups = list(by_root.values())
    n = processes if processes is not None else (len(groups) if device.type == "cuda" else 1)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if n == 1:
        _train_chains(groups, str(device), dtype)
        return
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    gpus = torch.cuda.device_count() if device.type == "cuda" and device.index is None else 0
    threads = torch.get_num_threads() if device.type == "cpu" else None
    with ctx.Pool(min(n, len(groups))) as pool:
        pool.starmap(_train_chains, [(groups[i::n], str(device), dtype, i % gpus if gpus > 1 else None, threads)
                                     for i in range(min(n, len(groups)))])
