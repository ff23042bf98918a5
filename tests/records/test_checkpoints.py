"""Which checkpoint a run resumes from: the most recently written whole one."""

import os

import torch

from reproduce.records import checkpoints


def _save(path, step, mtime):
    torch.save({"global_step": step}, path)
    os.utime(path, ns=(mtime, mtime))


def test_a_last_checkpoint_a_save_behind_loses_to_the_newer_step_file(tmp_path):
    # Lightning writes step6.ckpt, then last.ckpt: a kill in between leaves last.ckpt at step 3.
    _save(tmp_path / "last.ckpt", 3, 1_000)
    _save(tmp_path / "step3.ckpt", 3, 900)
    _save(tmp_path / "step6.ckpt", 6, 2_000)
    assert checkpoints.newest_readable(tmp_path).name == "step6.ckpt"
    _save(tmp_path / "last.ckpt", 6, 2_000)  # the save completed: last.ckpt on a tie
    assert checkpoints.newest_readable(tmp_path).name == "last.ckpt"
    _save(tmp_path / "last.ckpt", 6, 2_100)
    assert checkpoints.newest_readable(tmp_path).name == "last.ckpt"


def test_a_damaged_newest_checkpoint_gives_way_to_the_next(tmp_path):
    _save(tmp_path / "step3.ckpt", 3, 1_000)
    (tmp_path / "step6.ckpt").write_bytes(b"PK\x03\x04 not a whole zip")
    os.utime(tmp_path / "step6.ckpt", ns=(2_000, 2_000))
    assert checkpoints.newest_readable(tmp_path).name == "step3.ckpt"
    assert [p.name.split(".ckpt")[0] for p in (tmp_path / "damaged").iterdir()] == ["step6"]
    assert checkpoints.newest_readable(tmp_path / "nothing-here") is None


def test_a_step_file_of_weights_alone_is_averaged_but_never_resumed_from(tmp_path):
    # averaging k > 1: step files hold the weights alone, last.ckpt the optimizer state too
    torch.save({"global_step": 3, "state_dict": {"w": torch.ones(2)}, "optimizer_states": [{}]},
               tmp_path / "last.ckpt")
    os.utime(tmp_path / "last.ckpt", ns=(1_000, 1_000))
    torch.save({"global_step": 6, "state_dict": {"w": torch.zeros(2)}}, tmp_path / "step6.ckpt")
    os.utime(tmp_path / "step6.ckpt", ns=(2_000, 2_000))
    assert checkpoints.weights_only(tmp_path / "step6.ckpt")
    assert not checkpoints.weights_only(tmp_path / "last.ckpt")
    assert checkpoints.newest_readable(tmp_path).name == "last.ckpt"
    assert checkpoints.last_checkpoints(tmp_path, 5) == [tmp_path / "step6.ckpt"]


def test_a_damaged_checkpoint_among_those_averaged_is_one_line_and_kept_aside(tmp_path):
    import pytest

    from reproduce.errors import DataError
    from reproduce.train.runner import _final_weights

    for step in (3, 6, 9):
        torch.save({"state_dict": {"w": torch.full((2,), float(step))}}, tmp_path / f"step{step}.ckpt")
    (tmp_path / "step6.ckpt").write_bytes((tmp_path / "step6.ckpt").read_bytes()[:40])
    with pytest.raises(DataError, match=r"step6.ckpt: not a readable checkpoint .* averages its "
                                        r"last 3 checkpoints .* to retrain the run from the start"):
        _final_weights(torch.nn.Module(), tmp_path, 3)
    assert [p.name.split(".ckpt")[0] for p in (tmp_path / "damaged").iterdir()] == ["step6"]


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path):
    """Checkpoints stream to a temporary file (no copy of GBs in memory): a save that fails after
    part of it is written leaves the previous file as it was, and no temporary file."""
    import pytest

    from reproduce.train.callbacks import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 3, "w": torch.ones(1000)}, path)
    before = path.read_bytes()

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("fails once the tensors before it are written")

    with pytest.raises(RuntimeError, match="fails once"):
        io.save_checkpoint({"global_step": 6, "w": torch.zeros(10**6), "z": Unpicklable()}, path)
    assert path.read_bytes() == before and torch.load(path)["global_step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_last_ckpt_is_a_copy_of_a_full_step_file_saved_with_it(tmp_path):
    """Where the step's file is full, last.ckpt is a copy of its bytes, not a second
    serialization, but for a run's first save (its step file holds no last_model_path yet);
    where the step files hold the weights alone, last.ckpt is saved in full. Either way
    last.ckpt names itself, so a run resumed from it goes on writing last.ckpt."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from reproduce.train.callbacks import AtomicCheckpointIO, StepCheckpoint

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())

    class Counted(AtomicCheckpointIO):
        def __init__(self):
            self.saved: list[str] = []

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.saved.append(os.path.basename(path))
            super().save_checkpoint(checkpoint, path, storage_options)

    for weights_only in (False, True):
        folder = tmp_path / str(weights_only)
        io = Counted()
        ckpt = StepCheckpoint(steps_weights_only=weights_only, dirpath=folder, filename="step{step}",
                              auto_insert_metric_name=False, save_last=True, save_top_k=1,
                              monitor="step", mode="max", every_n_train_steps=2)
        trainer = pl.Trainer(max_steps=4, logger=False, callbacks=[ckpt], plugins=[io],
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Tiny(), DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2))
        last, step4 = (folder / "last.ckpt").read_bytes(), (folder / "step4.ckpt").read_bytes()
        if weights_only:
            assert io.saved == ["step2.ckpt", "last.ckpt", "step4.ckpt", "last.ckpt"]
            assert last != step4 and checkpoints.weights_only(folder / "step4.ckpt")
        else:
            assert io.saved == ["step2.ckpt", "last.ckpt", "step4.ckpt"] and last == step4
        assert not checkpoints.weights_only(folder / "last.ckpt")
        saved = torch.load(folder / "last.ckpt", weights_only=False)
        assert saved["global_step"] == 4
        [state] = [s for s in saved["callbacks"].values() if "last_model_path" in s]
        assert state["last_model_path"] == str(folder / "last.ckpt")
