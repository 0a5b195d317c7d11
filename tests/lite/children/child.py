"""Child programs the transparency tests wrap: each does one observable thing and exits.

It must never depend on denpex: it stands for an arbitrary user command.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
import tty


def payload(seed: int, n: int) -> bytes:
    """The bytes `random` writes for a seed (the tests recompute them)."""
    return random.Random(seed).randbytes(n)


def write_all(fd: int, data: bytes, piece: int = 1 << 20) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:piece]) :]


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "random":  # N_OUT N_ERR SEED: stdout gets payload(SEED), stderr payload(SEED+1)
        n_out, n_err, seed = (int(a) for a in args)
        out, err = memoryview(payload(seed, n_out)), memoryview(payload(seed + 1, n_err))
        while out or err:
            write_all(1, out[: 1 << 20])
            write_all(2, err[: 1 << 18])
            out, err = out[1 << 20 :], err[1 << 18 :]
        os._exit(0)
    if cmd == "raw-random":  # N SEED: puts its terminal in raw mode first
        n, seed = (int(a) for a in args)
        tty.setraw(1)
        write_all(1, payload(seed, n))
        os._exit(0)
    if cmd == "die":  # SIG: killed by that signal (no core file)
        sig = int(args[0])
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        time.sleep(5)
        os._exit(99)
    if cmd == "trap-term":  # prints `ready`, then on SIGTERM prints `got-term` and exits 7

        def on_term(signum: int, frame: object) -> None:
            os.write(1, b"got-term\n")
            os._exit(7)

        signal.signal(signal.SIGTERM, on_term)
        os.write(1, b"ready\n")
        time.sleep(30)
        os._exit(1)
    if cmd == "pidfile":  # FILE [GRANDCHILD_FILE]: records pids, then sleeps
        if len(args) > 1:
            grandchild = subprocess.Popen(["sleep", "60"])
            with open(args[1] + ".tmp", "w") as f:
                f.write(str(grandchild.pid))
            os.rename(args[1] + ".tmp", args[1])
        with open(args[0] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(args[0] + ".tmp", args[0])
        time.sleep(60)
        os._exit(1)
    if cmd == "daemon":  # FILE DAEMON_FILE: starts a daemon (setsid, double fork), sleeps
        if os.fork() == 0:
            os.setsid()  # out of the job's process group and session
            if os.fork() == 0:
                with open(args[1] + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(args[1] + ".tmp", args[1])
                time.sleep(60)
            os._exit(0)
        os.wait()
        with open(args[0] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(args[0] + ".tmp", args[0])
        time.sleep(60)
        os._exit(1)
    if cmd == "signals":  # prints its ignored and blocked signal masks (/proc/self/status)
        with open("/proc/self/status") as f:
            masks = dict(
                line.split(":\t", 1) for line in f if line.startswith(("SigIgn", "SigBlk"))
            )
        print(json.dumps({k: v.strip() for k, v in masks.items()}))
        return
    if cmd == "timed-writer":  # N FILE: writes N bytes in 64 KiB pieces, records the seconds
        n, path = int(args[0]), args[1]
        block = b"0123456789abcdef" * 4096
        start = time.monotonic()
        for _ in range(n // len(block)):
            write_all(1, block)
        with open(path, "w") as f:
            f.write(str(time.monotonic() - start))
        time.sleep(0.5)  # then one more line, after analysis had time to catch up
        write_all(1, b"tail\n")
        os._exit(0)
    if cmd == "burst":  # N: writes N bytes, then its last words, and exits at once
        block = b"0123456789abcdef" * 4096
        for _ in range(int(args[0]) // len(block)):
            write_all(1, block)
        write_all(1, b"FINAL-MARKER\n")
        os._exit(3)
    if cmd == "env":
        sys.stdout.write(json.dumps(dict(os.environ)))
        return
    if cmd == "tty":  # reports its terminal: name, window size, controlling terminal
        print(json.dumps({"tty": os.ttyname(0), "size": list(os.get_terminal_size(0))}))
        return
    if cmd == "winch":  # prints `ready`, waits for SIGWINCH, prints the new size
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH])
        os.write(1, b"ready\n")
        signal.sigwait([signal.SIGWINCH])
        print(json.dumps({"size": list(os.get_terminal_size(0))}), flush=True)
        return
    raise SystemExit(f"unknown child command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
