"""The min-cut's max flow (OR-Tools) gives the cut networkx gives, ties included."""

import random

import networkx as nx
import pytest

from remat_opt.solvers.blocks import choose_ties
from remat_opt.solvers.mincut import SINK, SOURCE, _sink_side, build_cut_graph, cut_node, mincut_units, weight_grid
from synthetic import random_problem


def _random_network(seed: int) -> nx.DiGraph:
    """A random network with many equal and zero capacities (several minimum cuts) and some
    infinite edges (no capacity)."""
    rng = random.Random(seed)
    g = nx.DiGraph()
    nodes = [SOURCE, SINK, *range(12)]
    g.add_nodes_from(nodes)
    for _ in range(40):
        u, v = rng.sample(nodes, 2)
        if u == SINK or v == SOURCE:
            continue
        if rng.random() < 0.15:
            g.add_edge(u, v, reason=f"{u} needs {v}")
        else:
            g.add_edge(u, v, capacity=rng.choice((0, 1, 1, 2, 3, 10**12)))
    return g


@pytest.mark.parametrize("seed", range(30))
def test_sink_side_is_networkx_minimum_cut_sink_side(seed):
    g = _random_network(seed)
    try:
        _, (_, expected) = nx.minimum_cut(g, SOURCE, SINK)
    except nx.NetworkXUnbounded:
        with pytest.raises(ValueError, match="infinite path joins source and sink"):
            _sink_side(g)
        return
    assert _sink_side(g) == expected


@pytest.mark.parametrize("seed", range(12))
def test_mincut_units_are_networkx_cuts_at_every_weight(seed):
    problem = random_problem(seed)
    ties = choose_ties(problem, False)
    for weight in weight_grid(problem, 6):
        g = build_cut_graph(problem, weight, ties)
        _, (_, sink_side) = nx.minimum_cut(g, SOURCE, SINK)
        expected = tuple(u for u in problem.allowed_units if cut_node(u) in sink_side)
        assert mincut_units(problem, weight, ties) == expected
