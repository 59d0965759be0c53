"""Where does the first PPO stage in a process spend its time? (probe, not committed)"""
import os, sys, time, functools, json
sys.path.insert(0, os.getcwd())
import torch
import halluc_lab as hl
from halluc_lab import recipes
from halluc_lab.stages import rlhf, reward_model
from halluc_lab.training import step as step_mod

T = {}
def timed(mod, name):
    f = getattr(mod, name)
    @functools.wraps(f)
    def w(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            torch.cuda.synchronize(); T.setdefault(f"{mod.__name__.split('.')[-1]}.{name}", []).append(round(time.perf_counter() - t, 2))
    setattr(mod, name, w)

for mod, name in [(rlhf, "sample_groups"), (rlhf, "fit_reward_model"), (rlhf, "ppo"), (rlhf, "generate"),
                  (rlhf, "reward_values"), (rlhf, "rollout_batch")]:
    if hasattr(mod, name):
        timed(mod, name)
for cls, meth in [(rlhf._Rounds, "score"), (rlhf._Rounds, "update"), (rlhf._Rounds, "__init__")]:
    f = getattr(cls, meth)
    def mk(f, key):
        @functools.wraps(f)
        def w(*a, **k):
            torch.cuda.synchronize(); t = time.perf_counter()
            try: return f(*a, **k)
            finally:
                torch.cuda.synchronize(); T.setdefault(key, []).append(round(time.perf_counter() - t, 3))
        return w
    setattr(cls, meth, mk(f, f"_Rounds.{meth}"))

rt = hl.setup()
t = time.perf_counter(); recipes.load("sycophancy-sft-clean", rt); print("parents", round(time.perf_counter() - t, 1), flush=True)
for name in ("sycophancy-rlhf", "sycophancy-rlhf-agreeable"):
    T.clear(); t = time.perf_counter(); recipes.load(name, rt); total = time.perf_counter() - t
    summ = {k: (len(v), round(sum(v), 2), v[:3]) for k, v in T.items()}
    print(name, round(total, 1), json.dumps(summ), flush=True)
