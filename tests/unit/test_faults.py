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


def test_a_stop_left_set_outside_the_tests_says_so_and_fails_after_the_wait_limit(
        monkeypatch, tmp_path, caplog):
    import time

    import pytest

    monkeypatch.setattr(faults, "_reached", {})
    monkeypatch.setattr(faults, "WAIT_LIMIT_S", 0.3)
    monkeypatch.setenv(faults.POINT_VAR, "batch-written")
    monkeypatch.setenv(faults.MARK_VAR, str(tmp_path / "mark"))
    started = time.monotonic()
    with pytest.raises(faults.FaultPointError) as caught:
        faults.point("batch-written")
    assert time.monotonic() - started < 5
    assert str(caught.value).startswith(
        "DELTAFERRY_CRASH_POINT=batch-written: this run stopped at crash point batch-written "
        "for 0.3 s and no test killed it")
    assert "\n" not in str(caught.value) and "unset it" in str(caught.value)
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "DELTAFERRY_CRASH_POINT=batch-written" in warned[0].message
    assert "crash-test setting" in warned[0].message


def test_a_pause_nobody_resumes_fails_after_the_wait_limit(monkeypatch, tmp_path):
    import pytest

    monkeypatch.setattr(faults, "_reached", {})
    monkeypatch.setattr(faults, "WAIT_LIMIT_S", 0.3)
    monkeypatch.setenv(faults.POINT_VAR, "quarantine-written:pause")
    monkeypatch.setenv(faults.MARK_VAR, str(tmp_path / "mark"))
    with pytest.raises(faults.FaultPointError, match="no test resumed it"):
        faults.point("quarantine-written")


def test_a_value_naming_no_point_or_without_a_mark_is_refused(monkeypatch, tmp_path):
    import pytest

    from deltaferry.errors import ConfigError

    monkeypatch.setenv(faults.POINT_VAR, "batch-writen")
    monkeypatch.setenv(faults.MARK_VAR, str(tmp_path / "mark"))
    with pytest.raises(ConfigError, match="DELTAFERRY_CRASH_POINT: 'batch-writen' is not NAME"):
        faults.point("batch-written")
    monkeypatch.setenv(faults.POINT_VAR, "batch-written")
    monkeypatch.delenv(faults.MARK_VAR)
    with pytest.raises(ConfigError, match="without DELTAFERRY_CRASH_MARK"):
        faults.point("quarantine-written")  # at any point: the setting itself is wrong
