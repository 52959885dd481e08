"""The corpus split, fingerprint, idempotent prepare and batching, on real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoloop.data import CorpusSpec, DataError, Dataset, prepare, split_of


def write_corpus(root: Path, n_files: int = 60, size: int = 3000) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        body = "".join(f"def f_{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(size // 40))
        (root / f"mod_{i:03d}.py").write_text(body)
    return root


def small_spec(source) -> CorpusSpec:
    return CorpusSpec(source=str(source), val_bytes=2000, audit_bytes=500)


def test_split_is_a_function_of_the_path_alone():
    keys = [f"pkg/mod_{i}.py" for i in range(2000)]
    first = [split_of(k) for k in keys]
    assert first == [split_of(k) for k in reversed(keys)][::-1]
    counts = {s: first.count(s) for s in ("train", "val", "audit")}
    # Fractions near 85/10/5 % show the hash spreads keys; exact values are fixed by the salt.
    assert 1550 < counts["train"] < 1850 and 120 < counts["val"] < 280 and 50 < counts["audit"] < 160


def test_prepare_is_deterministic_and_idempotent(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    a = prepare(small_spec(corpus), tmp_path / "a")
    b = prepare(small_spec(corpus), tmp_path / "b")
    assert a.built and b.built
    assert a.meta["fingerprint"] == b.meta["fingerprint"]
    for split in ("train", "val", "audit"):
        assert (tmp_path / "a" / f"{split}.bin").read_bytes() == (tmp_path / "b" / f"{split}.bin").read_bytes()
    mtime = (tmp_path / "a" / "train.bin").stat().st_mtime_ns
    again = prepare(small_spec(corpus), tmp_path / "a")
    assert not again.built
    assert (tmp_path / "a" / "train.bin").stat().st_mtime_ns == mtime
    assert len((tmp_path / "a" / "val.bin").read_bytes()) == 2000


def test_adding_a_file_moves_only_that_file(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    before = {p.name: split_of(p.name) for p in corpus.iterdir()}
    (corpus / "zz_new.py").write_text("print('new')\n" * 50)
    after = {p.name: split_of(p.name) for p in corpus.iterdir()}
    assert all(after[name] == split for name, split in before.items())


def test_fingerprint_changes_with_validation_or_training_bytes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    base = prepare(small_spec(corpus), tmp_path / "d").meta
    val_file = next(p for p in sorted(corpus.iterdir()) if split_of(p.name) == "val")
    train_file = next(p for p in sorted(corpus.iterdir()) if split_of(p.name) == "train")

    original = val_file.read_text()
    val_file.write_text("# changed\n" + original[10:])
    changed_val = prepare(small_spec(corpus), tmp_path / "d").meta
    assert changed_val["fingerprint"] != base["fingerprint"]
    val_file.write_text(original)

    train_file.write_text(train_file.read_text() + "\n# one more line\n")
    changed_train = prepare(small_spec(corpus), tmp_path / "d").meta
    assert changed_train["fingerprint"] not in (base["fingerprint"], changed_val["fingerprint"])


def test_default_stdlib_corpus_excludes_tests_and_site_packages(tiny_data_dir):
    meta = Dataset(tiny_data_dir).meta
    assert meta["source"] == "stdlib"
    assert meta["splits"]["train"]["bytes"] > 1_000_000
    units = [line.split("\t")[2] for line in (tiny_data_dir / "manifest.tsv").read_text().splitlines()[1:]]
    assert any(u.startswith("asyncio/") for u in units)
    assert not any(u.startswith(("test/", "site-packages/")) or "/tests/" in u for u in units)


def test_batches_are_shifted_windows(tiny_data_dir):
    ds = Dataset(tiny_data_dir)
    x, y = next(ds.batches(batch_size=4, seq_len=32, seed=1))
    assert x.shape == y.shape == (4, 32)
    assert str(x.dtype) == "torch.int64"
    assert (x[:, 1:] == y[:, :-1]).all()
    x2, _ = next(ds.batches(batch_size=4, seq_len=32, seed=1))
    assert (x == x2).all()
    train = np.asarray(ds.split("train"))
    row = x[0].numpy().astype(np.uint8).tobytes()
    assert bytes(train).find(row) >= 0


def test_glob_and_single_file_sources(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    info = prepare(small_spec(str(corpus) + "/*.py"), tmp_path / "g")
    assert info.meta["splits"]["train"]["files"] > 0
    big = tmp_path / "one.txt"
    big.write_text("".join(f"line {i} of a long single-file corpus\n" for i in range(40000)))
    single = prepare(CorpusSpec(str(big), val_bytes=5000, audit_bytes=1000), tmp_path / "s")
    assert single.meta["splits"]["val"]["bytes"] == 5000


def test_prepare_refuses_to_overwrite_a_folder_it_did_not_build(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare(small_spec(corpus), precious)
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("make", ["missing", "empty_dir", "empty_file", "too_small"])
def test_bad_corpus_is_one_clear_line(tmp_path, make):
    source = tmp_path / "corpus"
    if make == "empty_dir":
        source.mkdir()
    elif make == "empty_file":
        source.write_text("")
    elif make == "too_small":
        source.write_text("tiny\n")
    proc = subprocess.run(
        [sys.executable, "-m", "autoloop.cli", "prepare", "--corpus", str(source), "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoloop: ")
    assert "Traceback" not in proc.stderr
    assert str(source) in lines[0]


def test_prepare_cli_prints_what_it_built(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    cmd = [sys.executable, "-m", "autoloop.cli", "prepare", "--corpus", str(corpus), "--data-dir",
           str(tmp_path / "d"), "--val-bytes", "2000", "--audit-bytes", "500"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    second = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert first.startswith("built:") and second.startswith("already prepared:")
    fp = [line for line in first.splitlines() if line.startswith("fingerprint:")]
    assert fp and fp[0] in second


def test_ensure_prepared_uses_what_is_there_and_refuses_another_source(tmp_path):
    from autoloop.data import ensure_prepared

    corpus = write_corpus(tmp_path / "corpus")
    built = prepare(small_spec(corpus), tmp_path / "d")
    # Same source with default sizes: the prepared (smaller) dataset is used as it is.
    again = ensure_prepared(CorpusSpec(str(corpus)), tmp_path / "d")
    assert not again.built and again.meta["fingerprint"] == built.meta["fingerprint"]
    with pytest.raises(DataError, match="holds the corpus"):
        ensure_prepared(CorpusSpec("stdlib"), tmp_path / "d")
