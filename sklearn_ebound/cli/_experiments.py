"""``ebound sweep``, ``ebound ladder`` and ``ebound frontier``: the experiments of the paper.

Each writes its result table as ``NAME.json`` and ``NAME.csv`` under ``--out`` and prints it.
"""

import argparse
import textwrap

from ._core import (
    Progress,
    add_common_options,
    add_size_options,
    emit,
    empty_columns,
    format_table,
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
    "sweep_report",
    "sweep_command",
]

# The planted tasks of `ebound sweep`: a static 2-D regression or an attention class.
_ATTENTIONS = ["static", "linear", "softmax"]

# The ladder's printed headers, short enough for the table to fit about 100 columns; the
# legend below the table says what each means, and the JSON and CSV keep the full names.
_LADDER_HEADERS = {
    "logit_scale": "beta",
    "true_rank": "r*",
    "static_estimate": "r_static",
    "attention_estimate": "r_attn",
    "static_excess_risk": "excess",
    "static_relative_excess": "rel_excess",
    "static_recovers": "solved",
}
_LADDER_LEGEND = (
    "beta: logit scale. r*: planted rank. r_static, r_attn: the rank read from the data with "
    "the static operator (for attention rungs the naive static transfer; at rung 2 the rank of "
    "the log of the fitted mixing, - where a weight is not positive) and with the "
    "attention-native one (attention rungs only). excess: held-out excess risk per token "
    "of the static least-squares model (risk minus the noise floor); rel_excess: the same as "
    "a fraction of the signal. solved: r_static = r* and rel_excess < {tolerance:g}. The JSON "
    "and CSV keep the full column names and every digit.")


def add_experiment_parsers(commands):
    """Add ``sweep``, ``ladder`` and ``frontier`` to the ``ebound`` sub-command parsers."""
    sweep = commands.add_parser(
        "sweep", help="rank sweep (deficiency curve) on a planted task",
        description="Held-out risk of the best rank-r model for every r, with the knee.")
    sweep.add_argument("--attention", choices=_ATTENTIONS, default="static",
                       help="the planted task: static (2-D reduced-rank regression), or linear "
                            "or softmax attention (default: %(default)s; --kind is an alias)")
    # The former name of --attention, kept working and out of the help.
    sweep.add_argument("--kind", dest="attention", choices=_ATTENTIONS,
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_size_options(sweep, 2000, 16, 8, 3, 0.3)
    sweep.add_argument("--cv", type=positive_int, default=3,
                       help="cross-validation folds per rank (default: %(default)s)")
    sweep.add_argument("--max-epochs", type=positive_int, default=150,
                       help="training epochs of each attention model (default: %(default)s)")
    add_common_options(sweep)
    sweep.set_defaults(run=sweep_command)

    ladder = commands.add_parser(
        "ladder", help="the interpolation ladder, rung by rung",
        description="From static linear mixing to softmax attention, one property at a time.")
    add_size_options(ladder, 2000, 16, 4, 3, 0.05)
    ladder.add_argument("--logit-scales", type=non_negative_float, nargs="+",
                        default=[0.5, 1.0, 2.0, 4.0], metavar="BETA",
                        help="logit scales of the softmax rungs (default: 0.5 1 2 4)")
    add_common_options(ladder, json_only=True)
    ladder.set_defaults(run=ladder_command)

    frontier = commands.add_parser(
        "frontier", help="the predictability frontier of the data-only rank",
        description="Recovery rate of the data-only attention-native rank over logit scale, "
                    "sequence length, value-map conditioning and noise.")
    frontier.add_argument("--n-samples", type=positive_int, default=300,
                          help="sequences per task (default: %(default)s)")
    frontier.add_argument("--n-tokens", type=positive_int, nargs="+", default=[16, 64],
                          metavar="N", help="sequence lengths (default: 16 64)")
    frontier.add_argument("--n-features", type=positive_int, default=6,
                          help="channels per token (default: %(default)s)")
    frontier.add_argument("--rank", type=int, default=2,
                          help="planted rank r* (default: %(default)s)")
    frontier.add_argument("--noise", type=non_negative_float, default=0.1,
                          help="noise standard deviation (default: %(default)s)")
    frontier.add_argument("--logit-scales", type=non_negative_float, nargs="+",
                          default=[0.5, 1.0, 2.0, 4.0, 8.0], metavar="BETA",
                          help="logit scales (default: 0.5 1 2 4 8)")
    frontier.add_argument("--repeats", type=positive_int, default=5,
                          help="planted tasks per cell (default: %(default)s)")
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


def sweep_report(result):
    """The printed table of a rank sweep, with a note on its columns below.

    The ``bound`` column is left out where it is empty (attention: the operator's spectrum is
    not known); the JSON keeps every column.
    """
    empty = empty_columns(result.rows)
    columns = [c for c in result.columns if c not in empty]
    notes = []
    if "excess_risk" in columns:
        notes.append("excess_risk = held-out risk minus the noise floor; at and above r* "
                     "sampling noise can make it < 0.")
    if "bound" in columns:
        notes.append("bound = T(r), the true spectrum's tail energy beyond r: the excess risk "
                     "every rank-r model keeps.")
    elif "bound" in empty:
        notes.append("bound (the tail energy T(r)) is left out: it needs the operator's "
                     "spectrum, unknown for attention.")
    return "\n".join([format_table(result.rows, columns),
                      *(line for note in notes for line in textwrap.wrap(note, 100))])


def _report_table(args, result, name, title, summary=None, extra_files=(), table=None):
    """Write ``NAME.json`` and ``NAME.csv`` under ``--out`` and print the table (or JSON).

    ``table`` is the printed table with any notes, by default the result's own format.
    """
    files = [*write_table(result, out_dir(args), name), *extra_files]
    lines = [title, result.format() if table is None else table]
    lines += [summary] if summary else []
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
                         f"Knee: rank {result.knee}", [png] if png else [],
                         table=sweep_report(result))


def ladder_command(args):
    """Run ``ebound ladder`` on parsed arguments; returns the exit code."""
    from ..experiments import interpolation_ladder

    result = interpolation_ladder(n_samples=args.n_samples, n_tokens=args.n_tokens,
                                  n_features=args.n_features, rank=args.rank,
                                  logit_scales=args.logit_scales, noise=args.noise,
                                  random_state=args.seed)
    legend = _LADDER_LEGEND.format(tolerance=result.meta.get("solved_tolerance", 0.05))
    table = format_table(result.rows, headers=_LADDER_HEADERS, wrap={"mixing": 28},
                         floatfmt=".3g")
    return _report_table(args, result, "ladder",
                         f"Interpolation ladder, planted rank {args.rank}",
                         table="\n".join([table, *textwrap.wrap(legend, 100)]))


def frontier_command(args):
    """Run ``ebound frontier`` on parsed arguments; returns the exit code."""
    from ..experiments import predictability_frontier

    result = predictability_frontier(
        logit_scales=args.logit_scales, n_tokens=args.n_tokens, n_samples=args.n_samples,
        n_features=args.n_features, rank=args.rank, n_repeats=args.repeats,
        noises=(args.noise,), random_state=args.seed, progress=Progress("frontier"))
    return _report_table(args, result, "frontier",
                         "Predictability frontier (recovery rate of the data-only rank)")
