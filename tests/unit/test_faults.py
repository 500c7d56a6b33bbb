"""The crash points: nothing happens unless asked; NAME@N marks the (N+1)-th time."""

from deltaferry import faults


def test_a_point_does_nothing_unless_asked(monkeypatch, tmp_path):
    monkeypatch.delenv(faults.POINT_VAR, raising=False)
    faults.point("batch-written")
    monkeypatch.setenv(faults.POINT_VAR, "optimized-table:continue")
    monkeypatch.setenv(faults.MARK_VAR, str(tmp_path / "mark"))
    faults.point("batch-written")
    assert not (tmp_path / "mark").exists()


def test_the_nth_time_a_point_is_reached_is_marked(monkeypatch, tmp_path):
    monkeypatch.setattr(faults, "_reached", {})
    monkeypatch.setenv(faults.POINT_VAR, "batch-written@1:continue")
    monkeypatch.setenv(faults.MARK_VAR, str(tmp_path / "mark"))
    faults.point("batch-written")
    assert not (tmp_path / "mark").exists()
    faults.point("batch-written")
    assert (tmp_path / "mark").read_text() == "batch-written"
