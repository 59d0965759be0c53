"""What tests/unit/test_distributed.py runs under ``torchrun`` (and, as the reference, in one process).

    python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_worker.py MODE OUT_DIR

Modes: ``train`` (the plain loop, accumulation and checkpoints), ``crash`` (the same run killed at step 6:
rank 0 exits hard, as a killed process would), ``resume`` (the run picked up from its last checkpoint),
``rlvr`` (one short RLVR run per policy loss). Rank 0 writes ``OUT_DIR/MODE.json`` (losses and the like) and
``OUT_DIR/MODE-*.safetensors`` (final weights).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file

from halluc_lab.stages import rlvr
from halluc_lab.training import distributed
from halluc_lab.training.data import Batch, batches
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.reward_model import VerifierReward
from halluc_lab.tasks import make_task
from halluc_lab.tasks.arithmetic import ArithmeticConfig
from halluc_lab.training.train import TrainConfig, train

STEPS, CRASH_AT = 8, 6  # the killed run dies in step 6, after its checkpoint at step 4


def _data() -> tuple[int, callable]:
    """A fixed set of 48 random rows of 12 tokens, drawn 12 rows a step (split into 2 micro-batches)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (48, 12), generator=g)
    return 16, batches(Batch(ids, ids.clone()), 12, seed=0)


def _model(vocab: int, seed: int = 0) -> Transformer:
    return Transformer(ModelConfig(vocab_size=vocab, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2), seed=seed)


def run_train(mode: str, out: str) -> None:
    vocab, data = _data()
    cfg = TrainConfig(steps=STEPS, lr=1e-2, warmup_steps=2, accum_steps=2, checkpoint_every=4, log_every=1)
    if mode == "crash":
        def dying(i):
            if i == CRASH_AT - 1 and distributed.is_main():
                os._exit(3)  # no clean-up, no exception: a killed process
            return data(i)
        train(_model(vocab), dying, cfg, checkpoint_dir=os.path.join(out, "checkpoints"))
        return
    model = _model(vocab, seed=0 if mode == "train" else 123)  # a resumed run's weights all come from the checkpoint
    hist = train(model, data, cfg, checkpoint_dir=os.path.join(out, "checkpoints" if mode == "resume" else mode),
                 resume=mode == "resume")
    _write(out, mode, {"loss": hist.loss, "grad_norm": hist.grad_norm, "step": hist.step},
           {"": model.state_dict()})


SAMPLE = rlvr._sample  # rlvr's own sampling of a round, called here one prompt at a time


def _sample_per_prompt(policy, prompts, reward, cfg, tok, generator, dtype, while_judging=None):
    """rlvr's sampling with each prompt's rollouts drawn from a generator of its own (seeded by the prompt and
    the round), so that which process samples a prompt does not change its rollouts."""
    _sample_per_prompt.round = getattr(_sample_per_prompt, "round", -1) + 1
    seed = lambda p: 1_000 * _sample_per_prompt.round + sum(31 ** i * t for i, t in enumerate(p)) % 997
    return rlvr.RoundSamples.concat([SAMPLE(policy, [p], reward, cfg, tok, torch.Generator().manual_seed(seed(p)),
                                            dtype) for p in prompts])


def run_rlvr(out: str) -> None:
    rlvr._sample = _sample_per_prompt  # rollouts that do not depend on the layout of the batch
    task = make_task(ArithmeticConfig(max_digits=1))
    tok = task.tokenizer()
    prompts = [(tok.bos_id, *tok.encode(e.prompt)) for e in task.examples("train", 24, seed=0)]
    reward = VerifierReward(task, tok, 3.0, 0.1)
    result, weights = {}, {}
    for loss in (rlvr.Listing3(), rlvr.GRPO(), rlvr.DrGRPO(), rlvr.DAPO()):
        policy = _model(tok.vocab_size, seed=1)
        reference = _model(tok.vocab_size, seed=1).requires_grad_(False)
        cfg = rlvr.RLVRConfig(iterations=3, prompts_per_iteration=4, samples_per_prompt=4, max_new_tokens=4,
                              minibatches=2, lr=3e-3, beta=0.0 if isinstance(loss, rlvr.Listing3) else 0.05)
        hist = rlvr.rlvr(policy, reference, prompts, reward, cfg, loss, tok=tok, seed=0)
        name = type(loss).__name__
        result[name] = {k: getattr(hist, k) for k in ("reward", "abstained", "kl", "length", "bksp_rate", "zero_groups")}
        weights[name] = policy.state_dict()
    _write(out, "rlvr", result, weights)


def _write(out: str, mode: str, result: dict, weights: dict[str, dict]) -> None:
    if not distributed.is_main():
        return
    result["world_size"] = distributed.world_size()
    with open(os.path.join(out, f"{mode}.json"), "w") as f:
        json.dump(result, f)
    for name, state in weights.items():
        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, f"{mode}-{name}.safetensors"))


def main(mode: str, out: str) -> None:
    torch.set_num_threads(1)
    distributed.start()
    try:
        run_rlvr(out) if mode == "rlvr" else run_train(mode, out)
    finally:
        distributed.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
