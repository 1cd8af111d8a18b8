#!/usr/bin/env python3
"""elasticd's VM suite, host side: prove the .deb on a real systemd + cgroup v2 host.

    ./dev integration [--suite bookworm|trixie|bookworm,trixie]   (installs the host tools, then runs this)
    python3 integration/run.py [--suite trixie] [--deb dist/elasticd_X+debN_amd64.deb] [--only cpu,reload]
                               [--timeout 1200]

The Debian release the guest runs is ``--suite``: bookworm (systemd 252, kernel 6.1, Python 3.11) or trixie
(systemd 257, kernel 6.12, Python 3.13). Every scenario runs on both; where they differ, the scenario says so.

1. The .deb: the one given (built for that release), else ``packaging/deb/build --suite SUITE`` builds it.
2. The image: Debian SUITE with systemd, a kernel and elasticd's Debian dependencies, built by
   ``integration/image/build-image.sh`` and cached outside the checkout (``$ELASTICD_IT_CACHE``, default
   /var/cache/elasticd-integration/<suite>-<hash>/), keyed by the release and a hash of its inputs: that script,
   the package list and the files baked into it. CI clones afresh each time; the cache survives on the machine.
3. A run: a copy-on-write qcow2 overlay over the cached disk (the cache stays clean), a 9p share holding
   the .deb and integration/guest/, and qemu under TCG (no KVM on these machines) with 2 CPUs and
   1.5 GiB. The image's driver unit mounts the share, runs guest/run_scenarios.py (which installs the
   .deb with apt and runs the scenarios), and powers the guest off. The serial console is shown here
   and kept in build/integration-<suite>/console.log.
4. The verdict: one result per scenario from <share>/results/, shown as a table with the figure each
   measured. Exit 1 when a scenario failed, when the guest never reported (with the console's last lines),
   or on the timeout (qemu is killed).

Standard library only; run as root (the image build needs it). Never touches this machine's cgroups:
real cgroups are exercised only inside the guest.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
IMAGE_DIR = HERE / "image"
GUEST_DIR = HERE / "guest"
HOSTILE_WORKER = REPO / "tests" / "apps" / "hostile_worker.py"
VIEW_PROBE = REPO / "tests" / "apps" / "view_probe.py"
LISTENER_PROBE = REPO / "tests" / "apps" / "listener_probe.py"
DEFAULT_CACHE = Path(os.environ.get("ELASTICD_IT_CACHE", "/var/cache/elasticd-integration"))
DEFAULT_WORK = REPO / "build"  # the run directory is build/integration-<suite>
SUITES = ("bookworm", "trixie")
KEEP_IMAGES = 2  # cached images kept per release (most recently used first); older ones are deleted
CONSOLE_TAIL = 40
TOOLS = ("qemu-system-x86_64", "qemu-img", "mmdebstrap", "mkfs.ext4", "unshare")


class HarnessError(Exception):
    """A failure of the run itself (not of a scenario): printed as is, exit 1."""


BUILD_TAIL = 6  # lines of a failed .deb build carried into the closing reason


def log(message: str) -> None:
    print(f"integration: {message}", flush=True)


# ------------------------------------------------------------------------------------------------ the .deb


def build_deb(suite: str) -> Path:
    log(f"building the .deb for {suite} (packaging/deb/build --suite {suite})")
    result = subprocess.run([str(REPO / "packaging" / "deb" / "build"), "--suite", suite], capture_output=True,
                            text=True)
    sys.stdout.write(result.stderr)  # (the build's own account, in order with this run's lines)
    sys.stdout.flush()
    if result.returncode != 0:
        # Its last lines go into the reason too: CI keeps only the tail of the output, where two releases at once
        # leave a "see above" scrolled away by the other release's whole run (stop 51's CI: no cause to read).
        said = [line.strip() for line in result.stderr.splitlines() if line.strip()][-BUILD_TAIL:]
        raise HarnessError(f"packaging/deb/build --suite {suite} failed (exit {result.returncode}); its last "
                           f"lines: {' | '.join(said) or '(none)'}")
    return REPO / result.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------ the image


def image_inputs() -> list[Path]:
    files = [p for p in sorted(IMAGE_DIR.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    if not files:
        raise HarnessError(f"no image inputs under {IMAGE_DIR}")
    return files


def image_key(suite: str) -> str:
    """The release, then a hash of everything that decides the image's content: the files under
    integration/image/ (the build script, the package list, the files baked in), and the settings the build
    script reads."""
    digest = hashlib.sha256()
    for path in image_inputs():
        digest.update(str(path.relative_to(IMAGE_DIR)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
        digest.update(str(path.stat().st_mode & 0o111).encode() + b"\0")
    for name in ("ELASTICD_IT_MIRROR", "ELASTICD_IT_DISK_SIZE"):
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    return f"{suite}-{digest.hexdigest()[:16]}"


def ensure_image(cache: Path, suite: str, rebuild: bool) -> tuple[Path, str]:
    """The cached image of the release for the current inputs, built first if absent. Returns (dir,
    'cached'|'built Ns')."""
    cache.mkdir(parents=True, exist_ok=True)
    key = image_key(suite)
    target = cache / key
    with open(cache / f".lock-{suite}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs at once: one builds, the other waits and reuses
        if rebuild and target.exists():
            shutil.rmtree(target)
        if (target / "complete").exists():
            os.utime(target)  # most recently used, for pruning
            return target, "cached"
        partial = cache / f"{key}.partial"
        if partial.exists():
            shutil.rmtree(partial)
        log(f"building the image {key} (integration/image/build-image.sh, a minute or two)")
        start = time.monotonic()
        result = subprocess.run([str(IMAGE_DIR / "build-image.sh"), str(partial), suite])
        if result.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise HarnessError(f"the image build failed (exit {result.returncode}; see above)")
        (partial / "complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
        seconds = time.monotonic() - start
        _prune(cache, suite, keep=target)
        return target, f"built in {seconds:.0f}s"


def _prune(cache: Path, suite: str, keep: Path) -> None:
    # Per release: a bookworm run must not remove the trixie image the next step of CI boots.
    images = sorted((d for d in cache.iterdir()
                     if d.is_dir() and d.name.startswith(f"{suite}-") and (d / "complete").exists()),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    old = [d for d in images if d != keep][KEEP_IMAGES - 1:]
    # (and the images cached before the key named its release: all were bookworm's)
    old += [d for d in cache.iterdir() if d.is_dir() and (d / "complete").exists()
            and not d.name.startswith(tuple(f"{s}-" for s in SUITES))]
    for image in old:
        log(f"removing the old cached image {image}")
        shutil.rmtree(image, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ the run


def prepare_share(work: Path, deb: Path, only: list[str]) -> Path:
    if work.exists():
        shutil.rmtree(work)
    share = work / "share"
    (share / "results").mkdir(parents=True)
    shutil.copy2(deb, share / deb.name)
    shutil.copytree(GUEST_DIR, share / "guest", ignore=shutil.ignore_patterns("__pycache__"))
    # Scenario 19's hostile tenant is the functional tests' own (one program, not a copy kept in step by hand).
    shutil.copy2(HOSTILE_WORKER, share / "guest" / "hostile_worker.py")
    shutil.copy2(VIEW_PROBE, share / "guest" / "view_probe.py")  # scenario 20's, as 19's
    shutil.copy2(LISTENER_PROBE, share / "guest" / "listener_probe.py")  # scenario 25's
    (share / "guest" / "options.json").write_text(json.dumps({"only": only}))
    return share


def qemu_command(image: Path, overlay: Path, share: Path, memory: int, cpus: int) -> list[str]:
    return [
        "qemu-system-x86_64",
        # TCG: KVM does not work on these machines (VM.md). thread=multi: one host thread per vCPU.
        "-accel", "tcg,thread=multi", "-cpu", "max", "-m", str(memory), "-smp", str(cpus),
        "-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
        "-drive", f"file={overlay},format=qcow2,if=virtio",
        "-virtfs", f"local,path={share},mount_tag=host0,security_model=none",
        # panic=1 with -no-reboot: a guest kernel panic ends qemu at once instead of hanging to the timeout.
        "-append", "root=/dev/vda rw console=ttyS0 quiet panic=1",
    ]


def boot(command: list[str], console: Path, timeout: float, echo: bool) -> tuple[int | None, deque[str]]:
    """Run qemu to its end (the guest powers off) or to the timeout (qemu is killed, by its pid).
    Returns (exit code or None on timeout, the console's last lines)."""
    tail: deque[str] = deque(maxlen=CONSOLE_TAIL)
    with open(console, "w", encoding="utf-8", errors="replace") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        assert process.stdout is not None

        def pump() -> None:
            for raw in process.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                out.write(line + "\n")
                out.flush()
                tail.append(line)
                if echo:
                    print(f"  guest| {line}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        reader.join(5)
    return code, tail


def read_results(results: Path) -> tuple[list[str], dict[str, dict], dict | None]:
    """The guest's plan, its scenarios' results and its 'done' marker. A file it left unreadable (cut short when the
    guest went down mid-write) is that scenario's failure, said with its name, not the harness's crash."""
    def load(path: Path) -> object:
        try:
            return json.loads(path.read_text(errors="replace"))
        except (OSError, ValueError) as exc:
            return exc

    plan = load(results / "plan.json") if (results / "plan.json").exists() else []
    if not isinstance(plan, list):
        print(f"integration: the guest's plan.json is unreadable: {plan}", flush=True)
        plan = []
    found: dict[str, dict] = {}
    for path in sorted(results.glob("*.json")):
        if path.name != "plan.json":
            data = load(path)
            if isinstance(data, dict) and isinstance(data.get("scenario"), str):
                found[data["scenario"]] = data
            else:
                found[path.stem] = {"scenario": path.stem, "ok": False, "seconds": 0.0,
                                    "error": f"its result file {path.name} is unreadable: {data}"}
    done = load(results / "done") if (results / "done").exists() else None
    return plan, found, done if isinstance(done, dict) else None


def table(plan: list[str], found: dict[str, dict]) -> str:
    names = plan or sorted(found)
    rows = [("scenario", "ok", "s", "figure (or what failed)")]
    for name in names:
        data = found.get(name)
        if data is None:
            rows.append((name, "NO RESULT", "-", "the guest never reported this scenario"))
        else:
            text = data["figure"] if data["ok"] else (data["error"] or "").strip()
            rows.append((name, "ok" if data["ok"] else "FAILED", f"{data['seconds']:.0f}", text))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for row in rows:
        first, *rest = row[3].splitlines() or [""]
        lines.append(f"{row[0]:<{width[0]}} | {row[1]:<{width[1]}} | {row[2]:>{width[2]}} | {first}")
        pad = " " * (sum(width) + 9)
        lines.extend(f"{pad}| {extra}" for extra in rest[:30])
    return "\n".join(lines)


def check_tools() -> None:
    if os.geteuid() != 0:
        raise HarnessError("run as root (the image build needs it); ./dev integration does")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise HarnessError(f"missing host tools: {', '.join(missing)}; `./dev integration` installs them "
                           "(apt-get install qemu-system-x86 qemu-utils mmdebstrap e2fsprogs)")


def main(argv: list[str] | None = None) -> int:
    # (no abbreviations: run_releases forwards every option but --suite, and a forwarded "--su" would be taken
    # for --suite by each child, which would start two children of its own, and so on)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--suite", default="bookworm",
                        help="the Debian release the guest runs: bookworm (the default), trixie, or both "
                             "(bookworm,trixie: two guests at once, see run_releases)")
    parser.add_argument("--deb", type=Path,
                        help="the .deb to test, built for that release (default: packaging/deb/build --suite)")
    parser.add_argument("--only", default="", help="comma-separated scenario names (e.g. cpu,reload)")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("ELASTICD_IT_TIMEOUT", 0)) or None,
                        help="seconds for the whole guest run (boot, install, scenarios); default 1200, and 4000 "
                             "for each of two guests at once")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"image cache (default {DEFAULT_CACHE})")
    parser.add_argument("--work", type=Path, help=f"run directory (default {DEFAULT_WORK}/integration-SUITE)")
    parser.add_argument("--memory", type=int, default=1536, help="guest memory in MiB (default 1536)")
    parser.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    parser.add_argument("--rebuild-image", action="store_true", help="rebuild the cached image")
    parser.add_argument("--quiet", action="store_true", help="do not echo the guest's console")
    args = parser.parse_args(argv)
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if not suites or unknown or len(set(suites)) != len(suites):
        parser.error(f"--suite {args.suite!r}: name bookworm, trixie or both (bookworm,trixie)")
    if len(suites) > 1:
        if args.deb or args.work:
            parser.error("--deb and --work name one release's: give them with one --suite")
        return run_releases(suites, argv if argv is not None else sys.argv[1:])
    suite = suites[0]
    if args.timeout is None:
        args.timeout = 1200.0  # (one guest alone: 24 scenarios took 9-14 minutes)
    if args.work is None:
        args.work = DEFAULT_WORK / f"integration-{suite}"
    began = time.monotonic()
    counts = ""
    try:
        check_tools()
        deb = args.deb.resolve() if args.deb else build_deb(suite)
        if not deb.is_file():
            raise HarnessError(f"no such .deb: {deb}")
        image, how = ensure_image(args.cache, suite, args.rebuild_image)
        image_s = time.monotonic() - began
        log(f"image {image} ({how}); .deb {deb.name}")
        share = prepare_share(args.work, deb, [o.strip() for o in args.only.split(",") if o.strip()])
        overlay = args.work / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image / "disk.raw"), "-F", "raw",
                        str(overlay)], check=True)
        console = args.work / "console.log"
        command = qemu_command(image, overlay, share, args.memory, args.cpus)
        log(f"booting the {suite} guest (TCG, {args.cpus} CPUs, {args.memory} MiB, timeout {args.timeout:.0f}s)")
        guest_began = time.monotonic()
        code, tail = boot(command, console, args.timeout, echo=not args.quiet)
        guest_s = time.monotonic() - guest_began
        overlay.unlink(missing_ok=True)
        plan, found, done = read_results(share / "results")
        if plan:
            counts = f"{sum(1 for n in plan if found.get(n, {}).get('ok'))} passed, " \
                     f"{sum(1 for n in plan if not found.get(n, {}).get('ok'))} failed"
        last = "\n".join(f"  {line}" for line in tail)
        if code is None:
            raise HarnessError(
                f"timeout: the guest ran for {args.timeout:.0f}s without finishing (qemu killed); "
                f"{len(found)} results written{': ' + ', '.join(found) if found else ''}.\n"
                f"Last {CONSOLE_TAIL} lines of the serial console ({console}):\n{last}")
        if not found:
            raise HarnessError(
                f"the guest never wrote results (qemu exited {code} after {guest_s:.0f}s). "
                f"Last {CONSOLE_TAIL} lines of the serial console ({console}):\n{last}")
        print()
        print(table(plan, found))
        print()
        failed = [n for n in plan if not found.get(n, {}).get("ok")]
        log(f"{suite}: wall time {time.monotonic() - began:.0f}s: image {how} ({image_s:.0f}s to ready), guest "
            f"{guest_s:.0f}s (boot, install, scenarios, power-off); results, console.log and the guest's "
            f"journal are in {args.work}")
        counts = f"{len(plan) - len(failed)} passed, {len(failed)} failed"
        if done is None:
            raise HarnessError(f"the guest stopped before finishing (qemu exited {code}; no 'done' marker). "
                               f"Last {CONSOLE_TAIL} lines of the serial console:\n{last}")
        if failed:
            raise HarnessError(f"{len(failed)} of {len(plan)} scenarios failed: {', '.join(failed)}")
        log(f"{suite}: all {len(plan)} scenarios passed")
        return 0
    except HarnessError as exc:
        print(f"integration: FAILED ({suite}): {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # a bug of the harness, or a tool it runs that failed unchecked: say which, once
        traceback.print_exc()
        print(f"integration: FAILED ({suite}): the harness stopped: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        # The closing line CI reads: "N passed, N failed" over the scenarios the guest planned.
        sys.stderr.flush()
        if counts:
            print(f"integration: {counts} ({suite})", flush=True)
        with contextlib.suppress(OSError):
            (args.work / "overlay.qcow2").unlink(missing_ok=True)


def run_releases(suites: list[str], argv: list[str]) -> int:
    """Each release's guest at once, as a run of this script of its own (its .deb, its image, its run directory
    build/integration-<suite>): their lines interleave here, each prefixed by its release, and the exit code is
    the worst. At once, because a TCG guest is idle much of the time its scenarios wait (a burn held to 20 % of a
    CPU, a pool's interval, an idle timeout), so two take little longer than one; the scenarios measure the
    guest's own clocks and kernel, which a busier host does not change."""
    forwarded: list[str] = []
    skip = False
    for arg in argv:  # the same options, minus --suite
        if skip:
            skip = False
        elif arg == "--suite":
            skip = True
        elif not arg.startswith("--suite="):
            forwarded.append(arg)
    if not any(a == "--timeout" or a.startswith("--timeout=") for a in forwarded) \
            and not os.environ.get("ELASTICD_IT_TIMEOUT"):
        # Two TCG guests share the host's cores: each of the last runs took about 1.3 times as long as alone. The 27
        # scenarios took 1,285 s a guest on a fast day (stop 49's run) and 3,325 s on CI's slow one (stop 48's): a
        # guest passing that close to 3,600 s would fail on a slightly slower day. 4,000 still ends a hung guest
        # inside CI's 90 minutes: ./dev test (its two runs at once) and the fresh host took 520 s on the fast day,
        # about 900 s on the slow one, the two .debs and the images a few minutes more.
        forwarded += ["--timeout", "4000"]
    children: dict[str, subprocess.Popen[bytes]] = {}
    lock = threading.Lock()
    counts: dict[str, str] = {}
    # Each child's first "FAILED" line, repeated in the closing lines: CI keeps only the tail of the output, and a
    # release that failed before its table (its .deb, its image, a guest that never wrote results) would otherwise
    # end as "no result" with its reason scrolled away by the other release's lines.
    reasons: dict[str, str] = {}

    def relay(suite: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith("integration: ") and line.endswith(f" ({suite})") and " passed, " in line:
                counts[suite] = line.removeprefix("integration: ").removesuffix(f" ({suite})")
            elif line.startswith(f"integration: FAILED ({suite}): ") and suite not in reasons:
                reasons[suite] = line.removeprefix(f"integration: FAILED ({suite}): ")[:1200]
            with lock:  # one whole line at a time from either
                sys.stdout.write(f"[{suite}] {line}\n")
                sys.stdout.flush()

    def stop_children(signum: int, _frame: object) -> None:
        # A stop of this run (CI's timeout, Ctrl-C) stops both children, which kill their qemu by its pid.
        for process in children.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    # What the children make in the checkout's top directory, made before they start: one's dist/ or build/
    # appearing while the other's .deb build copies the checkout made that copy's tar fail (stop 53's CI).
    for made in (REPO / "dist", DEFAULT_WORK):
        made.mkdir(exist_ok=True)
    for suite in suites:
        # (--suite last: it is the one each child takes)
        children[suite] = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *forwarded,
                                            "--suite", suite], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL)
    relays = [threading.Thread(target=relay, args=item, daemon=True) for item in children.items()]
    for thread in relays:
        thread.start()
    codes = {suite: process.wait() for suite, process in children.items()}
    for thread in relays:
        thread.join(5)
    failed = [suite for suite, code in codes.items() if code != 0]
    log(f"{', '.join(suites)}: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    # The closing line CI reads, over both releases.
    for suite in failed:
        if suite in reasons:
            log(f"{suite} failed: {reasons[suite]}")
    log("; ".join(f"{suite} {counts.get(suite, 'no result')}" for suite in suites))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
