"""Helpers shared by the whole package, below every concept.

Input validation, random draws, dask reductions, plain result tables and renamed keywords,
one module each.
"""
