# guest.py: the processes of one condition: pvisor instances (synthetic or KVM guests) and the pool.
"""A synthetic guest (pvisor run --guest synthetic) writes its workload from VMM threads,
verifies it and then answers line commands on its API socket (fill, verify, digest,
poke, stats, quit; one JSON reply line each). A KVM guest runs pvisor-guest, which
reports `PVG {json}` lines on the console (events "ready" with "digest", ...) and
reads commands from it while pvg.hold lasts.
"""
import json
import os
import signal
import socket
import subprocess
import threading
import time

from . import MIB, PAGE

SEED = 42
# Seed of the private write check's bytes: differs from the workload's.
PRIVATE_SEED = 7777


class InstanceError(RuntimeError):
    pass


def api_call(sock_path, line, timeout=300.0):
    """One request line to a pvisor API socket; the JSON reply as a dict."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(line.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    try:
        return json.loads(buf.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise InstanceError(f"no JSON reply to '{line}' from {sock_path}: {buf[:200]!r}")


def log_tail(path, lines=5):
    try:
        with open(path, errors="replace") as f:
            return " | ".join(l.strip() for l in f.read().splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(p, timeout=20.0):
    """SIGTERM, then SIGKILL after timeout; returns the exit code (negative: a signal)."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


class Spec:
    """What one instance holds: workload, sizes and its index (the per-instance seed)."""

    def __init__(self, workload, data_mib, mem_mib, index, dedup, extra=()):
        self.workload, self.data_mib, self.mem_mib = workload, data_mib, mem_mib
        self.index, self.dedup, self.extra = index, dedup, list(extra)
        self.pages = int(data_mib * MIB) // PAGE


class SynthInstance:
    """A host-driven synthetic guest; everything goes through its API socket."""

    def __init__(self, bins, tmp, spec, pool_sock, tag):
        self.spec, self.bins = spec, bins
        self.name = f"vm{spec.index}"
        self.sock = f"{tmp}/{tag}-{self.name}.sock"
        self.log = f"{tmp}/{tag}-{self.name}.log"
        self.pool_sock = pool_sock
        self.proc, self.ready_digest = None, None

    def argv(self):
        s = self.spec
        return [self.bins.vmm, "run", "--guest", "synthetic", "--name", self.name,
                "--dedup", s.dedup, "--pool", self.pool_sock, "--api-sock", self.sock,
                "--mem", f"{s.mem_mib}M", "--workload", s.workload,
                "--data-size", f"{s.data_mib}M", "--seed", str(SEED),
                "--instance", str(s.index), *s.extra]

    def start(self, group):
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen(self.argv(), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=group.enter)

    @property
    def pid(self):
        return self.proc.pid

    def call(self, line, timeout=300.0):
        return api_call(self.sock, line, timeout)

    def poll_ready(self):
        """True once ready; raises InstanceError if the instance died or failed."""
        if self.proc.poll() is not None:
            raise InstanceError(f"{self.name} exited with {self.proc.returncode} before it was "
                                f"ready: {log_tail(self.log)}")
        if not os.path.exists(self.sock):
            return False
        try:
            j = self.call("stats", timeout=10)
        except (OSError, InstanceError):
            return False
        if j.get("ready"):
            d = self.call(f"digest 0 {self.spec.pages}")
            if not d.get("ok"):
                raise InstanceError(f"{self.name}: digest at ready failed: {d.get('error')}")
            self.ready_digest = d["digest"]
            return True
        return False

    def readback(self):
        """Every data byte compared with the workload, then the digest against the ready one."""
        s = self.spec
        t = time.monotonic()
        j = self.call(f"verify 0 {s.pages} {s.workload} {SEED} {s.index}")
        secs = time.monotonic() - t
        if not j.get("ok"):
            raise InstanceError(f"{self.name} read back wrong bytes: {j.get('error')}")
        d = self.call(f"digest 0 {s.pages}")
        if d.get("digest") != self.ready_digest:
            raise InstanceError(f"{self.name}: digest {d.get('digest')} after the window, "
                                f"{self.ready_digest} at ready")
        return secs

    def private_write(self, count):
        """Write this instance's own bytes (unique per instance) over pages [0, count)."""
        j = self.call(f"fill 0 {count} unique-random {PRIVATE_SEED} {self.spec.index}")
        if not j.get("ok"):
            raise InstanceError(f"{self.name}: private write failed: {j.get('error')}")

    def private_check(self, count):
        """Own pages hold own bytes; the rest still holds the workload."""
        s = self.spec
        j = self.call(f"verify 0 {count} unique-random {PRIVATE_SEED} {s.index}")
        if not j.get("ok"):
            raise InstanceError(f"{self.name}: its own write is not what it reads back: "
                                f"{j.get('error')}")
        if count < s.pages:
            j = self.call(f"verify {count} {s.pages - count} {s.workload} {SEED} {s.index}")
            if not j.get("ok"):
                raise InstanceError(f"{self.name}: pages it did not write changed: {j.get('error')}")

    def poke_all(self, offset=0, byte=0xA5):
        """One byte written to every data page (copy-on-write of every shared page)."""
        j = self.call(f"poke 0 {self.spec.pages} {offset} {byte}")
        if not j.get("ok"):
            raise InstanceError(f"{self.name}: poke failed: {j.get('error')}")
        return j.get("ms", 0.0) / 1000.0

    def quit(self, timeout=30.0):
        """Ask the VM to stop; returns its exit code (SIGTERM/SIGKILL if it does not)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=5)
            except (OSError, InstanceError):
                pass
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return stop_process(self.proc, 5)


class KvmInstance:
    """A KVM guest running pvisor-guest (guest/pvisor-guest.c); reports are `PVG {json}` lines.

    Console commands while pvg.hold lasts: verify, write SEED, digest, quit; each is
    answered by an event of the same name with "ok". "digest128" is the XXH3-128 that
    `pvisor ctl digest` gives for a synthetic guest. Untested here: no /dev/kvm.
    """

    def __init__(self, bins, tmp, spec, pool_sock, tag, kvm):
        self.spec, self.bins, self.kvm = spec, bins, kvm
        self.name = f"vm{spec.index}"
        self.log = f"{tmp}/{tag}-{self.name}.log"
        self.pool_sock = pool_sock
        self.proc, self.ready_digest = None, None
        self.events, self.cv = [], threading.Condition()

    def argv(self, hold_s):
        s, k = self.spec, self.kvm
        cmdline = (f"{k['cmdline']} pvg.workload={s.workload} pvg.size={s.data_mib}M "
                   f"pvg.seed={SEED} pvg.instance={s.index} pvg.hold={int(hold_s)} pvg.exit=poweroff")
        argv = [self.bins.vmm, "run", "--guest", "kvm", "--name", self.name, "--dedup", s.dedup,
                "--pool", self.pool_sock, "--mem", f"{s.mem_mib}M", "--kernel", k["kernel"],
                "--cmdline", cmdline, *s.extra]
        if k.get("initrd"):
            argv += ["--initrd", k["initrd"]]
        return argv

    def start(self, group):
        self.proc = subprocess.Popen(self.argv(self.kvm["hold"]), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                     preexec_fn=group.enter)
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        """Console to the log file; PVG lines (kernel messages may come between them) to events."""
        with open(self.log, "wb") as logf:
            for raw in self.proc.stdout:
                logf.write(raw)
                line = raw.decode(errors="replace").strip()
                at = line.find("PVG {")
                if at < 0:
                    continue
                try:
                    ev = json.loads(line[at + 4:])
                except ValueError:
                    continue
                with self.cv:
                    self.events.append(ev)
                    self.cv.notify_all()

    @property
    def pid(self):
        return self.proc.pid

    def _event(self, name, since, timeout):
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for ev in self.events[since:]:
                    if ev.get("event") == "error":
                        raise InstanceError(f"{self.name}: guest error: {ev.get('error')}")
                    if ev.get("event") == name:
                        return ev
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise InstanceError(f"{self.name}: no '{name}' report from the guest "
                                        f"({log_tail(self.log)})")
                self.cv.wait(min(left, 0.5))

    def _command(self, line, timeout=300.0):
        with self.cv:
            since = len(self.events)
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()
        ev = self._event(line.split()[0], since, timeout)
        if not ev.get("ok"):
            raise InstanceError(f"{self.name}: {line}: {ev.get('error') or ev}")
        return ev

    def poll_ready(self):
        if self.proc.poll() is not None:
            raise InstanceError(f"{self.name} exited with {self.proc.returncode} before it was "
                                f"ready: {log_tail(self.log)}")
        with self.cv:
            ev = next((e for e in self.events if e.get("event") == "ready"), None)
            bad = next((e for e in self.events if e.get("event") == "error"), None)
        if bad:
            raise InstanceError(f"{self.name}: guest error: {bad.get('error')}")
        if ev is None:
            return False
        if not ev.get("ok"):
            raise InstanceError(f"{self.name}: guest data did not verify: {ev}")
        self.ready_digest = ev.get("digest128")
        return True

    def readback(self):
        t = time.monotonic()
        self._command("verify")
        secs = time.monotonic() - t
        dig = self._command("digest").get("digest128")
        if dig != self.ready_digest:
            raise InstanceError(f"{self.name}: digest {dig} after the window, {self.ready_digest} at ready")
        return secs

    def private_write(self, count):
        """The guest's `write SEED` overwrites all its data with bytes of its own."""
        self._command(f"write {PRIVATE_SEED}")

    def private_check(self, count):
        """`verify` checks the data against what this guest itself wrote last."""
        self._command("verify")

    def poke_all(self, offset=0, byte=0xA5):
        t = time.monotonic()
        self._command(f"write {PRIVATE_SEED}")
        return time.monotonic() - t

    def quit(self, timeout=30.0):
        """`quit`: the agent ends and /init powers off, so pvisor exits with 0."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                return self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return stop_process(self.proc, 5)


class Pool:
    """pvisor-pool inside the measured group (its store pages are charged there)."""

    def __init__(self, bins, tmp, tag):
        self.bins = bins
        self.sock = f"{tmp}/{tag}-pool.sock"
        self.log = f"{tmp}/{tag}-pool.log"
        self.conf = f"{tmp}/pool.conf"
        self.proc = None

    def start(self, group, timeout=10.0):
        open(self.conf, "w").close()
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen([self.bins.pool, "--config", self.conf, "--socket", self.sock],
                                         stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=group.enter)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise InstanceError(f"pool exited with {self.proc.returncode}: {log_tail(self.log)}")
            if os.path.exists(self.sock) and subprocess.run(
                    [self.bins.pool, "stat", "--socket", self.sock], capture_output=True).returncode == 0:
                return
            time.sleep(0.05)
        raise InstanceError(f"pool did not answer on {self.sock} within {timeout} s")

    @property
    def pid(self):
        return self.proc.pid

    def stats(self):
        p = subprocess.run([self.bins.pool, "stat", "--socket", self.sock, "--json"],
                           capture_output=True, text=True)
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    def stop(self):
        return 0 if self.proc is None else stop_process(self.proc)
