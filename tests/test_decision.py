"""The torch-free decision on columns a caller builds: distinct bytes, determinism, odd input."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from flare_l2evict._decision import RegionChoice, Storages, choose_regions

WORD = 4


def test_equal_names_tie_break_on_the_address_in_any_order() -> None:
    a = choose_regions(Storages(["w", "w"], [64, 64], [0, 128]), 64)
    b = choose_regions(Storages(["w", "w"], [64, 64], [128, 0]), 64)
    assert a.regions[0].pieces[0].owner == 0 and b.regions[0].pieces[0].owner == 1  # address 0


def test_negative_sizes_do_not_hide_real_bytes() -> None:
    got = choose_regions(Storages(["a", "b"], [-100, 100], [0, 0]), 64)
    assert got.shortfall is None and got.read_bytes == 64


storages = st.lists(
    st.tuples(st.integers(0, 64).map(lambda k: k * WORD), st.integers(0, 96)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(ranges=storages, window_words=st.integers(1, 48), seed=st.integers(0, 1000))
def test_pieces_are_inside_their_storage_distinct_and_the_same_in_any_order(
    ranges: list[tuple[int, int]], window_words: int, seed: int
) -> None:
    names = [f"t{i:02d}" for i in range(len(ranges))]
    starts = [start for start, _ in ranges]
    sizes = [size for _, size in ranges]
    window = window_words * WORD
    got = choose_regions(Storages(names, sizes, starts), window)
    covered: set[int] = set()
    for source in got.regions:
        for piece in source.pieces:
            assert 0 <= piece.offset and piece.offset + piece.nbytes <= sizes[piece.owner]
            address = starts[piece.owner] + piece.offset
            assert address % WORD == 0 and piece.nbytes % WORD == 0
            span = set(range(address, address + piece.nbytes))
            assert not span & covered  # each byte read at most once
            covered |= span
    assert (got.shortfall is None) == (got.read_bytes >= window)
    if got.shortfall is None:
        assert got.read_bytes == len(covered) == window
    order = list(range(len(ranges)))
    random.Random(seed).shuffle(order)
    again = choose_regions(
        Storages([names[i] for i in order], [sizes[i] for i in order], [starts[i] for i in order]),
        window,
    )

    def read(choice: RegionChoice, owners: list[int]) -> list[tuple[int, int]]:
        return sorted(
            (starts[owners[p.owner]] + p.offset, p.nbytes) for s in choice.regions for p in s.pieces
        )

    assert read(got, list(range(len(ranges)))) == read(again, order)
