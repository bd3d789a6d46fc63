"""The seeding module: every derivation is reproducible, refuses what cannot be reproduced, and keeps a
SeedSequence intact."""
import zlib

import numpy as np
import pytest

from attnflow import seeding


@pytest.mark.parametrize("bad", [None, -1, 1.5, True, "3", np.float64(2.0)])
def test_seeds_must_be_explicit_non_negative_integers(bad):
    with pytest.raises(ValueError, match="seed"):
        seeding.as_seed_sequence(bad)


def test_a_seed_sequence_travels_as_itself():
    ss = np.random.SeedSequence(7, spawn_key=(3,))
    assert seeding.as_seed_sequence(ss) is ss


def test_child_is_the_spawned_child_without_spawning():
    parent = np.random.SeedSequence(11)
    expected = np.random.SeedSequence(11).spawn(4)[3]
    assert seeding.child(parent, 3).generate_state(4).tolist() == expected.generate_state(4).tolist()
    assert parent.n_children_spawned == 0


def test_named_child_is_the_claim_seed_of_earlier_versions():
    old = np.random.SeedSequence(entropy=5, spawn_key=(zlib.crc32(b"scb.slow_mode"),))
    assert seeding.named(5, "scb.slow_mode").generate_state(4).tolist() == old.generate_state(4).tolist()


def test_instance_seed_drops_the_derivations():
    run = np.random.SeedSequence(9)
    assert (seeding.instance(seeding.named(seeding.child(run, 2), "x")).generate_state(2).tolist()
            == np.random.SeedSequence(9).generate_state(2).tolist())


def test_spawn_hands_out_new_children_each_call():
    ss = np.random.SeedSequence(4)
    first, second = seeding.spawn(ss, 2), seeding.spawn(ss, 2)
    states = {tuple(c.generate_state(2)) for c in first + second}
    assert len(states) == 4
    assert [g.normal() for g in seeding.generators(4, 3)] == [g.normal() for g in seeding.generators(4, 3)]


def test_kernel_seeds_fit_numba_and_keep_earlier_streams():
    for s in (0, 1, 2**32, 2**40 + 5):
        word = np.random.SeedSequence(s).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1)
        value = seeding.kernel_seed(s)
        assert 0 <= value < seeding.KERNEL_SEED_LIMIT
        assert value == int(word) % 2**32  # what numba kept of the old 63-bit seed
    assert seeding.kernel_seed(1) != seeding.kernel_seed(1 + 2**32)
    np.random.seed(seeding.kernel_seed(2**40 + 5))  # valid for numpy's legacy generator (NUMBA_DISABLE_JIT)


def test_records_round_trip_and_refuse_garbage():
    ss = seeding.child(seeding.named(3, "a"), 5)
    back = seeding.from_record(seeding.to_record(ss))
    assert back.generate_state(4).tolist() == ss.generate_state(4).tolist()
    with pytest.raises(ValueError, match="not a seed record"):
        seeding.from_record({"entropy": "x"})
