"""A worker's output (issue 27): straight to journald through systemd-cat under journald, else relayed through
elasticd's log within a rate bound per worker that costs the daemon next to nothing when a worker writes flat out."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from elasticd.config.model import RunAs
from elasticd.supervisor.backoff import RestartPolicy
from elasticd.supervisor.output import (
    BYTE_BURST,
    BYTES_PER_SECOND,
    LINE_BURST,
    LINES_PER_SECOND,
    NOTE_INTERVAL,
    READ_INTERVAL,
    Admitted,
    LineSplitter,
    OutputBound,
)
from elasticd.supervisor.spawn import TRAMPOLINE, UMASK, JournalStream, WorkerSpec, spawn_argv
from elasticd.supervisor.worker_process import Worker, journal_for_workers

# ---------------------------------------------------------------------- the rate decision (pure, a table)

# Each row: a name, then steps of (call, argument, now, expected); the bound is made at time 0 with small numbers:
# 10 lines a second with a burst of 20, 1000 bytes a second with a burst of 2000, reads 0.05 s apart at least,
# a note at least every 5 s.
A = Admitted
BOUND_TABLE = [
    ("a trickle under the bound: every line, no note",
     [("admit", 3, 0.0, A(3, 0)), ("admit", 3, 1.0, A(3, 0)), ("admit", 3, 2.0, A(3, 0))]),
    ("the burst, then nothing until the bucket refills",
     [("admit", 20, 0.0, A(20, 0)), ("admit", 1, 0.0, A(0, 0)), ("admit", 1, 0.05, A(0, 0)),
      ("admit", 1, 0.2, A(1, 2))]),  # tokens back: the line fits, so the note of the two drops comes first
    ("a flood: the first lines of each read, the rest counted",
     [("admit", 1000, 0.0, A(20, 0)), ("admit", 1000, 0.5, A(5, 0)), ("suppressed", None, 0.5, 1975),
      ("admit", 1000, 1.0, A(5, 0)), ("suppressed", None, 1.0, 2970)]),
    ("a flood goes on: a note every 5 s, counting only the lines before the ones logged after it",
     [("admit", 1000, 0.0, A(20, 0)), ("admit", 1000, 4.5, A(20, 0)),  # the bucket refilled to its burst, no more
      ("admit", 1000, 5.0, A(5, 1960)), ("suppressed", None, 5.0, 995),
      ("admit", 1000, 9.0, A(20, 0)), ("admit", 1000, 10.0, A(10, 995 + 980)), ("suppressed", None, 10.0, 990)]),
    ("the rate falls back: the note at once, before the line that fits",
     [("admit", 100, 0.0, A(20, 0)), ("admit", 2, 1.0, A(2, 80)), ("admit", 2, 2.0, A(2, 0))]),
    ("a read with no complete line is no sign the flood ended",
     [("admit", 100, 0.0, A(20, 0)), ("admit", 0, 1.0, A(0, 0)), ("suppressed", None, 1.0, 80)]),
    ("quiet after a flood: the note is due 5 s after the drops began, and flush gives it",
     [("due", None, 0.0, None), ("admit", 100, 1.0, A(20, 0)), ("due", None, 1.0, 5.0), ("due", None, 4.0, 2.0),
      ("due", None, 7.0, 0.0), ("flush", None, 7.0, 80), ("due", None, 7.0, None), ("flush", None, 8.0, 0)]),
    ("bytes: a pause of at least the read interval, longer while in debt",
     [("read", 500, 0.0, READ_INTERVAL), ("read", 1500, 0.0, READ_INTERVAL), ("read", 500, 0.0, 0.5),
      ("read", 500, 0.5, 0.5), ("read", 100, 2.0, READ_INTERVAL)]),
    ("a clock that goes back refills nothing",
     [("admit", 20, 10.0, A(20, 0)), ("admit", 5, 9.0, A(0, 0)), ("admit", 1, 10.5, A(1, 5))]),
]


@pytest.mark.parametrize(("name", "steps"), BOUND_TABLE, ids=[r[0] for r in BOUND_TABLE])
def test_output_bound(name, steps):
    bound = OutputBound(0.0, lines_per_second=10, line_burst=20, bytes_per_second=1000, byte_burst=2000,
                        read_interval=READ_INTERVAL, note_interval=5.0)
    for call, argument, now, expected in steps:
        if call == "admit":
            got = bound.admit(argument, now)
        elif call == "read":
            got = bound.pause_after_read(argument, now)
        elif call == "due":
            got = bound.note_due_in(now)
        elif call == "flush":
            got = bound.flush(now)
        else:
            got = bound.suppressed
        assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected, (call, now)


def test_the_default_bounds_are_what_an_operator_is_told():
    assert (LINES_PER_SECOND, LINE_BURST, BYTES_PER_SECOND, BYTE_BURST) == (100, 1000, 1024 * 1024, 1024 * 1024)
    assert READ_INTERVAL <= 0.05 and NOTE_INTERVAL <= 10


SPLIT_TABLE = [
    ("whole lines", [b"a\nb\n"], [(b"a\nb", 2)], b""),
    ("a line across reads", [b"ab", b"c\nd", b"e\n"], [(b"", 0), (b"abc", 1), (b"de", 1)], b""),
    ("empty lines count", [b"\n\n"], [(b"\n", 2)], b""),
    ("the end in the middle of a line", [b"a\nrest"], [(b"a", 1)], b"rest"),
    ("a line over max_line is cut", [b"1234", b"5678", b"9\n"], [(b"", 0), (b"12345678", 1), (b"9", 1)], b""),
    ("a cut after complete lines", [b"a\n123456789"], [(b"a\n123456789", 2)], b""),
]


@pytest.mark.parametrize(("name", "chunks", "expected", "rest"), SPLIT_TABLE, ids=[r[0] for r in SPLIT_TABLE])
def test_line_splitter(name, chunks, expected, rest):
    splitter = LineSplitter(max_line=6)
    assert [splitter.feed(chunk) for chunk in chunks] == expected
    assert splitter.rest() == rest


# ---------------------------------------------------------------------- under journald: the argv

WORKER_ID = "acme.shop.green.1"
CAT = JournalStream("/usr/bin/systemd-cat", WORKER_ID)
CAT_ARGV = ["/usr/bin/systemd-cat", f"--identifier={WORKER_ID}", "--priority=info", "--level-prefix=false", "--"]


def test_systemd_cat_comes_after_the_trampoline_and_before_the_umask_and_setpriv():
    run_as = RunAs("shop", 1234, "shop", 1235, "/home/shop")
    spec = WorkerSpec(argv=("app", "--flag", "<0>$(id)"), env=(), cwd="/srv", leaf="/cg/tenants/acme/shop",
                      run_as=run_as)
    argv = spawn_argv(spec, None, CAT)
    assert argv == [
        "/bin/sh", "-c", TRAMPOLINE, "/cg/tenants/acme/shop",  # the pid is in the leaf first
        *CAT_ARGV,  # then the stream to journald, connected from inside the leaf, still as root
        "/bin/sh", "-c", UMASK, "umask",
        "/usr/bin/setpriv", "--reuid=1234", "--regid=1235", "--clear-groups", "--no-new-privs", "--inh-caps=-all",
        "--bounding-set=-all", "--pdeathsig", "SIGKILL", "--", "app", "--flag", "<0>$(id)"]
    # Without cgroups (no trampoline) it comes first; without the journal it is not there at all.
    unconfined = WorkerSpec(argv=("app",), env=(), cwd="/", leaf=None)
    assert spawn_argv(unconfined, None, CAT)[:len(CAT_ARGV) + 1] == [*CAT_ARGV, "/bin/sh"]
    assert not any("systemd-cat" in arg for arg in spawn_argv(spec))
    assert spawn_argv(spec) == ["/bin/sh", "-c", TRAMPOLINE, "/cg/tenants/acme/shop", *argv[4 + len(CAT_ARGV):]]


def test_the_journal_is_chosen_only_when_elasticd_s_stderr_is_the_journal(tmp_path, caplog, monkeypatch):
    # stderr is the journal when JOURNAL_STREAM names its device and inode.
    st = os.fstat(sys.stderr.fileno())
    mine = f"{st.st_dev}:{st.st_ino}"
    assert journal_for_workers({}) is None
    assert journal_for_workers({"JOURNAL_STREAM": "1:2"}) is None  # inherited, but stderr is elsewhere
    found = journal_for_workers({"JOURNAL_STREAM": mine})
    assert found == shutil.which("systemd-cat", path="/usr/bin:/bin")
    # Not installed: the relay, said once.
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    caplog.set_level("WARNING", logger="elasticd.worker")
    assert journal_for_workers({"JOURNAL_STREAM": mine}) is None
    assert "systemd-cat (package systemd) is not in /usr/bin:/bin" in caplog.text


# ---------------------------------------------------------------------- under journald, for real

# Runs as PID 1 of private mount and PID namespaces (unshare): a tmpfs on /run/systemd and /run/log hides any
# journald of the host, a journald of its own listens there (volatile, never forwarding to wall or the console),
# and the argv runs once without it (the worker must not start) and once with it. Everything it started dies
# with it: it is the namespace's init.
JOURNALD_SCRIPT = textwrap.dedent("""
    import json, os, socket, subprocess, sys, time
    argv, canary, conf = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    def run(*command):
        subprocess.run(command, check=True, capture_output=True, timeout=10)
    run("mount", "--make-rprivate", "/")
    run("mount", "-t", "proc", "proc", "/proc")
    for where in ("/run/systemd", "/run/log"):
        os.makedirs(where, exist_ok=True)
        run("mount", "-t", "tmpfs", "tmpfs", where)
    if os.path.isdir("/var/log/journal"):
        run("mount", "-t", "tmpfs", "tmpfs", "/var/log/journal")
    run("mount", "--bind", conf, "/etc/systemd/journald.conf")
    result = {}
    without = subprocess.run(argv, capture_output=True, timeout=10)
    result["without"] = [without.returncode, os.path.exists(canary), without.stderr.decode(errors="replace")]
    os.makedirs("/run/systemd/journal", exist_ok=True)
    journald = subprocess.Popen(["/lib/systemd/systemd-journald"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    def accepts():  # (the socket's file exists from its bind(), before journald listens on it)
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect("/run/systemd/journal/stdout")
        except OSError:
            return False
        finally:
            probe.close()
        return True
    deadline = time.monotonic() + 5
    while not accepts() and journald.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not accepts():
        journald.kill()
        why = journald.communicate()[1].decode(errors="replace").strip()[-300:]
        said = f": {why}" if why else ", nothing on its stderr"
        print(json.dumps({"skip": f"journald did not start here (exit {journald.returncode}{said}); as in the Debian "
                                  "suite root, a chroot without systemd as init (the sources' run has this test)"}))
        sys.exit(0)
    worker = subprocess.run(argv, capture_output=True, timeout=10)
    result["with"] = [worker.returncode, worker.stdout.decode(), worker.stderr.decode()]
    time.sleep(0.3)
    shown = subprocess.run(["journalctl", "-D", "/run/log/journal", "-t", sys.argv[4], "-o", "json", "--no-pager"],
                           capture_output=True, timeout=10)
    result["entries"] = [json.loads(line) for line in shown.stdout.decode().splitlines() if line.strip()]
    journald.kill()
    print(json.dumps(result))
""")

JOURNALD_CONF = """[Journal]
Storage=volatile
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
ReadKMSG=no
"""

HOSTILE_PRINTER = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
                   " print('<0>emergency, says the tenant'); print('<3>an error, says the tenant', file=sys.stderr);"
                   " print('a plain line')")


def test_a_worker_writes_to_its_own_journald_stream_at_info_and_never_starts_without_one(tmp_path):
    needs = ["/lib/systemd/systemd-journald", shutil.which("systemd-cat", path="/usr/bin:/bin"),
             shutil.which("journalctl"), shutil.which("unshare"), shutil.which("setpriv")]
    if os.geteuid() != 0 or not all(path and os.path.exists(path) for path in needs):
        pytest.skip("needs root, unshare, setpriv and systemd's journald, systemd-cat and journalctl")
    if not os.path.exists("/etc/systemd/journald.conf"):
        pytest.skip("no /etc/systemd/journald.conf to stand in for")
    leaf = tmp_path / "leaf"
    leaf.mkdir()
    (leaf / "cgroup.procs").write_text("")
    canary = tmp_path / "pid"
    spec = WorkerSpec(argv=(sys.executable, "-c", HOSTILE_PRINTER, str(canary)), env=(), cwd="/", leaf=str(leaf))
    argv = spawn_argv(spec, None, JournalStream(shutil.which("systemd-cat", path="/usr/bin:/bin"), WORKER_ID))
    (tmp_path / "journald.conf").write_text(JOURNALD_CONF)
    try:
        done = subprocess.run(["unshare", "--mount", "--pid", "--fork", sys.executable, "-c", JOURNALD_SCRIPT,
                               json.dumps(argv), str(canary), str(tmp_path / "journald.conf"), WORKER_ID],
                              capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the journald namespace did not finish within 30 s")
    if done.returncode != 0 and b"unshare" in done.stderr:
        pytest.skip(f"no private namespaces here: {done.stderr.decode(errors='replace').strip()}")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    returncode, started, stderr = result["without"]
    assert returncode != 0 and not started, "without journald the worker must not start"
    assert "stream" in stderr  # systemd-cat says why, on elasticd's stderr
    assert result["with"][:2] == [0, ""], result["with"][2]  # nothing on elasticd's side: it all went to journald
    pid = int(canary.read_text())
    assert (leaf / "cgroup.procs").read_text().strip() == str(pid)  # the same process all along the chain
    entries = {e["MESSAGE"]: e for e in result["entries"]}
    assert set(entries) == {"<0>emergency, says the tenant", "<3>an error, says the tenant", "a plain line"}
    for entry in entries.values():  # each at info, whatever it printed; by the worker's pid, under its id
        assert (entry["PRIORITY"], entry["SYSLOG_IDENTIFIER"], entry["_PID"], entry["_TRANSPORT"]) == (
            "6", WORKER_ID, str(pid), "stdout")


# ---------------------------------------------------------------------- the relay, for real

# Writes ~70-byte lines flat out for FLOOD_SECONDS (a blocking stdout: the pipe's fullness is what holds it),
# records how many bytes it got written, then exits; or, with ALSO_SERVE, keeps serving after the flood.
FLOODER = textwrap.dedent("""
    import os, sys, time
    line = b"flood " + b"x" * 63 + b"\\n"
    block = line * 256
    written = 0
    end = time.monotonic() + float(os.environ["FLOOD_SECONDS"])
    while time.monotonic() < end:
        written += os.write(1, block)
    open(os.environ["WRITTEN"], "w").write(str(written))
""")


def _flooder(tmp_path, seconds: float) -> Worker:
    (tmp_path / "workers").mkdir(exist_ok=True)
    spec = WorkerSpec(argv=(sys.executable, "-c", FLOODER), cwd=str(tmp_path), leaf=None,
                      env=(("FLOOD_SECONDS", str(seconds)), ("WRITTEN", str(tmp_path / "written"))))
    # It exits after the flood: restarted after 30 s at the earliest, so one flood per test.
    patient = RestartPolicy(base=30.0, cap=30.0, max_deaths=3, window=60.0)
    return Worker("t.a.g.1", "t", "a", "g", spec, runtime_dir=str(tmp_path), occupancy_interval=1.0, policy=patient)


async def test_a_worker_writing_flat_out_is_bounded_and_the_loop_stays_responsive(tmp_path, caplog):
    await _flood_is_bounded(tmp_path, caplog)


def test_the_same_on_uvloop_the_daemon_s_loop(tmp_path, caplog):
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_flood_is_bounded(tmp_path, caplog))


def _logged_and_dropped(caplog) -> int:
    messages = [r.getMessage() for r in caplog.records if r.name == "elasticd.worker"]
    return (sum(m.startswith("[t.a.g.1] flood ") for m in messages)
            + sum(int(m.split("suppressed ")[1].split()[0]) for m in messages if "suppressed" in m))


async def _flood_is_bounded(tmp_path, caplog) -> None:
    caplog.set_level("INFO", logger="elasticd.worker")
    flood = 2.0
    worker = _flooder(tmp_path, flood)
    loop = asyncio.get_running_loop()
    lateness: list[float] = []

    async def tick() -> None:  # a timer in the same loop: how late does it fire?
        while True:
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lateness.append(loop.time() - due)

    ticker = asyncio.create_task(tick())
    cpu = time.process_time()
    started = loop.time()
    worker.start()
    try:
        deadline = started + flood + 3
        while not (tmp_path / "written").exists() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        # The pipe's last bytes, the end of output, the note: until every line written is logged or counted as
        # dropped (polled: on a loaded machine they take their time).
        written_lines = int((tmp_path / "written").read_text()) // 70
        settled = loop.time() + 5
        while _logged_and_dropped(caplog) < written_lines and loop.time() < settled:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # (and nothing more comes)
        elapsed = loop.time() - started
        cpu = time.process_time() - cpu
    finally:
        ticker.cancel()
        await worker.stop(2)
    written = int((tmp_path / "written").read_text())
    records = [r for r in caplog.records if r.name == "elasticd.worker"]
    lines = [r for r in records if r.getMessage().startswith("[t.a.g.1] flood ")]
    notes = [r.getMessage() for r in records if "suppressed" in r.getMessage()]
    # Lines logged: within the burst and the rate over the whole run.
    assert LINE_BURST <= len(lines) <= LINE_BURST + LINES_PER_SECOND * elapsed + 5, len(lines)
    # The rest were dropped, and said so in a note or two (not one per line), counting every line written.
    assert 1 <= len(notes) <= 3, notes
    dropped = sum(int(n.split("suppressed ")[1].split()[0]) for n in notes)
    assert dropped + len(lines) == written // 70
    # Bytes: the writer was held to the byte rate (the pipe's 64 KiB and a read in flight beside).
    assert written <= BYTE_BURST + BYTES_PER_SECOND * flood + 256 * 1024, written
    # The daemon's loop: its timer fires within ~50 ms (all but a scheduler's hiccup: this machine's other
    # processes, the flooder among them, share its cores), and its CPU is a small share of the flood's time.
    lateness.sort()
    assert lateness[int(len(lateness) * 0.98)] < 0.05 and lateness[-1] < 0.5, lateness[-10:]
    assert cpu < 0.25 * elapsed, (cpu, elapsed)


ONE_BURST = textwrap.dedent("""
    import sys, time
    for i in range(3000):
        print("burst", i)
    sys.stdout.flush()
    time.sleep(float(sys.argv[1]))
    print("after the quiet")
    sys.stdout.flush()
    time.sleep(60)
""")


async def test_a_flood_that_ends_is_noted_before_the_next_line(tmp_path, caplog):
    caplog.set_level("INFO", logger="elasticd.worker")
    (tmp_path / "workers").mkdir()
    spec = WorkerSpec(argv=(sys.executable, "-c", ONE_BURST, "1.2"), env=(), cwd=str(tmp_path), leaf=None)
    worker = Worker("t.a.g.1", "t", "a", "g", spec, runtime_dir=str(tmp_path), occupancy_interval=1.0)
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while "after the quiet" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await worker.stop(2)
    messages = [r.getMessage() for r in caplog.records if r.name == "elasticd.worker"]
    burst = [int(m.rsplit(" ", 1)[1]) for m in messages if m.startswith("[t.a.g.1] burst ")]
    # The burst's first lines, in order; then as many as the rate refilled while the rest was read (~50 ms apart).
    assert burst[:LINE_BURST] == list(range(LINE_BURST)) and burst == sorted(burst)
    assert len(burst) <= LINE_BURST + 30
    notes = [i for i, m in enumerate(messages) if "suppressed" in m]
    assert len(notes) == 1  # one note for the whole flood, once it fell back, before the line after it
    assert messages[notes[0]] == (f"worker t.a.g.1: suppressed {3000 - len(burst)} lines of output (more than 100 "
                                  "a second; under journald, where workers write to it directly, nothing is "
                                  "dropped by elasticd)")
    assert messages[notes[0] + 1] == "[t.a.g.1] after the quiet"


async def test_a_last_line_without_a_newline_arrives_and_a_nul_is_shown_not_passed_on(tmp_path, caplog):
    caplog.set_level("INFO", logger="elasticd.worker")
    (tmp_path / "workers").mkdir()
    script = ("import sys; print('first'); print('a NUL\\0<0>is no line break');"
              " sys.stdout.write('no newline at the end'); sys.stdout.flush()")
    spec = WorkerSpec(argv=(sys.executable, "-c", script), env=(), cwd=str(tmp_path), leaf=None)
    worker = Worker("t.a.g.1", "t", "a", "g", spec, runtime_dir=str(tmp_path), occupancy_interval=1.0,
                    policy=RestartPolicy(base=30.0, cap=30.0, max_deaths=3, window=60.0))
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while "no newline" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await worker.stop(2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[t.a.g.1]")]
    assert lines == ["[t.a.g.1] first", "[t.a.g.1] a NUL\\0<0>is no line break", "[t.a.g.1] no newline at the end"]
    assert not any(r.levelno >= logging.WARNING for r in caplog.records if r.name == "elasticd.worker"
                   and "suppressed" in r.getMessage())


async def test_under_journald_elasticd_gives_the_worker_no_pipe(tmp_path, caplog):
    """With a systemd-cat (here a stand-in that records its argv and fds, then execs the rest), the worker's
    stdout is not elasticd's to read: nothing of it is logged, and the chain runs with the pid kept."""
    caplog.set_level("INFO", logger="elasticd.worker")
    (tmp_path / "workers").mkdir()
    stand_in = tmp_path / "systemd-cat"
    stand_in.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        args = sys.argv[1:]
        json.dump({{"argv": args, "pid": os.getpid(), "stdout": os.readlink("/proc/self/fd/1")}},
                  open({str(tmp_path / "cat.json")!r}, "w"))
        rest = args[args.index("--") + 1:]
        os.execv(rest[0], rest)
        """))
    stand_in.chmod(0o755)
    script = "import os; print('to the journal, not to elasticd'); open('pid', 'w').write(str(os.getpid()))"
    spec = WorkerSpec(argv=(sys.executable, "-c", script), env=(), cwd=str(tmp_path), leaf=None)
    worker = Worker("t.a.g.1", "t", "a", "g", spec, runtime_dir=str(tmp_path), occupancy_interval=1.0,
                    policy=RestartPolicy(base=30.0, cap=30.0, max_deaths=3, window=60.0), systemd_cat=str(stand_in))
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
    finally:
        await worker.stop(2)
    seen = json.loads((tmp_path / "cat.json").read_text())
    assert seen["argv"][:4] == ["--identifier=t.a.g.1", "--priority=info", "--level-prefix=false", "--"]
    assert seen["stdout"] == "/dev/null"  # the real systemd-cat replaces it with its stream before any exec
    assert seen["pid"] == int((tmp_path / "pid").read_text())
    assert "to the journal" not in caplog.text
