"""The reference sampler: determinism, each filter's semantics, and the distribution itself."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import KogError
from engine.sampling import SamplingParams, apply_repetition_penalty, sample, uniform


def random_logits(seed: int, n: int = 500, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def test_uniform_is_a_pure_function_in_range():
    draws = [uniform(7, step) for step in range(20000)]
    assert draws == [uniform(7, step) for step in range(20000)]
    assert min(draws) >= 0.0 and max(draws) < 1.0
    assert abs(np.mean(draws) - 0.5) < 0.01
    assert draws[:100] != [uniform(8, step) for step in range(100)]


def test_greedy_is_argmax(seed):
    logits = random_logits(seed)
    assert sample(logits, SamplingParams(), np.array([], dtype=np.int64), 0) == int(np.argmax(logits))


@pytest.mark.parametrize("temperature", [1e-50, 1e-39, 1e-7])
def test_temperatures_too_small_for_fp32_are_greedy(temperature, seed):
    logits = random_logits(seed)
    params = SamplingParams(temperature=temperature, seed=seed)
    assert params.greedy
    assert {sample(logits, params, np.array([]), step) for step in range(20)} == {int(np.argmax(logits))}


def test_same_seed_same_tokens(seed):
    # Flat logits: at a scale of 3 one token can hold more than top_p's mass, and
    # then every seed samples it, so two seeds' draws would agree by design.
    logits = random_logits(seed, scale=1.0)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
    first = [sample(logits, params, np.array([]), step) for step in range(50)]
    assert first == [sample(logits, params, np.array([]), step) for step in range(50)]
    other = SamplingParams(temperature=0.9, top_p=0.95, seed=seed + 1)
    assert first != [sample(logits, other, np.array([]), step) for step in range(50)]


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=1e-6), SamplingParams(temperature=1.0, min_p=0.999)],
)
def test_filters_that_keep_one_token_are_greedy(params, seed):
    logits = random_logits(seed)
    logits[np.argmax(logits)] += 0.01  # (min_p 0.999 keeps a runner-up within log(1 / 0.999) of the best)
    tokens = {sample(logits, params, np.array([]), step) for step in range(30)}
    assert tokens == {int(np.argmax(logits))}


def test_samples_follow_the_filtered_distribution(seed):
    logits = random_logits(seed, n=8)
    params = SamplingParams(temperature=1.5, top_k=5, seed=seed)
    n = 40000
    counts = np.bincount([sample(logits, params, np.array([]), s) for s in range(n)], minlength=8)
    top5 = np.argsort(-logits)[:5]
    p = np.exp(logits[top5] / 1.5)
    p /= p.sum()
    assert counts.sum() == counts[top5].sum()  # nothing outside the top 5
    sd = np.sqrt(p * (1 - p) / n)  # each frequency's standard deviation: six of them fail ~1e-8 of runs
    assert np.all(np.abs(counts[top5] / n - p) <= 6 * sd)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    params = SamplingParams(temperature=1.0, top_p=0.75)
    seen = {sample(logits, params, np.array([]), s) for s in range(2000)}
    assert seen == {0, 1}


def test_repetition_penalty_matches_transformers(seed):
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = random_logits(seed, 50)
    history = np.random.default_rng(seed).integers(0, 50, 30)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor(history)[None], torch.tensor(logits)[None])[0].numpy()
    assert np.allclose(apply_repetition_penalty(logits, history, 1.3), expected)


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0), dict(repetition_penalty=0)]
)
def test_bad_parameters_are_user_errors(kwargs):
    with pytest.raises(KogError):
        SamplingParams(**kwargs)
