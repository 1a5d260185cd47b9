"""worker/sync.py mirrors a job's work files while the trainer keeps writing them: a checkpoint pruned between the
listing and its upload must not fail the stage (seen under load in the broker-restart test, 2026-12-02)."""

from __future__ import annotations

from domain.storage import LocalStorage
from worker.sync import WorkSync


class PruningStorage(LocalStorage):
    """Local storage during whose first upload the trainer prunes the oldest checkpoint, as DeepSpeed's ranks do."""

    def __init__(self, root, prune):
        super().__init__(root)
        self.prune = prune

    def put_file(self, key, path):
        if self.prune is not None:
            self.prune.unlink()
            self.prune = None
        return super().put_file(key, path)


def test_a_checkpoint_pruned_while_it_is_mirrored_is_skipped_and_then_deleted_remotely(tmp_path):
    work = tmp_path / "work"
    old = work / "train" / "checkpoints" / "step-000010" / "mp_rank_00_model_states.pt"
    new = work / "train" / "checkpoints" / "step-000020" / "mp_rank_00_model_states.pt"
    for file in (old, new):
        file.parent.mkdir(parents=True)
        file.write_bytes(b"x" * 100)
    (work / "train" / "checkpoints" / "latest").write_text("step-000020")
    storage = PruningStorage(tmp_path / "storage", prune=old)
    sync = WorkSync(storage, "jobs/j1/work", work)

    sync.push(work / "train" / "checkpoints")  # the old checkpoint vanishes mid-way: no error

    assert set(sync.remote("train/checkpoints")) == {"train/checkpoints/step-000020/mp_rank_00_model_states.pt",
                                                      "train/checkpoints/latest"}
    old.parent.rmdir()
    sync.push(work / "train" / "checkpoints")
    assert set(sync.remote("train/checkpoints")) == {"train/checkpoints/step-000020/mp_rank_00_model_states.pt",
                                                      "train/checkpoints/latest"}


def test_a_record_is_read_and_stored_under_the_jobs_work_files_only(tmp_path):
    from worker.sync import job_work

    storage = LocalStorage(tmp_path / "storage")
    work = job_work(storage, "job_1", tmp_path / "cache" / "job_1")
    assert work.read("stages/train.json") is None  # not stored: nothing to read, no error
    work.put_bytes("stages/train.json", b'{"steps": 4}')
    assert storage.exists("jobs/job_1/work/stages/train.json") and not (tmp_path / "cache").exists()
    assert work.read("stages/train.json") == b'{"steps": 4}'
    assert job_work(storage, "job_2", tmp_path / "cache" / "job_2").read("stages/train.json") is None
