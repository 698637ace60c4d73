"""raftps.torch modules train like torch's own: the same gradients, and the
nodes' SGD gives the weights torch's SGD gives, to float32 rounding."""

import numpy as np
import pytest
import torch

import raftps
import raftps.torch as rt

DIM, LR = 8, 0.5
EPS = np.finfo(np.float32).eps


def assert_float32_close(have, want, scale):
    """have and want agree to float32 rounding of a computation whose terms
    are as large as scale (elementwise): a few ulps of it. The gradients'
    sums may be added in another order here than in torch, so a bitwise
    match is not the promise; a push lost, doubled or sent to the wrong
    key is off by a whole update, far above this."""
    err = np.abs(have - want)
    tol = 8 * EPS * scale
    assert (err <= tol).all(), f"off by {err.max():g} where rounding allows {tol[err > tol].min():g}"


def make_table(client, name):
    client.create_table(name, DIM, optimizer=f"sgd:lr={LR}", initializer="uniform:0.5", seed=11, shards=4)


def batch(rng, n_bags=32, vocab=40):
    """Bags of keys over a small vocabulary (so keys repeat within and
    across bags), some empty; the keys are big int64s of both signs."""
    lens = rng.integers(0, 6, size=n_bags)
    ids = rng.integers(0, vocab, size=int(lens.sum()))
    offsets = np.r_[0, np.cumsum(lens)[:-1]]
    return ids, offsets


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch_with_sgd(client, table_name, mode):
    make_table(client, table_name)
    rng = np.random.default_rng(5)
    vocab = 40
    id_keys = (rng.integers(-2**62, 2**62, size=vocab)).astype(np.int64)  # id -> key
    emb = rt.EmbeddingBag(client, table_name, DIM, mode=mode)
    assert list(emb.parameters()) == []
    w0 = client.pull(table_name, id_keys)
    ref = torch.nn.EmbeddingBag(vocab, DIM, mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w0))
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    target = torch.from_numpy(rng.standard_normal((32, DIM)).astype(np.float32))
    scale = np.abs(w0).copy()
    for step in range(3):
        ids, offsets = batch(rng)
        ids_t, off_t = torch.from_numpy(ids), torch.from_numpy(offsets)
        opt.zero_grad()
        ((ref(ids_t, off_t) - target) ** 2).sum().backward()
        scale += np.abs(LR * ref.weight.grad.numpy())
        opt.step()
        out = emb(torch.from_numpy(id_keys[ids]), off_t)
        ((out - target) ** 2).sum().backward()
        have = client.pull(table_name, id_keys, consistency="linearizable")
        assert_float32_close(have, ref.weight.detach().numpy(), scale)
    # The weights did move (the test compares trained rows, not initial ones).
    assert np.abs(have - w0).max() > 0.1


def test_embedding_matches_torch_and_pulls_once_per_batch(client, table_name):
    make_table(client, table_name)
    rng = np.random.default_rng(6)
    keys = np.arange(1000, 1030, dtype=np.int64)
    emb = rt.Embedding(client, table_name)
    ref = torch.nn.Embedding(30, DIM)
    w0 = client.pull(table_name, keys)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w0))
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    calls = []
    real_pull = client.pull
    client.pull = lambda *a, **kw: calls.append(len(a[1])) or real_pull(*a, **kw)
    try:
        idx = torch.from_numpy(rng.integers(0, 30, size=(16, 5)))
        opt.zero_grad()
        ref(idx).pow(3).sum().backward()
        scale = np.abs(w0) + np.abs(LR * ref.weight.grad.numpy())
        opt.step()
        out = emb(torch.from_numpy(keys)[idx])
        assert out.shape == (16, 5, DIM)
        out.pow(3).sum().backward()
    finally:
        client.pull = real_pull
    # One pull for the batch, of its distinct keys.
    assert calls == [len(np.unique(idx.numpy()))]
    assert_float32_close(client.pull(table_name, keys), ref.weight.detach().numpy(), scale)


def test_eval_mode_pushes_nothing(client, table_name):
    make_table(client, table_name)
    emb = rt.EmbeddingBag(client, table_name, mode="sum").eval()
    keys = torch.tensor([[1, 2, 3]])
    before = client.pull(table_name, keys.numpy().ravel())
    out = emb(keys)
    assert not out.requires_grad
    np.testing.assert_array_equal(out.numpy()[0], before.sum(axis=0))


def test_wrong_dim_is_refused(client, table_name):
    make_table(client, table_name)
    with pytest.raises(raftps.DimMismatchError):
        rt.EmbeddingBag(client, table_name, DIM + 1)
