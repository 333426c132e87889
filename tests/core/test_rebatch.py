"""`remat_opt.core.rebatch`: graphs at any micro-batch from two traced ones (pure; the traced
check against a direct trace is in tests/analysis/test_fit.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from remat_opt.core.rebatch import RebatchError, rebatch
from synthetic import chain_graph


def _at(batch: int):
    """A chain whose every tensor has 128 elements per sequence of the micro-batch."""
    return chain_graph(3, numel=128 * batch)


@pytest.mark.parametrize("batch", [1, 4, 5, 8])
def test_sizes_on_the_line_through_two_graphs_equal_the_graph_built_at_that_size(batch):
    made = rebatch((2, _at(2)), (3, _at(3)), batch)
    expected = _at(batch)
    assert made.tensors == expected.tensors and made.ops == expected.ops
    assert made.saved == expected.saved and "linear in the batch" in made.notes[-1]


def test_the_traced_sizes_come_back_unchanged():
    low, high = _at(2), _at(3)
    assert rebatch((2, low), (3, high), 2) is low and rebatch((2, low), (3, high), 3) is high


def test_a_different_op_is_refused_with_its_name():
    high = _at(3)
    ops = list(high.ops)
    ops[0] = replace(ops[0], symbol="add")
    with pytest.raises(RebatchError, match=r"op fwd0 \(mul\) differs beyond its sizes between micro-batch 2 and 3"):
        rebatch((2, _at(2)), (3, replace(high, ops=tuple(ops))), 4)


def test_a_size_off_the_line_is_refused():
    # 256 elements at micro-batch 2 and 257 at 4: 256.5 at 3 is no size
    with pytest.raises(RebatchError, match="are not on a line through micro-batch 3"):
        rebatch((2, chain_graph(3, numel=256)), (4, chain_graph(3, numel=257)), 3)


def test_a_different_tensor_set_is_refused():
    with pytest.raises(RebatchError, match="different ops or tensors"):
        rebatch((2, chain_graph(3, numel=256)), (3, chain_graph(4, numel=384)), 4)


@pytest.mark.parametrize("points", [((3, 2), 4), ((0, 1), 2), ((2, 3), 0)])
def test_micro_batches_must_be_positive_and_ordered(points):
    (low, high), batch = points
    with pytest.raises(ValueError, match="positive integers with low < high"):
        rebatch((low, _at(2)), (high, _at(3)), batch)
