"""Helpers shared by the whole package, below every concept: input validation
(:mod:`.validation`), random draws (:mod:`.random`), dask reductions (:mod:`.dask`), plain
result tables (:mod:`.results`) and renamed keywords (:mod:`.deprecation`)."""
