"""The training stages, each beside its training: pre-training, SFT, the reward model, DPO and
RSFT, PPO (RLHF) and RLVR.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
