"""Plain result tables, exported without pandas; shared by the experiments and ``heads``."""

import csv
import io
import json
from pathlib import Path

import numpy as np

__all__ = ["ResultTable"]


def _plain(value):
    """numpy scalars and arrays to JSON-ready Python values (NaN becomes None)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    if isinstance(value, float) and np.isinf(value):
        return "inf" if value > 0 else "-inf"  # JSON has no infinity
    return value


class ResultTable:
    """Rows of an experiment, one dict per row with the same keys, plus metadata.

    Parameters
    ----------
    rows : list of dict
        The table, one dict per row.
    **meta
        Whole-experiment values (the selected rank, the settings used, ...); each is also an
        attribute of the result.
    """

    def __init__(self, rows, **meta):
        self.rows = [dict(row) for row in rows]
        self.meta = meta
        for key, value in meta.items():
            setattr(self, key, value)

    @property
    def columns(self):
        """Column names, in the order of the first row."""
        return list(self.rows[0]) if self.rows else []

    def column(self, name):
        """One column as a numpy array."""
        return np.array([row[name] for row in self.rows])

    def to_dict(self):
        """``{"columns": [...], "rows": [...], **meta}`` with plain Python values."""
        return _plain({"columns": self.columns, "rows": self.rows, **self.meta})

    def to_json(self, path=None, **kwargs):
        """The :meth:`to_dict` form as JSON; written to ``path`` when given, else returned."""
        text = json.dumps(self.to_dict(), indent=2, **kwargs)
        if path is None:
            return text
        Path(path).write_text(text)
        return None

    def to_csv(self, path=None):
        """The rows as CSV (metadata left out); written to ``path`` when given, else returned."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        for row in _plain(self.rows):
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
        if path is None:
            return buffer.getvalue()
        Path(path).write_text(buffer.getvalue())
        return None

    def format(self, floatfmt=".4g"):
        """A fixed-width text table for terminals."""
        header = self.columns
        cells = [[_format_cell(row[c], floatfmt) for c in header] for row in self.rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
        return "\n".join(lines)

    def __repr__(self):
        return f"{type(self).__name__}({len(self.rows)} rows, columns={self.columns})"


def _format_cell(value, floatfmt):
    if isinstance(value, (np.ndarray, list, tuple)):
        values = [format(float(v), ".3g") for v in np.ravel(value)]
        return " ".join(values[:4]) + (" ..." if len(values) > 4 else "")
    if value is None:
        return "-"
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return "-"
        return str(float(value)) if np.isinf(value) else format(value, floatfmt)
    return str(value)
