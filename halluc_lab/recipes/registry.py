"""The book's recipes as data: three tables of frozen plans — scales, tasks, stages — from which
:func:`halluc_lab.recipes.get` builds every named recipe.

Names are ``<task>-<stage>``: a stage exists for a task when the task's plan gives it steps
(pre-training always). A new stage is a row of :data:`STAGE_PLANS`, a new world a row of
:data:`TASK_PLANS`: no branch of code changes. The comments beside each row say why its numbers are
what they are; :mod:`halluc_lab.recipes` turns a name into a :class:`~halluc_lab.training.recipe.Recipe`,
loads it and trains several seeds at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from halluc_lab.model.transformer import ModelConfig
from halluc_lab.stages.preference import DPO, RSFT, OwnErrorsSFT
from halluc_lab.stages.pretraining import Pretraining
from halluc_lab.training.recipe import SCALES, Stage
from halluc_lab.stages.reward_model import AgreeableAnnotator
from halluc_lab.stages.rlhf import PPO, PPOConfig, RewardModelPlan
from halluc_lab.stages.rlvr import RLVR, RLVRConfig
from halluc_lab.stages.sft import SFT, BackspaceConfig, RetrievedContext
from halluc_lab.tasks import (ArithmeticConfig, DeadEndsConfig, InContextConfig, KBWalkConfig, PathStarConfig,
                              SycophancyConfig, TaskConfig)

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
    lr: Mapping[str, float] = field(default_factory=dict)  # stage -> peak rate, if not the stage's


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


def _rlvr(allow_bksp: bool, parent: str) -> StagePlan:
    """Chapter 10's RLVR (GRPO, λ = 3, the task's rounds) with ``<bksp>`` allowed or masked."""
    return StagePlan(lambda plan: RLVR(plan.preference_prompts, dataclasses.replace(
        plan.rlvr, allow_bksp=allow_bksp), lam=RLVR_LAMBDA), lr={"smoke": 3e-4, "full": 2e-5},
        warmup_divisor=10, seed=3, parent=parent)


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
    # The own-errors arm with each take-back also as its clean example (OwnErrorsSFT.direct): the gold token
    # is a direct target as in the control, so against sft-corrections it differs by the take-backs alone.
    "sft-own-errors-direct": StagePlan(
        lambda plan: OwnErrorsSFT(plan.preference_prompts, samples=2, direct=True),
        lr={"smoke": 1e-3, "full": 3e-4}, warmup_divisor=10, seed=3, parent="sft-clean"),
    "rlvr-own-direct": StagePlan(lambda plan: RLVR(plan.preference_prompts, plan.rlvr, lam=RLVR_LAMBDA),
                                 lr={"smoke": 3e-4, "full": 2e-5}, warmup_divisor=10, seed=3,
                                 parent="sft-own-errors-direct"),
    # Chapter 10's fair test (tasks.dead_ends; the table of its worlds below says which has which):
    # SFT on retry demonstrations (a wrong arm to its dead end, <bksp> back, the gold path) in half
    # the examples, the share of the retry corpora; RLVR from it with <bksp> allowed and masked, and
    # from clean SFT with it allowed, in the context the retry data keeps.
    "sft-retry": _sft(retry=0.5),
    "rlvr-retry": _rlvr(allow_bksp=True, parent="sft-retry"),
    "rlvr-retry-masked": _rlvr(allow_bksp=False, parent="sft-retry"),
    "rlvr-clean-bksp": _rlvr(allow_bksp=True, parent="sft-clean"),
    "rlvr-clean-masked": _rlvr(allow_bksp=False, parent="sft-clean"),  # RLVR without the key
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
                               "sft-own-errors": 24, "rlvr-own": 16, "sft-corrections": 24, "rlvr-corrections": 16,
                               "sft-own-errors-direct": 24, "rlvr-own-direct": 16},
                     "full": {"dpo": 60, "rsft": 8, "rsft-soft": 8, "ppo": 48, "rlvr": 100, "rlvr-bksp": 100,
                              "rlvr-bksp-masked": 100,
                              "sft-own-errors": 40, "rlvr-own": 100, "sft-corrections": 40, "rlvr-corrections": 100,
                              "sft-own-errors-direct": 40, "rlvr-own-direct": 100}}
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
# Chapter 10's fair test (tasks.dead_ends): path-star graphs, degree 2, whose answer walks the
# goal's arm of L = 5 nodes (four hops back from the goal find the first step) and whose wrong arms
# meet a dead end k tokens after their first node (k = 1, 2, 4), or never (every arm one node longer
# than the answer: the control that behaves like kb_walk). Sizes from a one-seed pilot on an H200
# (book/results/rlvr.md): with 14 labels, 2,500 steps of 128 × 128 tokens and a pre-training rate of
# 1e-3, every clean world's teacher-forced look-up was 1.000 (at 2e-3 the never world's was 0.285,
# at 4e-3 none formed; with 20 labels k = 4's and never's did not form either; 1,000 steps of 512
# rows left k = 4's at 0.765). A first sizing with arms of k + 1 nodes had the first step solved
# from the goal at k = 1, 2. Where <bksp> enters (the fair test's §3), each k has
#   (a) the retry corpus in pre-training (half its documents walk a wrong arm to its leaf, <bksp>
#       back to the centre, then the gold path; Ye et al. 2024), then SFT on the same mix of
#       retry demonstrations: dead_ends_k*_retry-sft-retry;
#   (b) the clean, token-matched corpus, then that SFT (retry only in fine-tuning):
#       dead_ends_k*-sft-retry;
#   (c) the clean corpus, then clean SFT (none): dead_ends_k*-sft-clean;
# so (a) − (b) changes the pre-training corpus alone and (b) − (c) the SFT data alone, at equal
# steps. RLVR (chapter 10's GRPO, +1 / 0 / −λ with <abstain>) from each with <bksp> allowed
# (rlvr-retry from (a) and (b), rlvr-clean-bksp from (c)), and from (a) with <bksp> masked during
# RL (rlvr-retry-masked): the same start. SFT's 300 steps and RLVR's 100 rounds (chapter 10's)
# were not in the pilot. RLVR's answer budget (evaluate.answer_budget: 2 × 6 + 4 = 16) holds k = 4's
# whole detour and answer (16 symbols) but not its <eos>; the verifier reads such an answer as
# written. At smoke scale each recipe trains in seconds.
_DEAD_ENDS = {"smoke": dict(n_nodes=14, pretrain_tokens=50_000),
              "full": dict(n_nodes=14, pretrain_tokens=16_000_000)}
_DEAD_ENDS_STEPS = {"smoke": {"pretrain": 40, "sft": 10, "rlvr": 4},
                    "full": {"pretrain": 2500, "sft": 300, "rlvr": 100}}
_DEAD_ENDS_RLVR = {"smoke": RLVRConfig(prompts_per_iteration=8, samples_per_prompt=4),
                   "full": RLVRConfig(prompts_per_iteration=64, samples_per_prompt=8)}
for _scale in SCALES:
    _n = _DEAD_ENDS_STEPS[_scale]
    _clean = {"sft-clean": _n["sft"], "rlvr-clean-bksp": _n["rlvr"], "rlvr-clean-masked": _n["rlvr"]}
    _retry_sft = {"sft-retry": _n["sft"], "rlvr-retry": _n["rlvr"]}
    for _k, _reveal in (("k1", 1), ("k2", 2), ("k4", 4), ("never", None)):
        for _suffix, _retry, _stages in (
                ("", 0.0, _clean | (_retry_sft if _reveal else {})),
                ("_retry", 0.5, _retry_sft | {"rlvr-retry-masked": _n["rlvr"]})):
            if _reveal is None and _retry:
                continue  # no dead end is ever written: nothing to take back
            TASK_PLANS[f"dead_ends_{_k}{_suffix}", _scale] = TaskPlan(
                DeadEndsConfig(degree=2, reveal=_reveal, length=5, retry_fraction=_retry,
                               **_DEAD_ENDS[_scale]),
                SFT(n_examples=500 if _scale == "smoke" else 50_000),
                {"pretrain": _n["pretrain"], **_stages},
                preference_prompts=64 if _scale == "smoke" else 3072, rlvr=_DEAD_ENDS_RLVR[_scale],
                lr={"pretrain": 1e-3} if _scale == "full" else {})
TASKS = tuple(dict.fromkeys(task for task, _ in TASK_PLANS))
# A stage exists for a task when the task's plan gives it steps (pre-training: one pass, always).
_PARTS = {f"{task}-{stage}": (task, stage) for task in TASKS for stage in STAGES
          if stage == "pretrain" or stage in TASK_PLANS[task, "full"].steps}
NAMES = tuple(_PARTS)
