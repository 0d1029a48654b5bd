"""The chart twin's container runtime: a container of the built image, as a process.

What a CRI runtime gives a container, done with the machine's own tools (root
needed): the image's root filesystem (``buildah mount`` of one working
container of the image, shared read-only as the lower layer of an overlay per
container, whose upper layer takes the container's writes unless
``readOnlyRootFilesystem`` makes it read-only); a mount namespace with
``/proc``, a small ``/dev``, ``/sys`` read-only, and the pod's volumes
bind-mounted at their ``mountPath`` (read-only where the pod says so); a PID
namespace, in which the command is PID 1 (a SIGTERM reaches it only if it
handles SIGTERM, as in a container); the node's network namespace
(``netns``); the user and group (``runAsUser``/``runAsGroup``, else the
image's ``USER``), no supplementary groups, the capabilities the container's
``securityContext`` keeps (``drop: [ALL]`` and ``add``; a non-root user keeps
none) and ``no_new_privs`` for ``allowPrivilegeEscalation: false``; the
command resolved as the kubelet resolves it (``command`` replaces the image's
``ENTRYPOINT``, ``args`` its ``CMD``); the image's environment under the pod's.

What it does not imitate: cgroups (no CPU or memory limits: a container over
its ``limits.memory`` is not OOM-killed), seccomp profiles, AppArmor,
SELinux, user namespaces, and image pulls (every ``image:`` of the chart's
own containers is the one built image).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

STORE = ("--storage-driver", "vfs")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


@dataclass(frozen=True)
class Image:
    """A built image, mounted: its root filesystem and its config."""

    ref: str
    container: str
    """The buildah working container whose mount is ``rootfs``."""
    rootfs: Path
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    user: str

    @classmethod
    def mount(cls, ref: str) -> Image:
        """``buildah from`` the image (never pulled: it must be built here) and mount it."""
        container = _buildah("from", "--pull=never", "-q", ref).strip()
        try:
            rootfs = Path(_buildah("mount", container).strip())
            config = json.loads(_buildah("inspect", "--type", "image", ref))["OCIv1"]["config"]
        except BaseException:
            _buildah("rm", container)
            raise
        env = tuple((k, v) for k, _, v in (e.partition("=") for e in config.get("Env") or []))
        return cls(
            ref,
            container,
            rootfs,
            tuple(config.get("Entrypoint") or ()),
            tuple(config.get("Cmd") or ()),
            env,
            str(config.get("User") or "0"),
        )

    def unmount(self) -> None:
        _buildah("rm", self.container)

    def ids(self, user: int | None, group: int | None) -> tuple[int, int]:
        """The container's uid and gid: ``runAsUser``/``runAsGroup`` over the image's
        ``USER`` (a name is looked up in the image's ``/etc/passwd``)."""
        name, _, gname = self.user.partition(":")
        passwd = _table(self.rootfs / "etc/passwd")
        image_uid = int(name) if name.isdigit() else int(passwd.get(name, ("0", "0"))[0])
        uid = image_uid if user is None else user
        if group is not None:
            return uid, group
        if gname.isdigit() and user is None:
            return uid, int(gname)
        for entry_uid, entry_gid in passwd.values():
            if int(entry_uid) == uid:
                return uid, int(entry_gid)
        return uid, 0


def _table(path: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 4:
            out[fields[0]] = (fields[2], fields[3])
    return out


def _buildah(*args: str) -> str:
    return subprocess.run(
        ["buildah", *STORE, *args], check=True, capture_output=True, text=True
    ).stdout


def argv_of(image: Image, command: Sequence[str] | None, args: Sequence[str] | None) -> list[str]:
    """The kubelet's rule: ``command`` replaces ENTRYPOINT (and drops CMD), ``args``
    replaces CMD; ``$(VAR)`` references are expanded by the caller (``expand``)."""
    entry = list(command) if command else list(image.entrypoint)
    rest = list(args) if args is not None else ([] if command else list(image.cmd))
    return entry + rest


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion``):
    ``$(NAME)`` of a known variable is its value, ``$$`` is ``$``, anything else stays."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) > 0:
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Spec:
    """One container, resolved: what ``Container`` runs."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    uid: int
    gid: int
    read_only_root: bool
    no_new_privs: bool
    capabilities: tuple[str, ...]
    """Kept capabilities, lower case without ``cap_`` (``sys_admin``)."""
    mounts: tuple[Mount, ...]


class Container:
    """One run of a container: ``start()``, ``exited()``, ``exec``, ``stop``."""

    def __init__(self, image: Image, spec: Spec, netns: str | None, scratch: Path) -> None:
        self.image, self.spec, self.netns, self.scratch = image, spec, netns, scratch
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = scratch / "log"
        self._log: IO[bytes] | None = None
        self.exec_output = b""
        """The last ``exec``'s output (its end): what ``kubectl describe`` shows of a
        failed exec probe."""

    def script(self) -> str:
        """The shell script that sets the container up in its new namespaces (host paths,
        as root) and ends in ``exec chroot ROOT setpriv ... -- ARGV``."""
        s, q = self.spec, shlex.quote
        root, upper, work = (self.scratch / d for d in ("root", "upper", "work"))
        lines = [
            "set -e",
            f"mount -t overlay overlay -o lowerdir={self.image.rootfs},"
            f"upperdir={upper},workdir={work} {root}",
            f"mkdir -p {root}/proc {root}/dev {root}/sys {root}/tmp",
            f"mount -t proc proc {root}/proc",
            f"mount -t tmpfs -o mode=755,nosuid tmpfs {root}/dev",
            f"mkdir -p {root}/dev/shm {root}/dev/pts",
            f"mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs {root}/dev/shm",
            f"ln -s /proc/self/fd {root}/dev/fd",
        ]
        for dev in DEVICES:
            lines.append(f"touch {root}/dev/{dev} && mount --bind /dev/{dev} {root}/dev/{dev}")
        lines.append(f"mount --rbind /sys {root}/sys && mount -o remount,bind,ro {root}/sys")
        for m in s.mounts:
            target = q(f"{root}{inside(self.image.rootfs, m.target)}")
            make = (
                f"mkdir -p {target}"
                if m.source.is_dir()
                else (f"mkdir -p $(dirname {target}) && touch {target}")
            )
            lines.append(f"{make} && mount --bind {q(str(m.source))} {target}")
            if m.read_only:
                lines.append(f"mount -o remount,bind,ro {target}")
        if s.read_only_root:
            lines.append(f"mount -o remount,ro {root}")
        keep = ",".join(f"+{c}" for c in s.capabilities) if s.uid == 0 else ""
        priv = [
            "/usr/bin/setpriv",
            f"--reuid={s.uid}",
            f"--regid={s.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            f"--bounding-set=-all{',' + keep if keep else ''}",
        ]
        if s.no_new_privs:
            priv.append("--no-new-privs")
        argv = " ".join(q(a) for a in s.argv)
        lines.append(f"exec chroot {root} {' '.join(priv)} -- {argv}")
        return "\n".join(lines)

    def start(self) -> None:
        for d in ("root", "upper", "work"):
            (self.scratch / d).mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        unshare = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
        ]
        # ``nsenter`` joins the node's network namespace (``unshare --net=FILE`` would
        # make a new one and bind it there).
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        self.proc = subprocess.Popen(
            [*enter, *unshare, "/bin/sh", "-c", self.script()],
            env=dict(self.spec.env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pid(self) -> int | None:
        """The container's PID 1, as this machine numbers it (``unshare``'s child)."""
        if self.proc is None:
            return None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return None
        first = children.split()
        return int(first[0]) if first else None

    def exited(self) -> int | None:
        """The exit status once it ended (a signal ``s`` is ``128 + s``, as the runtime
        reports it), else None."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        self._close_log()
        return 128 - rc if rc < 0 else rc

    def exec(self, argv: Sequence[str], timeout_s: float) -> int:
        """Run ``argv`` in the running container (its namespaces, root, user): an exec
        probe. A probe over its timeout counts as failed (returns -1)."""
        pid = self.pid()
        if pid is None:
            return -1
        s = self.spec
        try:
            done = subprocess.run(
                [
                    "nsenter",
                    f"--target={pid}",
                    "--mount",
                    "--net",
                    "--pid",
                    "--root",
                    "--wd",
                    f"--setuid={s.uid}",
                    f"--setgid={s.gid}",
                    "--",
                    *argv,
                ],
                env=dict(s.env),
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return -1
        self.exec_output = done.stdout[-2000:] + done.stderr[-2000:]
        return done.returncode

    def stop(self, grace_s: float) -> None:
        """SIGTERM to PID 1, SIGKILL after ``grace_s``: the kubelet's stop."""
        pid = self.pid()
        if self.proc is None or self.proc.poll() is not None:
            self._close_log()
            return
        if pid is not None:
            _kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            if (pid := self.pid()) is not None:
                _kill(pid, signal.SIGKILL)
            _kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def inside(rootfs: Path, path: str) -> str:
    """``path`` with the image's symbolic links resolved within ``rootfs`` (as the
    runtime resolves a mount target in the container's root: ``/var/run`` is a link
    to ``/run`` in Debian, and must not lead to this machine's ``/run``)."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        here = rootfs.joinpath(*done, part)
        if here.is_symlink() and hops < 40:
            hops += 1
            link = os.readlink(here)
            parts = [p for p in link.split("/") if p] + parts
            if link.startswith("/"):
                done = []
            continue
        done.append(part)
    return "/" + "/".join(done)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
