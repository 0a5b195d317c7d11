"""The notifier's memory survives its process: a leader process sends a notice to a local
receiver that SIGKILLs it after receiving the request and before answering (killed between
the send and the record), and the next leader process, on the same store, does not send it
again; a notice the receiver refused is released and delivered by the next leader, once.
Both engines (db_url)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import sqlalchemy as sa

from denpex.control.db import Database
from denpex.control.notice_store import NoticeLedger
from tests.remediation.webhook_receiver import Received, Receiver

# one leader process: a notifier on the store, one notice submitted, its counts printed
LEADER = """
import json, sys
from denpex.control.db import Database
from denpex.control.notice_store import NoticeLedger
from denpex.remediation.notify import Channel, Notice, Notifier
db = Database(sys.argv[1]); db.migrate()
site = Channel("site", "webhook", sys.argv[2], ("plan.waiting",))
notifier = Notifier([site], memory=NoticeLedger(db), sleep=lambda s: None)
notifier.submit(Notice("plan.waiting", tenant="acme", incident_id=7, plan_id=3, host="gpu-n17",
                       category="gpu.fallen_off_bus", summary="evict waits for approval",
                       state="evict"))
assert notifier.flush(60)
notifier.close()
print(json.dumps(notifier.counts))
"""


class Leaders:
    """Starts leader processes one after another; the receiver may kill the running one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen | None = None

    def run(self, receiver_url: str) -> tuple[int, dict | None]:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LEADER, self.url, receiver_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = self.proc.communicate(timeout=120)
        code = self.proc.returncode
        return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else {"err": err})

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def rows(url: str) -> list[dict]:
    db = Database(url)
    try:
        with db.system_tx() as conn:
            found = conn.execute(sa.text("SELECT * FROM remediation_notices")).mappings().all()
            return [dict(r) for r in found]
    finally:
        db.dispose()


def test_a_leader_killed_between_send_and_record_is_not_followed_by_a_duplicate(db_url):
    leaders = Leaders(db_url)
    killed = threading.Event()

    def kill_the_sender(got: Received):
        if not killed.is_set():  # the request arrived: the sender dies before it hears back
            killed.set()
            leaders.kill()
        return 204, {}, b""

    with Receiver(kill_the_sender) as receiver:
        code, _ = leaders.run(receiver.url)
        assert code == -signal.SIGKILL and killed.is_set()
        [claim] = rows(db_url)
        assert claim["sent_ns"] is None and claim["tenant"] == "acme"  # never recorded as sent
        code, counts = leaders.run(receiver.url)  # the next leader, same store
        assert code == 0, counts
        assert counts["duplicates"] == 1 and counts["sent"] == 0
    assert len(receiver.received) == 1  # one request ever reached the receiver


def test_a_refused_notice_is_released_and_the_next_leader_delivers_it_once(db_url):
    answers = iter([503] * 50)  # the first leader's every try is refused

    def flaky(got: Received):
        return next(answers, 200), {}, b""

    leaders = Leaders(db_url)
    with Receiver(flaky) as receiver:
        code, counts = leaders.run(receiver.url)
        assert code == 0 and counts["failed"] == 1 and counts["sent"] == 0
        assert rows(db_url) == []  # released: nothing was accepted
        tries = len(receiver.received)
        answers = iter([])  # the receiver is back
        code, counts = leaders.run(receiver.url)
        assert code == 0 and counts["sent"] == 1
        code, counts = leaders.run(receiver.url)  # and a third leader: a duplicate, not sent
        assert code == 0 and counts["duplicates"] == 1 and counts["sent"] == 0
    assert len(receiver.received) == tries + 1
    [sent] = rows(db_url)
    assert sent["sent_ns"] is not None
    ledger = NoticeLedger(Database(db_url))
    try:
        assert [n["kind"] for n in ledger.notices("acme")] == ["plan.waiting"]
        assert ledger.notices("globex") == []
    finally:
        ledger.db.dispose()
