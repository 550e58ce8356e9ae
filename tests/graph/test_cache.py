"""The Graph cache behind layers called with a raw edge_index: edits that do
not bump a tensor's version counter must not return the Graph of the old edges."""
import numpy as np
import pytest
import torch

import hector.nn
from hector.graph import cache, graph_of


def _edits():
    """(name, make tensor, edit in place without a version bump)."""
    def numpy_backed(values):
        arr = np.array(values, dtype=np.int64)
        return torch.from_numpy(arr), lambda t, i, v: arr.__setitem__(i, v)

    def via_data(values):
        t = torch.tensor(values, dtype=torch.int64)
        return t, lambda tt, i, v: tt.data.__setitem__(i, v)
    return {"numpy": numpy_backed, "data": via_data}


def _graph_edges(n=12, e=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g).tolist()


@pytest.mark.parametrize("edit", ["numpy", "data"])
def test_gat_after_silent_edit_equals_fresh(edit):
    torch.manual_seed(0)
    layer = hector.nn.GATConv(8, 4, heads=2, backend="torch")
    x = torch.randn(12, 8)
    ei, write = _edits()[edit](_graph_edges())
    before = layer(x, ei)
    version = ei._version
    write(ei, (1, slice(None)), (ei[1] + 5) % 12)   # every destination moves
    assert ei._version == version                   # the edit is invisible to the key
    got = layer(x, ei)
    fresh = layer(x, ei.clone())
    assert not torch.allclose(before, fresh)        # the edit matters
    torch.testing.assert_close(got, fresh, rtol=0, atol=0)


@pytest.mark.parametrize("edit", ["numpy", "data"])
def test_rgcn_after_silent_edit_equals_fresh(edit):
    torch.manual_seed(0)
    layer = hector.nn.RGCNConv(8, 4, 3, backend="torch")
    x = torch.randn(12, 8)
    ei = torch.tensor(_graph_edges())
    et, write = _edits()[edit](torch.randint(0, 3, (40,)).tolist())
    before = layer(x, ei, et)
    write(et, slice(None), (et + 1) % 3)            # every edge changes relation
    got = layer(x, ei, et)
    fresh = layer(x, ei, et.clone())
    assert not torch.allclose(before, fresh)
    torch.testing.assert_close(got, fresh, rtol=0, atol=0)


def test_unchanged_tensor_still_hits():
    ei = torch.tensor(_graph_edges())
    assert graph_of(ei) is graph_of(ei)


def test_verify_mode_env(monkeypatch):
    ei = torch.tensor(_graph_edges())
    graph_of(ei)
    monkeypatch.setenv(cache.ENV_VERIFY, "sometimes")
    with pytest.raises(ValueError, match="HECTOR_GRAPH_CACHE_VERIFY must be"):
        graph_of(ei)
    # 'cpu' still checks CPU tensors: the silent edit is caught.
    monkeypatch.setenv(cache.ENV_VERIFY, "cpu")
    first = graph_of(ei)
    ei.data[0, 0] = (ei[0, 0] + 1) % 12
    assert graph_of(ei) is not first


@pytest.mark.parametrize("edit", ["numpy", "data"])
def test_hgt_after_silent_edit_equals_fresh(edit):
    """HGT builds its hetero Graph through the same verified cache."""
    torch.manual_seed(0)
    meta = (["a", "b"], [("a", "r", "b"), ("b", "s", "a")])
    layer = hector.nn.HGTConv(8, 8, meta, heads=2, backend="torch")
    xs = {"a": torch.randn(12, 8), "b": torch.randn(12, 8)}
    ei, write = _edits()[edit](_graph_edges())
    other = torch.tensor(_graph_edges(seed=1))
    before = layer(xs, {("a", "r", "b"): ei, ("b", "s", "a"): other})["b"]
    write(ei, (1, slice(None)), (ei[1] + 5) % 12)
    got = layer(xs, {("a", "r", "b"): ei, ("b", "s", "a"): other})["b"]
    fresh = layer(xs, {("a", "r", "b"): ei.clone(), ("b", "s", "a"): other})["b"]
    assert not torch.allclose(before, fresh)
    torch.testing.assert_close(got, fresh)


@pytest.mark.parametrize("edit", ["numpy", "data"])
def test_featureless_rgcn_norm_after_silent_edit_equals_fresh(edit):
    """hector train's one-hot RGCN layer caches its per-(dst, relation) normalisation."""
    from hector.train.models import FeaturelessRGCN
    torch.manual_seed(0)
    layer = FeaturelessRGCN(12, 4, 3, None)
    ei, write = _edits()[edit](_graph_edges())
    et = torch.randint(0, 3, (ei.shape[1],), generator=torch.Generator().manual_seed(2))
    before = layer(ei, et)
    write(ei, (1, slice(None)), (ei[1] + 5) % 12)
    got, fresh = layer(ei, et), layer(ei.clone(), et)
    assert not torch.allclose(before, fresh)
    torch.testing.assert_close(got, fresh)
