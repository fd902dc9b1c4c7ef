"""``ebound sweep``, ``ebound ladder`` and ``ebound frontier``: the experiments of the paper.

Each writes its result table as ``NAME.json`` and ``NAME.csv`` under ``--out`` and prints it.
"""

import argparse

from ._core import (
    Progress,
    add_common_options,
    add_size_options,
    emit,
    non_negative_float,
    out_dir,
    positive_int,
    pyplot,
    save_figure,
    set_threads,
    write_table,
)

__all__ = [
    "add_experiment_parsers",
    "frontier_command",
    "ladder_command",
    "save_sweep_figure",
    "sweep_command",
]

# The planted tasks of `ebound sweep`: a static 2-D regression or an attention class.
_ATTENTIONS = ["static", "linear", "softmax"]


def add_experiment_parsers(commands):
    """Add ``sweep``, ``ladder`` and ``frontier`` to the ``ebound`` sub-command parsers."""
    sweep = commands.add_parser(
        "sweep", help="rank sweep (deficiency curve) on a planted task",
        description="Held-out risk of the best rank-r model for every r, with the knee.")
    sweep.add_argument("--attention", choices=_ATTENTIONS, default="static",
                       help="the planted task: static (2-D reduced-rank regression), or linear "
                            "or softmax attention (default static; --kind is an alias)")
    # The former name of --attention, kept working and out of the help.
    sweep.add_argument("--kind", dest="attention", choices=_ATTENTIONS,
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_size_options(sweep, 2000, 16, 8, 3, 0.3)
    sweep.add_argument("--cv", type=positive_int, default=3)
    sweep.add_argument("--max-epochs", type=positive_int, default=150)
    add_common_options(sweep)
    sweep.set_defaults(run=sweep_command)

    ladder = commands.add_parser(
        "ladder", help="the interpolation ladder, rung by rung",
        description="From static linear mixing to softmax attention, one property at a time.")
    add_size_options(ladder, 2000, 16, 4, 3, 0.05)
    ladder.add_argument("--logit-scales", type=non_negative_float, nargs="+",
                        default=[0.5, 1.0, 2.0, 4.0])
    add_common_options(ladder, json_only=True)
    ladder.set_defaults(run=ladder_command)

    frontier = commands.add_parser(
        "frontier", help="the predictability frontier of the data-only rank",
        description="Recovery rate of the data-only attention-native rank over logit scale, "
                    "sequence length, value-map conditioning and noise.")
    frontier.add_argument("--n-samples", type=positive_int, default=300)
    frontier.add_argument("--n-tokens", type=positive_int, nargs="+", default=[16, 64])
    frontier.add_argument("--n-features", type=positive_int, default=6)
    frontier.add_argument("--rank", type=int, default=2)
    frontier.add_argument("--noise", type=non_negative_float, default=0.1)
    frontier.add_argument("--logit-scales", type=non_negative_float, nargs="+",
                          default=[0.5, 1.0, 2.0, 4.0, 8.0])
    frontier.add_argument("--repeats", type=positive_int, default=5)
    add_common_options(frontier, json_only=True)
    frontier.set_defaults(run=frontier_command)
    return sweep, ladder, frontier


def save_sweep_figure(result, path, title):
    """Draw the deficiency curve of a sweep to ``path``; None when matplotlib is missing."""
    if pyplot() is None:
        return None
    from ..display import RankSweepDisplay

    display = RankSweepDisplay.from_result(result)
    display.ax_.set_title(title)
    return save_figure(display.figure_, path)


def _report_table(args, result, name, title, summary=None, extra_files=()):
    """Write ``NAME.json`` and ``NAME.csv`` under ``--out`` and print the table (or JSON)."""
    files = [*write_table(result, out_dir(args), name), *extra_files]
    lines = [title, result.format()] + ([summary] if summary else [])
    lines.append("Wrote " + ", ".join(str(f) for f in files))
    emit(args, result.to_dict(), "\n".join(lines))
    return 0


def sweep_command(args):
    """Run ``ebound sweep`` on parsed arguments; returns the exit code."""
    from .. import ReducedRankRegressor
    from ..datasets import make_attention_task, make_static_task
    from ..experiments import rank_sweep

    if args.attention == "static":
        X, Y, params = make_static_task(args.n_samples, args.n_features, rank=args.rank,
                                        noise=args.noise, decay=0.8, random_state=args.seed,
                                        return_params=True)
        estimator = ReducedRankRegressor()
        ranks = range(0, args.n_features + 1)
        bound = params.singular_values
    else:
        from ..nn import LowRankAttentionRegressor

        set_threads()
        # The attention class is passed by position: its keyword is being renamed.
        X, Y, params = make_attention_task(args.attention, args.n_samples, args.n_tokens,
                                           args.n_features, rank=args.rank, noise=args.noise,
                                           value="random", random_state=args.seed,
                                           return_params=True)
        estimator = LowRankAttentionRegressor(attention=args.attention, lr=0.05,
                                              max_epochs=args.max_epochs, batch_size=-1,
                                              device=args.device, random_state=args.seed)
        ranks = range(1, args.n_features + 1)
        bound = None
    result = rank_sweep(estimator, X, Y, ranks, cv=args.cv, n_jobs=args.n_jobs,
                        noise_floor=params.noise_floor, singular_values=bound)
    png = save_sweep_figure(result, out_dir(args) / "sweep.png",
                            f"Rank sweep, {args.attention} task")
    return _report_table(args, result, "sweep",
                         f"Rank sweep on a planted {args.attention} task of rank {args.rank}",
                         f"Knee: rank {result.knee}", [png] if png else [])


def ladder_command(args):
    """Run ``ebound ladder`` on parsed arguments; returns the exit code."""
    from ..experiments import interpolation_ladder

    result = interpolation_ladder(n_samples=args.n_samples, n_tokens=args.n_tokens,
                                  n_features=args.n_features, rank=args.rank,
                                  logit_scales=args.logit_scales, noise=args.noise,
                                  random_state=args.seed)
    return _report_table(args, result, "ladder",
                         f"Interpolation ladder, planted rank {args.rank}")


def frontier_command(args):
    """Run ``ebound frontier`` on parsed arguments; returns the exit code."""
    from ..experiments import predictability_frontier

    result = predictability_frontier(
        logit_scales=args.logit_scales, n_tokens=args.n_tokens, n_samples=args.n_samples,
        n_features=args.n_features, rank=args.rank, n_repeats=args.repeats,
        noises=(args.noise,), random_state=args.seed, progress=Progress("frontier"))
    return _report_table(args, result, "frontier",
                         "Predictability frontier (recovery rate of the data-only rank)")
