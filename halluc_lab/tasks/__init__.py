"""Synthetic tasks with programmatic verifiers (ARCHITECTURE.md §8; chapters 7–8 and after).

One module per task, sharing :mod:`halluc_lab.tasks.base`:

* :mod:`~halluc_lab.tasks.kb_walk` — chains of facts in a fictional knowledge base
  (rare facts, abstention, hallucinated steps);
* :mod:`~halluc_lab.tasks.arithmetic` — multi-digit addition, digit by digit;
* :mod:`~halluc_lab.tasks.path_star` — path-star graphs (Bachmann & Nagarajan, 2024);
* :mod:`~halluc_lab.tasks.dead_ends` — path-star graphs whose wrong first step meets a dead end k
  tokens later (or never), and retry data that takes it back (chapter 10's fair test);
* :mod:`~halluc_lab.tasks.kb_growth` — a kb_walk world that grows new entities, relations and facts
  (chapter 12's continual learning);
* :mod:`~halluc_lab.tasks.sycophancy` — arithmetic prompts that carry the user's stated answer,
  right or wrong (chapter 12's sycophancy);
* :mod:`~halluc_lab.tasks.in_context` — a fresh rule in every prompt, given only by its examples
  (chapter 12's in-context learning).

Every task's ``reward`` has the signature ``(prompts, completions, **kw) -> list[float]``
and ``claims`` says which parts of a completion are supported::

    from halluc_lab.tasks import Arithmetic, ArithmeticConfig
    task = Arithmetic(ArithmeticConfig(max_digits=3))
    ex = task.examples("heldout", 4, seed=0)
    task.reward([e.prompt for e in ex], [e.completion for e in ex])   # [1.0, 1.0, 1.0, 1.0]
"""

from halluc_lab.tasks.arithmetic import Arithmetic, ArithmeticConfig
from halluc_lab.tasks.in_context import InContext, InContextConfig
from halluc_lab.tasks.base import (ABSTAINED, CONTRADICTED, HALLUCINATED, MALFORMED, SPLITS,
                                   SUPPORTED, UNSUPPORTED, Claim, Example, Task, completion_symbols,
                                   make_task)
from halluc_lab.tasks.kb_growth import KBGrowth, KBGrowthConfig
from halluc_lab.tasks.kb_walk import KBWalk, KBWalkConfig
from halluc_lab.tasks.sycophancy import Sycophancy, SycophancyConfig
from halluc_lab.tasks.path_star import PathStar, PathStarConfig
from halluc_lab.tasks.dead_ends import DeadEnds, DeadEndsConfig

TaskConfig = (KBWalkConfig | ArithmeticConfig | PathStarConfig | InContextConfig | KBGrowthConfig
              | SycophancyConfig | DeadEndsConfig)


__all__ = ["Arithmetic", "ArithmeticConfig", "InContext", "InContextConfig", "KBGrowth",
           "KBGrowthConfig", "Sycophancy", "SycophancyConfig", "KBWalk", "KBWalkConfig", "PathStar",
           "PathStarConfig", "DeadEnds", "DeadEndsConfig", "Task", "TaskConfig", "Example", "Claim",
           "make_task", "completion_symbols", "SPLITS", "SUPPORTED", "CONTRADICTED", "UNSUPPORTED",
           "ABSTAINED", "MALFORMED", "HALLUCINATED"]
