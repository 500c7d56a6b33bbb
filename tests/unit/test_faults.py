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


def test_a_paused_point_goes_on_once_its_mark_is_deleted(monkeypatch, tmp_path):
    import threading

    monkeypatch.setattr(faults, "_reached", {})
    monkeypatch.setenv(faults.POINT_VAR, "quarantine-written:pause")
    mark = tmp_path / "mark"
    monkeypatch.setenv(faults.MARK_VAR, str(mark))
    run = threading.Thread(target=faults.point, args=("quarantine-written",))
    run.start()
    run.join(1.0)
    assert run.is_alive() and mark.read_text() == "quarantine-written"  # paused there
    mark.unlink()
    run.join(5.0)
    assert not run.is_alive()
