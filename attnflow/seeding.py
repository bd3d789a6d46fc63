"""Every seed attnflow uses, and the few sanctioned ways to derive one from another.

A random quantity in attnflow flows from one explicit ``numpy.random.SeedSequence``: a claim's seed comes from
the user's ``--seed`` and the claim's name, a sweep replicate's from the sweep's seed and the replicate index, a
bootstrap's from the claim or sweep that asks for it. A SeedSequence travels as itself; it is never squeezed
through an integer on the way (an integer keeps a fraction of the entropy, and two routes through integers
can collide). The derivations here are pure functions: the same inputs give the same child, whatever else was
spawned before, so results do not depend on the order of work or on the number of workers.
:func:`spawn` is numpy's own ``SeedSequence.spawn``: each call hands out the next, never-used children, which is
what a claim that splits its seed into parts wants.

The one integer that leaves this module is :func:`kernel_seed`, for numba's generator, which takes a seed in
[0, 2³²) only; the value is in that range by construction, never truncated by numba. Kernels with their own
generator (``dynamics/sampling.py``) take its whole 256-bit state from :func:`generator_state`.
"""
from __future__ import annotations

import numbers
import zlib

import numpy as np

__all__ = ["SeedLike", "as_seed_sequence", "child", "named", "instance", "spawn", "generators", "kernel_seed",
           "generator_state", "to_record", "from_record", "KERNEL_SEED_LIMIT"]

SeedLike = int | np.random.SeedSequence

# numba's np.random.seed accepts an unsigned 32-bit integer (so does numpy's legacy seed under NUMBA_DISABLE_JIT).
KERNEL_SEED_LIMIT = 2 ** 32


def as_seed_sequence(seed: SeedLike, name: str = "seed") -> np.random.SeedSequence:
    """``seed`` as a SeedSequence: a SeedSequence is returned as itself, a non-negative integer is its entropy.

    ``None``, booleans, floats and negative integers are refused with a ``ValueError`` naming ``name``:
    results must be reproducible, so there is no default seed.
    """
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer or a numpy SeedSequence, got {seed!r}")
    return np.random.SeedSequence(int(seed))


def child(seed: SeedLike, index: int) -> np.random.SeedSequence:
    """Child ``index`` of ``seed``: the SeedSequence ``seed.spawn(index + 1)[index]`` would give, computed without
    spawning (so it does not depend on how many children were spawned before)."""
    parent = as_seed_sequence(seed)
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral) or index < 0:
        raise ValueError(f"index must be a non-negative integer, got {index!r}")
    return np.random.SeedSequence(parent.entropy, spawn_key=(*parent.spawn_key, int(index)),
                                  pool_size=parent.pool_size)


def named(seed: SeedLike, name: str) -> np.random.SeedSequence:
    """The child of ``seed`` that belongs to ``name`` (a claim): child number crc32(name).

    Selecting a subset of claims, or running them in another order, changes no claim's numbers.
    """
    return child(seed, zlib.crc32(name.encode()))


def instance(seed: SeedLike) -> np.random.SeedSequence:
    """The seed of the random problem instance a run studies: the run's own seed with every derivation below it
    removed (its entropy alone). Every claim and replicate of one run thus looks at the same instance, and another
    ``--seed`` draws another one."""
    return np.random.SeedSequence(as_seed_sequence(seed).entropy)


def spawn(seed: SeedLike, count: int) -> list[np.random.SeedSequence]:
    """``count`` new children of ``seed`` (``SeedSequence.spawn``: a second call gives the next ``count``)."""
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, numbers.Integral) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    return as_seed_sequence(seed).spawn(int(count))


def generators(seed: SeedLike, count: int) -> list[np.random.Generator]:
    """``count`` independent generators, one per new child of ``seed`` (:func:`spawn`)."""
    return [np.random.default_rng(c) for c in spawn(seed, count)]


def kernel_seed(seed: SeedLike) -> int:
    """A seed in [0, 2³²) for a numba kernel's generator (``np.random.seed`` inside ``@njit``).

    It is the low 32 bits of the first 64-bit word of the SeedSequence's state, shifted right by one: the value
    numba has always used from earlier 63-bit seeds (it kept their low 32 bits), now computed here so that it is
    valid as given, also for numpy's legacy generator under ``NUMBA_DISABLE_JIT=1``.
    """
    word = as_seed_sequence(seed).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1)
    return int(word) & (KERNEL_SEED_LIMIT - 1)


def generator_state(seed: SeedLike) -> np.ndarray:
    """The 256-bit state (``uint64[4]``) of a kernel's xoshiro256+ generator (``dynamics/sampling.py``): four words of
    the SeedSequence's state. An all-zero state would repeat zeros for ever; SeedSequence's hash makes it
    unreachable in practice, and it is refused here rather than assumed away."""
    state = as_seed_sequence(seed).generate_state(4, dtype=np.uint64)
    if not state.any():
        raise ValueError("seed gives the all-zero generator state; choose another seed")
    return state


def to_record(seed: SeedLike) -> dict:
    """A JSON-ready record of a SeedSequence (its entropy and spawn key), from which :func:`from_record` rebuilds it."""
    seed = as_seed_sequence(seed)
    entropy = seed.entropy
    return dict(entropy=[int(e) for e in entropy] if isinstance(entropy, (list, tuple, np.ndarray)) else int(entropy),
                spawn_key=[int(k) for k in seed.spawn_key])


def from_record(record: dict) -> np.random.SeedSequence:
    """The SeedSequence of a :func:`to_record` record; a malformed record is a ``ValueError``."""
    try:
        entropy, spawn_key = record["entropy"], record["spawn_key"]
        if isinstance(entropy, list):
            entropy = [int(e) for e in entropy]
        return np.random.SeedSequence(entropy, spawn_key=tuple(int(k) for k in spawn_key))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a seed record: {record!r} ({error})") from None
