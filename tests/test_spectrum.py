"""Spectral ranks: energy, entropy, stable, Gavish–Donoho threshold, tail energy."""

import numpy as np
import pytest

from sklearn_ebound import (
    energy_rank,
    entropy_rank,
    optimal_hard_threshold,
    stable_rank,
    tail_energy,
    threshold_rank,
)
from sklearn_ebound._spectrum import marchenko_pastur_median


def test_energy_rank_counts_the_energy():
    s = np.array([3.0, 2.0, 1.0, 0.0])  # energies 9, 4, 1 of 14
    assert energy_rank(s, tau=0.5) == 1
    assert energy_rank(s, tau=0.9) == 2  # 13/14 = 0.929
    assert energy_rank(s, tau=0.95) == 3
    assert energy_rank(s, tau=1.0) == 3  # the zero value is never needed
    assert energy_rank(np.zeros(5)) == 0
    assert energy_rank(s[::-1]) == energy_rank(s)  # order of the input does not matter


def test_entropy_rank_normalises_by_the_sum_of_singular_values():
    assert entropy_rank(np.ones(7)) == pytest.approx(7.0)
    p = np.array([2 / 3, 1 / 3])
    assert entropy_rank(np.array([2.0, 1.0])) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert entropy_rank(np.zeros(3)) == 0.0


def test_stable_rank():
    assert stable_rank(np.array([2.0, 1.0, 1.0])) == pytest.approx(6 / 4)
    assert stable_rank(np.eye(5)) == pytest.approx(5.0)


def test_functions_accept_stacks_of_matrices():
    rng = np.random.default_rng(0)
    heads = np.stack([rng.standard_normal((6, k)) @ rng.standard_normal((k, 6)) for k in (1, 2, 3)])
    heads = heads.reshape(3, 1, 6, 6)  # (layers, heads, d, d)
    ranks = energy_rank(heads, tau=1.0)
    assert ranks.shape == (3, 1)
    np.testing.assert_array_equal(ranks[:, 0], [1, 2, 3])
    np.testing.assert_array_equal(threshold_rank(heads, 1e-9)[:, 0], [1, 2, 3])
    assert stable_rank(heads).shape == (3, 1)
    # A 2-D array read as a stack of spectra.
    spectra = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(energy_rank(spectra, tau=1.0, is_spectrum=True), [1, 3])


def test_gavish_donoho_constants():
    # lambda(1) = 4 / sqrt(3) for a square matrix with known noise.
    n = 100
    assert optimal_hard_threshold(np.ones(n), 1.0) == pytest.approx(4 / np.sqrt(3) * np.sqrt(n))
    # omega(1) ~ 2.858 with unknown noise: threshold / median.
    assert optimal_hard_threshold(np.ones(n)) == pytest.approx(2.858, abs=1e-3)


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
def test_marchenko_pastur_median_matches_simulation(beta):
    rng = np.random.default_rng(1)
    n = 2000
    m = int(beta * n)
    G = rng.standard_normal((m, n))
    eig = np.linalg.eigvalsh(G @ G.T / n)
    assert marchenko_pastur_median(beta) == pytest.approx(np.median(eig), abs=0.02)


@pytest.mark.parametrize("shape", [(200, 200), (80, 300), (300, 80), (20, 1000)])
@pytest.mark.parametrize("sigma", [None, 0.7])
def test_pure_noise_gives_rank_zero_and_a_spike_is_found(shape, sigma):
    rng = np.random.default_rng(2)
    noise_sd = 0.7
    N = noise_sd * rng.standard_normal(shape)
    assert threshold_rank(N, sigma) == 0
    # Three spikes well above the bulk edge sigma * (sqrt(m) + sqrt(n)).
    m, n = shape
    edge = noise_sd * (np.sqrt(m) + np.sqrt(n))
    U = np.linalg.qr(rng.standard_normal((m, 3)))[0]
    V = np.linalg.qr(rng.standard_normal((n, 3)))[0]
    A = N + (U * edge * np.array([3.0, 2.5, 2.0])) @ V.T
    assert threshold_rank(A, sigma) == 3
    # The same answer from the spectrum with its matrix shape.
    s = np.linalg.svd(A, compute_uv=False)
    assert threshold_rank(s, sigma, shape=shape) == 3


def test_tail_energy():
    s = np.array([3.0, 2.0, 1.0])
    np.testing.assert_allclose(tail_energy(s, np.arange(5)), [14, 5, 1, 0, 0])
    assert tail_energy(s, 1) == 5.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: energy_rank(np.ones(3), tau=0), "tau"),
        (lambda: energy_rank(np.ones(3), tau=1.5), "tau"),
        (lambda: energy_rank(np.array([1.0, np.nan])), "NaN"),
        (lambda: energy_rank(np.array([1.0, -1.0])), "non-negative"),
        (lambda: energy_rank(3.0), "scalar"),
        (lambda: tail_energy(np.ones(3), -1), "rank"),
        (lambda: optimal_hard_threshold(np.ones(3), -1.0), "sigma"),
        (lambda: optimal_hard_threshold(np.ones(3), shape=(2, 5)), "shape"),
        (lambda: optimal_hard_threshold(np.ones(3), shape=(10, 20)), "min"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_non_numeric_input_is_a_type_error():
    with pytest.raises(TypeError, match="real numeric"):
        energy_rank(np.array(["a", "b"]))
