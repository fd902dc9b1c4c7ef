"""``ebound demo``: the whole argument on a built-in planted softmax-attention task."""

import warnings

import numpy as np

from ._core import (
    Progress,
    add_common_options,
    add_size_options,
    emit,
    non_negative_float,
    out_dir,
    positive_int,
    set_threads,
    write_json,
)
from ._experiments import save_sweep_figure, sweep_report

__all__ = ["add_demo_parser", "demo_command"]


def add_demo_parser(commands):
    """Add the ``demo`` command to the ``ebound`` sub-command parsers; returns its parser."""
    parser = commands.add_parser(
        "demo", help="the whole argument on a built-in planted softmax-attention task",
        description="Plant a softmax-attention task of known query-key rank; read r* from the "
                    "data before training; show the naive static reading failing; sweep the "
                    "model rank; train at full width and read the learned rank; print a "
                    "verdict. Writes demo.json and deficiency_curve.png to --out.")
    add_size_options(parser, 512, 32, 6, 2, 0.1)
    parser.add_argument("--logit-scale", type=non_negative_float, default=2.0,
                        help="softmax logit scale beta (default: %(default)s)")
    parser.add_argument("--max-epochs", type=positive_int, default=150,
                        help="training epochs of each model (default: %(default)s)")
    add_common_options(parser)
    parser.set_defaults(run=demo_command)
    return parser


def demo_command(args):
    """Run ``ebound demo`` on parsed arguments; returns the exit code (1 if ranks disagree)."""
    from .. import IntrinsicRankEstimator
    from ..datasets import make_attention_task
    from ..experiments import rank_sweep
    from ..nn import LowRankAttentionRegressor

    set_threads()
    progress = Progress("demo: estimate, sweep, train")
    progress(0, 3)
    r_star = args.rank
    X, Y, params = make_attention_task(
        "softmax", args.n_samples, args.n_tokens, args.n_features, rank=r_star,
        logit_scale=args.logit_scale, value="random", noise=args.noise, random_state=args.seed,
        return_params=True,
    )
    lines = [f"Planted softmax-attention task: N={args.n_samples} sequences, n={args.n_tokens} "
             f"tokens, d={args.n_features} channels, rank(W_Q W_K^T)={r_star}, "
             f"logit scale {args.logit_scale}, noise {args.noise}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = IntrinsicRankEstimator("attention").fit(X, Y).rank_
        static = IntrinsicRankEstimator("static").fit(X, Y).rank_
    lines.append(f"Data-only attention-native r* (before training, value map unknown): {native}")
    lines.append(f"Naive static token-mixing rank (the failing transfer): {static} of "
                 f"{args.n_tokens}")
    training = {"attention": "softmax", "logit_scale": args.logit_scale, "lr": 0.05,
                "max_epochs": args.max_epochs, "batch_size": -1, "device": args.device,
                "random_state": args.seed}
    progress(1, 3)
    ranks = range(1, args.n_features + 1)
    sweep = rank_sweep(LowRankAttentionRegressor(**training), X, Y, ranks, cv=3,
                       n_jobs=args.n_jobs, noise_floor=params.noise_floor)
    lines.append("Rank sweep of LowRankAttentionRegressor (3-fold held-out risk per token):")
    lines.append(sweep_report(sweep))
    lines.append(f"Knee of the sweep: rank {sweep.knee} (noise floor {params.noise_floor:.4g})")
    progress(2, 3)
    recovered = LowRankAttentionRegressor(**training, init_scale=1e-2).fit(X, Y)
    progress(3, 3)
    lines.append(f"Gradient descent at full width (k = d = {args.n_features}) from a small "
                 f"initialisation: energy rank of the learned W_Q W_K^T = "
                 f"{recovered.effective_rank_}")
    agree = native == sweep.knee == recovered.effective_rank_ == r_star
    verdict = (f"Verdict: r* = {native}: data-only estimate, sweep knee and gradient descent "
               f"{'agree with' if agree else 'do not all match'} the planted rank {r_star}.")
    lines.append(verdict)
    out = out_dir(args)
    payload = {
        "planted_rank": r_star, "data_only_rank": native, "naive_static_rank": static,
        "knee": sweep.knee, "gradient_descent_rank": recovered.effective_rank_,
        "agree": agree, "sweep": sweep.to_dict(),
        "learned_kernel_singular_values": np.linalg.svd(recovered.qk_kernel_,
                                                        compute_uv=False).tolist(),
    }
    write_json(out / "demo.json", payload)
    png = save_sweep_figure(sweep, out / "deficiency_curve.png",
                            "Deficiency curve of a planted softmax-attention task")
    lines.append(f"Wrote {out / 'demo.json'}" + (f" and {png}" if png else
                                                   " (install matplotlib for the PNG)"))
    emit(args, payload, "\n".join(lines))
    return 0 if agree else 1
