import subprocess
import sys

import numpy as np
import torch

import gradwire.data
from gradwire.data import digits, digits_arrays, shard_indices, stdlib_source, text


def test_stdlib_text_is_the_same_bytes_every_time_and_honours_the_budget():
    a, b = stdlib_source(10_000), stdlib_source(10_000)
    assert a == b and len(a) == 10_000
    assert stdlib_source(20_000).startswith(a)


def test_text_windows_predict_the_next_symbol_and_split_by_position():
    train, test, vocab = text(seq_len=16, budget=50_000)
    assert vocab == bytes(sorted(set(stdlib_source(50_000))))
    assert train.x.shape[1] == 16 and train.y.shape == train.x.shape
    assert torch.equal(train.x[:, 1:], train.y[:, :-1])
    # Windows do not overlap: each starts where the one before ended.
    assert torch.equal(train.x[1:, 0], train.y[:-1, -1])
    assert 0 <= int(train.x.min()) and int(train.x.max()) < len(vocab)
    raw = stdlib_source(50_000)
    decoded = bytes(vocab[i] for i in train.x[0].tolist())
    assert raw.startswith(decoded)
    # The test text comes after all of the training text.
    first_test = bytes(vocab[i] for i in test.x[0].tolist())
    cut = int(len(raw) * 0.9)
    assert raw.find(first_test, cut) == cut
    assert len(train) == (cut - 1) // 16 and len(test) == (len(raw) - cut - 1) // 16


def test_text_is_deterministic():
    (a, ta, va), (b, tb, vb) = text(budget=30_000), text(budget=30_000)
    assert va == vb and torch.equal(a.x, b.x) and torch.equal(ta.y, tb.y)


def test_digits_split_depends_on_the_seed_only():
    (a, _), (b, _), (c, _) = digits(0), digits(0), digits(1)
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x)
    assert len(a) == 1797 - int(1797 * 0.2)


def test_shards_are_disjoint_equal_and_change_each_epoch():
    parts = [shard_indices(103, r, 4, epoch=2, seed=5) for r in range(4)]
    assert len({len(p) for p in parts}) == 1
    assert len(set(torch.cat(parts).tolist())) == 4 * len(parts[0])
    assert not torch.equal(parts[0], shard_indices(103, 0, 4, epoch=3, seed=5))


def test_digits_are_scikit_learns_exactly_with_or_without_its_file(monkeypatch):
    """Read from the file inside the installed package, and, where that is not found, from
    scikit-learn's own loader: the same pixels and labels either way."""
    from sklearn.datasets import load_digits

    want = load_digits()
    fast = digits_arrays()
    monkeypatch.setattr(gradwire.data.importlib.util, "find_spec", lambda name: None)
    slow = digits_arrays()
    for pixels, labels in (fast, slow):
        assert np.array_equal(pixels, want.data) and pixels.dtype == want.data.dtype
        assert np.array_equal(labels, want.target) and labels.shape == (1797,)


def test_digits_load_without_importing_scikit_learns_datasets():
    """The installed scikit-learn's file is found: a rank never pays sklearn.datasets'
    import."""
    code = ("import sys; from gradwire.data import digits; digits(); "
            "sys.exit('sklearn.datasets' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
