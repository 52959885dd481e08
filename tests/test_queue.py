"""QueueProposer: patch files and whole-file replacements, with patches made by real git."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.git import git, init_repo

from autoloop.proposers.base import FixContext, ProposalFailed, ProposalRequest
from autoloop.proposers.queue import QueueProposer, description_from_name, description_from_patch

TRAIN = "lr = 0.1\nsteps = 10\nwidth = 64\nprint('train')\n"


@pytest.fixture
def repo(tmp_path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": TRAIN})


@pytest.fixture
def queue(tmp_path) -> Path:
    q = tmp_path / "queue"
    q.mkdir()
    return q


def request(repo: Path, fix: FixContext | None = None) -> ProposalRequest:
    return ProposalRequest(
        workspace=repo, target="train.py", program_text="", metric_name="val_bpb", direction="min",
        parent_metric=None, parent=None, trial=1, attempt=1, seed=42, fix=fix,
    )


def make_patch(repo: Path, new_text: str, *args: str) -> str:
    """Real `git diff` output for train.py -> new_text; the work tree is restored afterwards."""
    path = repo / "train.py"
    old = path.read_text()
    path.write_text(new_text)
    diff = git(repo, "diff", *args, "--", "train.py") + "\n"
    path.write_text(old)
    return diff


def test_patch_applies_with_description_from_header(repo, queue):
    diff = make_patch(repo, TRAIN.replace("lr = 0.1", "lr = 0.3"))
    (queue / "001_x.patch").write_text("Raise the learning rate to 0.3\n\n" + diff)
    proposal = QueueProposer(queue).propose(request(repo))
    assert proposal.description == "Raise the learning rate to 0.3"
    assert proposal.source == "001_x.patch"
    assert (repo / "train.py").read_text() == TRAIN.replace("lr = 0.1", "lr = 0.3")
    assert not (queue / "001_x.patch").exists()
    assert (queue / "done" / "001_x.patch").exists()


def test_format_patch_subject(repo, queue):
    (repo / "train.py").write_text(TRAIN.replace("steps = 10", "steps = 20"))
    git(repo, "commit", "-qam", "Double the steps\n\nLonger training at the same budget.")
    out = git(repo, "format-patch", "-1", "--stdout")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    (queue / "010.patch").write_text(out + "\n")
    proposal = QueueProposer(queue).propose(request(repo))
    assert proposal.description == "Double the steps"
    assert "steps = 20" in (repo / "train.py").read_text()


def test_description_from_filename(repo, queue):
    (queue / "003_raise_lr.patch").write_text(make_patch(repo, TRAIN.replace("lr = 0.1", "lr = 0.2")))
    proposal = QueueProposer(queue).propose(request(repo))
    assert proposal.description == "raise lr"
    assert "lr = 0.2" in (repo / "train.py").read_text()


@pytest.mark.parametrize("name, expected", [
    ("003_raise_lr.patch", "raise lr"),
    ("12-wider-mlp.diff", "wider mlp"),
    ("007.patch", "007"),
    ("swap_act.py", "swap act"),
])
def test_description_from_name(name, expected):
    assert description_from_name(name) == expected


def test_no_prefix_and_plain_diff_u(repo, queue, tmp_path):
    (queue / "1.diff").write_text(make_patch(repo, TRAIN.replace("width = 64", "width = 96"), "--no-prefix"))
    qp = QueueProposer(queue)
    qp.propose(request(repo))
    assert "width = 96" in (repo / "train.py").read_text()
    git(repo, "checkout", "-q", "train.py")

    # `diff -u old new` names the files without a/ b/.
    new = TRAIN.replace("width = 64", "width = 128")
    diff = (
        "--- train.py.orig\n+++ train.py\n@@ -3,2 +3,2 @@\n"
        "-width = 64\n+width = 128\n print('train')\n"
    )
    (queue / "2.diff").write_text(diff)
    assert description_from_patch(diff) is None
    qp.propose(request(repo))
    assert (repo / "train.py").read_text() == new


def test_whole_file_replacement(repo, queue):
    text = "# autoloop: rewrite with a bigger model\nlr = 0.05\nwidth = 256\n"
    (queue / "005_big.py").write_text(text)
    proposal = QueueProposer(queue).propose(request(repo))
    assert proposal.description == "rewrite with a bigger model"
    assert proposal.source == "005_big.py"
    assert (repo / "train.py").read_text() == text


def test_whole_file_replacement_description_from_name(repo, queue):
    (queue / "006_tiny_model.py").write_text("width = 8\n")
    assert QueueProposer(queue).propose(request(repo)).description == "tiny model"


def test_patch_that_does_not_apply_fails_and_is_skipped_next_time(repo, queue):
    diff = make_patch(repo, TRAIN.replace("lr = 0.1", "lr = 0.3"))
    (repo / "train.py").write_text("something else entirely\n")
    git(repo, "commit", "-qam", "diverge")
    (queue / "003_x.patch").write_text(diff)
    (queue / "004_next.py").write_text("lr = 1\n")
    qp = QueueProposer(queue)
    with pytest.raises(ProposalFailed, match=r"^patch 003_x.patch does not apply: patch failed: train.py:1$"):
        qp.propose(request(repo))
    assert (repo / "train.py").read_text() == "something else entirely\n"  # untouched
    assert (queue / "done" / "003_x.patch").exists()
    assert qp.propose(request(repo)).source == "004_next.py"


def test_order_by_name(repo, queue):
    for name in ("b_second.py", "10_third.py", "a_first.py", "02_zeroth.py"):
        (queue / name).write_text(f"# {name}\n")
    (queue / "notes.txt").write_text("ignored\n")
    qp = QueueProposer(queue)
    sources = [qp.propose(request(repo)).source for _ in range(4)]
    assert sources == ["02_zeroth.py", "10_third.py", "a_first.py", "b_second.py"]
    assert qp.propose(request(repo)) is None
    assert (queue / "notes.txt").exists()


def test_same_name_again_does_not_overwrite_done(repo, queue):
    qp = QueueProposer(queue)
    (queue / "x.py").write_text("a = 1\n")
    qp.propose(request(repo))
    (queue / "x.py").write_text("a = 2\n")
    qp.propose(request(repo))
    assert (queue / "done" / "x.py").read_text() == "a = 1\n"
    assert (queue / "done" / "x.1.py").read_text() == "a = 2\n"


def test_empty_and_missing_queue(repo, queue, tmp_path):
    assert QueueProposer(queue).propose(request(repo)) is None
    assert QueueProposer(tmp_path / "nowhere").propose(request(repo)) is None
    assert not (tmp_path / "nowhere").exists()


def test_fix_request_returns_none(repo, queue):
    (queue / "1.py").write_text("x = 1\n")
    fix = FixContext(crash="trivial", reason="NameError", log_tail="", description="d")
    qp = QueueProposer(queue)
    assert not qp.can_fix and qp.name == "queue"
    assert qp.propose(request(repo, fix=fix)) is None
    assert (queue / "1.py").exists()  # not consumed


def test_empty_replacement_fails(repo, queue):
    (queue / "1.py").write_text("\n")
    with pytest.raises(ProposalFailed, match="empty"):
        QueueProposer(queue).propose(request(repo))
    assert (repo / "train.py").read_text() == TRAIN
