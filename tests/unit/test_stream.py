"""`deltaferry stream`'s pieces that need no cluster: signals turned into a stop request, and
the per-batch progress lines (each batch logged once, idle triggers not at all)."""

import os
import signal
import threading

from deltaferry.spark.ingest.progress import StreamProgress
from deltaferry.steps import stop_on_signals


def test_sigterm_and_sigint_set_the_stop_event_instead_of_ending_the_process():
    before = signal.getsignal(signal.SIGTERM)
    for number in (signal.SIGTERM, signal.SIGINT):
        stop = threading.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), number)  # a real signal to this process
            assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def progress(batch_id: int, rows: int, end: dict) -> dict:
    return {"batchId": batch_id, "numInputRows": rows, "sources": [{"endOffset": end}],
            "durationMs": {"triggerExecution": 1200}}


def test_each_batch_with_messages_is_taken_once_and_counted():
    batches = StreamProgress("t", keep=2)
    first = [progress(0, 10, {"t": {"0": 10}}), progress(1, 0, {"t": {"0": 10}})]  # 1: idle
    assert [b["batch_id"] for b in batches.add(first)] == [0]
    later = [*first, progress(1, 5, {"t": {"0": 15, "1": 3}})]
    (batch,) = batches.add(later)
    assert (batch["batch_id"], batch["input_rows"], batch["offsets"]) == (1, 5, {"0": 15, "1": 3})
    assert batches.add(later) == []
    batches.add([progress(2, 7, {"t": {"0": 22, "1": 3}})])
    assert (batches.messages, batches.batches) == (22, 3)
    assert [b["batch_id"] for b in batches.latest] == [1, 2]  # only the latest `keep`
