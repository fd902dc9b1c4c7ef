"""One layer's deficiency analysis, and a folder that keeps finished layers across runs.

:func:`head_deficiency` analyses the layers of a model one at a time, independently of each
other: a layer's curves depend on the model, the texts and the arguments, not on which other
layers are analysed. So a long analysis can keep each finished layer on disk
(:class:`LayerStore`, one ``.npz`` per layer, written atomically) and a rerun with the same
model, texts and arguments reads those layers back instead of recomputing them. A
*fingerprint* of what the curves depend on is kept beside them; a folder holding another
analysis's layers is cleared and started over.
"""

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._head_forms import METHODS, HeadForms
from ._inputs import require, token_batches

__all__ = ["LayerDeficiency", "LayerStore", "fingerprint"]

_FORMAT = 2  # of the files below; part of the fingerprint


@dataclass
class LayerDeficiency:
    """What the analysis of one layer yields (see :func:`head_deficiency`).

    Arrays run over the analysed query heads (``n_heads`` of them) and the ranks ``0 ..
    d_h``: ``errors[m]`` ``(n_heads, d_h + 1)``, the relative output errors of method ``m``
    (NaN where not measured); ``stream_err[m]`` ``(n_heads, d_h + 1, n_eval)`` (float32),
    each evaluation text's error in the residual stream; ``share`` ``(n_heads,)``, each
    head's energy in the stream relative to the layer's input; ``text_energy`` ``(n_eval,)``,
    the input's energy per evaluation text. ``forms`` maps ``(head, method)`` to the head's
    :class:`HeadForms`, ``trained`` ``(head, rank)`` to a trained pair ``(W~_Q', W~_K')``.
    """

    index: int
    errors: dict
    stream_err: dict
    share: np.ndarray
    text_energy: np.ndarray
    n_eval_tokens: int
    forms: dict = field(default_factory=dict)
    trained: dict = field(default_factory=dict)
    seconds: float = 0.0  # the curves
    train_seconds: float = 0.0  # the trained pairs

    def to_arrays(self):
        """The layer as a flat ``{name: ndarray}`` (for :func:`numpy.savez`)."""
        out = {"index": np.asarray(self.index), "share": self.share,
               "text_energy": self.text_energy, "n_eval_tokens": np.asarray(self.n_eval_tokens),
               "seconds": np.asarray([self.seconds, self.train_seconds])}
        for m in METHODS:
            out[f"errors_{m}"] = self.errors[m]
            out[f"stream_{m}"] = self.stream_err[m]
        for (h, m), forms in self.forms.items():
            out[f"forms_{h}_{m}_A_Q"], out[f"forms_{h}_{m}_A_K"] = forms.A_Q, forms.A_K
            out[f"forms_{h}_{m}_rotary"] = np.asarray(forms.rotary)
        for (h, r), (tq, tk) in self.trained.items():
            out[f"trained_{h}_{r}_Q"], out[f"trained_{h}_{r}_K"] = tq, tk
        return out

    @classmethod
    def from_arrays(cls, arrays):
        """The inverse of :meth:`to_arrays`."""
        forms, trained = {}, {}
        for name in arrays:
            parts = name.split("_")
            if parts[0] == "forms" and parts[-1] == "Q" and parts[-2] == "A":
                h, m = int(parts[1]), parts[2]
                forms[(h, m)] = HeadForms.restore(arrays[name], arrays[f"forms_{h}_{m}_A_K"],
                                                  bool(arrays[f"forms_{h}_{m}_rotary"]))
            elif parts[0] == "trained" and parts[-1] == "Q":
                h, r = int(parts[1]), int(parts[2])
                trained[(h, r)] = (arrays[name], arrays[f"trained_{h}_{r}_K"])
        seconds, train_seconds = (float(s) for s in arrays["seconds"])
        return cls(index=int(arrays["index"]), share=arrays["share"],
                   errors={m: arrays[f"errors_{m}"] for m in METHODS},
                   stream_err={m: arrays[f"stream_{m}"] for m in METHODS},
                   text_energy=arrays["text_energy"],
                   n_eval_tokens=int(arrays["n_eval_tokens"]), forms=forms, trained=trained,
                   seconds=seconds, train_seconds=train_seconds)


def fingerprint(model, tokenizer, texts, arguments):
    """A digest of what a layer's curves depend on.

    The model's parameters and buffers (names, dtypes, shapes, bytes), the texts and the
    token ids the tokenizer gives them, the ``arguments`` (a JSON-serialisable mapping) and
    the package's version.
    """
    torch = require("torch")
    from .. import __version__

    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps({"format": _FORMAT, "version": __version__,
                              "arguments": arguments, "texts": list(texts)},
                             sort_keys=True).encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    for batch in token_batches(tokenizer, texts, arguments["max_length"],
                               arguments["batch_size"]):
        for key in ("input_ids", "attention_mask"):
            digest.update(np.asarray(batch[key], dtype=np.int64).tobytes())
    return digest.hexdigest()


class LayerStore:
    """A folder of finished layers: ``manifest.json`` and ``layer_<index>.npz``.

    Parameters
    ----------
    directory : str or path-like
        Created if needed.
    key : str
        The analysis's :func:`fingerprint`. Layers kept under another key are removed (with
        a warning) and the folder starts over with this one.
    """

    def __init__(self, directory, key):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest = self.directory / "manifest.json"
        old = None
        if manifest.is_file():
            try:
                old = json.loads(manifest.read_text()).get("fingerprint")
            except (OSError, ValueError):
                old = None
        stale = sorted(self.directory.glob("layer_*.npz"))
        if old != key:
            if stale:
                warnings.warn(
                    f"{self.directory} held {len(stale)} layers of another analysis (another "
                    "model, text or arguments); they are removed and the analysis starts "
                    "over.", UserWarning, stacklevel=3)
            for path in stale:
                path.unlink()
            _write_atomically(manifest, json.dumps({"fingerprint": key}).encode())

    def path(self, index):
        return self.directory / f"layer_{index:04d}.npz"

    def load(self, index):
        """The kept :class:`LayerDeficiency` of layer ``index``, or ``None``."""
        path = self.path(index)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                return LayerDeficiency.from_arrays({k: data[k] for k in data.files})
        except (OSError, ValueError, KeyError):  # unreadable: computed again
            return None

    def save(self, layer):
        """Write one layer; a reader never sees a partly written file."""
        import io

        buffer = io.BytesIO()
        np.savez(buffer, **layer.to_arrays())
        _write_atomically(self.path(layer.index), buffer.getvalue())


def _write_atomically(path, data):
    """Write ``data`` (bytes) to a temporary file beside ``path``, then rename it over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
