"""The int handles that name graphs and CSRs for hector's custom ops
(:mod:`hector.kernels.handles`): one per live object, a copy gets its own, and a freed
object's entry goes with it (mini-batch training makes a graph per batch)."""
import copy
import gc

import pytest
import torch

from hector.kernels.handles import HandleTable


class Thing:
    pass


def test_handle_is_memoised_and_names_its_object():
    table = HandleTable("_h", "thing")
    a, b = Thing(), Thing()
    ha, hb = table.handle(a), table.handle(b)
    assert ha != hb and table.handle(a) == ha
    assert table.get(ha) is a and table.get(hb) is b


def test_a_copy_gets_its_own_handle():
    table = HandleTable("_h", "thing")
    a = Thing()
    h = table.handle(a)
    twin = copy.deepcopy(a)                       # carries a copy of the mark
    assert twin._h == a._h
    assert table.handle(twin) != h and table.get(table.handle(twin)) is twin
    assert table.handle(a) == h


def test_a_freed_objects_entry_goes_and_its_handle_is_refused():
    table = HandleTable("_h", "thing")
    keep = Thing()
    table.handle(keep)
    handles = [table.handle(Thing()) for _ in range(50)]    # each freed at once
    gc.collect()
    assert len(table) == 1
    with pytest.raises(RuntimeError, match="unknown or its thing was freed"):
        table.get(handles[0])
    assert len(set(handles)) == 50                # never reused


def test_under_compile_the_mark_is_read_as_it_is(monkeypatch):
    """Traced code cannot call the weak table: the mark is trusted (dynamo guards on it)."""
    table = HandleTable("_h", "thing")
    a = Thing()
    h = table.handle(a)
    twin = copy.deepcopy(a)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert table.handle(twin) == h


def test_graph_to_another_device_does_not_copy_the_mark():
    """A Graph's copy on another device (here ``meta``: a CPU machine has no second device)
    is named by a handle of its own, not its original's."""
    from hector.graph import Graph
    from hector.kernels.attention.custom_ops import _graph, graph_handle
    g = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    h = graph_handle(g)
    other = g.to("meta")
    assert "_attention_op_handle" not in other.__dict__
    assert graph_handle(other) != h and _graph(graph_handle(other)) is other
