"""What a compression's ``auto`` settings mean, by model kind.

Shared by :func:`~sklearn_ebound.heads.compress_model` and ``ebound heads --compress``, and
kept apart from both so that the command's parser can name them without loading the
numerical stack.
"""

__all__ = ["ENCODER_AUTO", "LANGUAGE_MODEL_AUTO"]

# What ``train_steps``, ``refine`` and ``refit`` "auto" mean for an encoder (a model that is
# not a causal language model): on all-MiniLM-L6-v2 at a budget of 40%, calibrated on 200
# docstring sentences, the trained pairs and the distillation lift the held-out embedding
# cosine (mean / min) from 0.983 / 0.927 to 0.990 / 0.949 (split A), and the refit on all
# the lines lifts the minimum on every split, to 0.973-0.978 on 7 of 8 random draws of the
# text (bench_encoder_cli.py; docs: real_models, "The refit"). A causal language model gets
# no trained step, no refinement and no refit: its long step is the curves, and a refit would
# read every layer's inputs again.
ENCODER_AUTO = {"train_steps": 15, "refine": "distill", "refit": "all"}
LANGUAGE_MODEL_AUTO = {"train_steps": 0, "refine": "none", "refit": "none"}
