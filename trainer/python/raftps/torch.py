"""PyTorch modules whose embedding weights live in a raftps table.

    emb = raftps.torch.EmbeddingBag(client, "ads", dim=16, mode="sum",
                                    create=True, optimizer="adagrad:lr=0.1")
    out = emb(keys, offsets)      # pulls the batch's distinct keys, once
    loss.backward()               # pushes their gradient rows, once

Forward pulls the distinct keys of the batch in one call and computes the
bags (or lookups) with torch's own embedding_bag (embedding) on those rows.
Backward gives the rows' gradient, summed over every use in the batch, to
Client.push: the table's optimizer on the nodes applies it, exactly once.
The module has no parameters: a dense optimizer (and DistributedDataParallel,
which allreduces dense gradients) never sees the sparse weights, so several
trainer processes need no allreduce for them; each pushes its own gradient.

With N trainers that each average their loss over their own batch, and DDP
averaging the dense gradients, give grad_scale=1/N so the sparse step
matches the dense one (the gradient of the mean over all N batches).

Keys are int64 tensors (torch has no uint64): a key's bits are its uint64
key, as Go's uint64(int64) conversion gives.
"""

import numpy as np
import torch
import torch.nn.functional as F

from raftps import errors


class _RaftpsEmbedding(torch.nn.Module):
    def __init__(self, client, table, dim=None, *, create=False, grad_scale=1.0, consistency=None, **table_options):
        super().__init__()
        self.client, self.table = client, table
        self.grad_scale = float(grad_scale)
        self.consistency = consistency
        if create:
            if dim is None:
                raise ValueError("raftps.torch: create=True needs dim")
            try:
                client.create_table(table, dim, **table_options)
            except errors.TableExistsError:
                pass
        self.dim = client.describe_table(table).spec.dim
        if dim is not None and dim != self.dim:
            raise errors.DimMismatchError(f"raftps.torch: table {table!r} has dim {self.dim}, the module was given {dim}",
                                          reason="DIM_MISMATCH")

    def _rows(self, keys):
        """The rows of the distinct keys of keys (a tensor), as a tensor
        whose gradient is pushed, and each key's row index (keys' shape)."""
        k = keys.detach().cpu().numpy().astype(np.int64, copy=False)
        uniq, inverse = np.unique(k, return_inverse=True)
        rows = torch.from_numpy(self.client.pull(self.table, uniq, consistency=self.consistency))
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            rows.register_hook(lambda g: self._push(uniq, g))
        idx = torch.from_numpy(inverse.reshape(k.shape)).to(keys.device)
        return rows.to(keys.device), idx

    def _push(self, uniq, grad):
        g = grad.detach().to("cpu", torch.float32).numpy()
        if self.grad_scale != 1.0:
            g = g * np.float32(self.grad_scale)
        self.client.push(self.table, uniq, g)

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}"


class Embedding(_RaftpsEmbedding):
    """torch.nn.Embedding with its weight in a raftps table: input is a
    tensor of int64 keys of any shape; the output adds a last dimension dim."""

    def forward(self, input):
        rows, idx = self._rows(input)
        return F.embedding(idx, rows)


class EmbeddingBag(_RaftpsEmbedding):
    """torch.nn.EmbeddingBag with its weight in a raftps table: bags of keys
    given as a 1-d input with offsets, or a 2-d input of equal bags; mode
    "sum", "mean" or "max"; optional per_sample_weights (mode "sum")."""

    def __init__(self, client, table, dim=None, mode="mean", **kw):
        super().__init__(client, table, dim, **kw)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"raftps.torch: mode {mode!r}: want sum, mean or max")
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, idx = self._rows(input)
        return F.embedding_bag(idx, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def extra_repr(self):
        return super().extra_repr() + f", mode={self.mode!r}"
