"""The twin's ``pynvml`` (``powerflow.lab.twin.nvml_shim``) as the agent of the product's
image meets it: mounted in place of nvidia-ml-py's ``pynvml.py``, under the agent's real
NVML class (``powerflow.nodeagent.nvml.NvmlGpus``), on a ``GpuServer``'s ``TwinGpus``.

Each check runs in a subprocess that imports the shim as ``pynvml``: a copy named
``pynvml.py`` first on its path, as the mount puts it over site-packages; or, for the
standard-library-only checks, loaded by path into ``python -I -S``, which sees no
site-packages and so no PowerFlow. The GPUs and the server's journal stay here, where
the test reads what the driver side saw.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from operator_cases import clean_env
from powerflow.nodeagent.nvml_errors import map_nvml_error
from support.nvml_library import has_nvml_library
from support.operator_harness import write_kubeconfig

from powerflow.lab.twin import nvml_shim
from powerflow.lab.twin.agentproc import GpuServer
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.lab.twin.ports import free_port

SHIM = Path(nvml_shim.__file__)
NODE = "n"


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[GpuServer, TwinGpus, Path]]:
    """A GPU server of one two-GPU node, and its endpoint file for the shim."""
    gpus = TwinGpus(2, node=NODE, seed=0, clock=time.monotonic)
    server = GpuServer({NODE: gpus}, tmp_path / "key").start()
    try:
        yield server, gpus, server.endpoint_file(NODE, tmp_path / "run" / "gpus.json")
    finally:
        server.stop()


def _mounted(tmp_path: Path) -> Path:
    """A folder holding the shim as ``pynvml.py`` (what the runtime's mount makes)."""
    folder = tmp_path / "site"
    folder.mkdir(exist_ok=True)
    shutil.copyfile(SHIM, folder / "pynvml.py")
    return folder


def _python(
    tmp_path: Path,
    code: str,
    endpoint: Path,
    *,
    stdlib_only: bool = False,
    argv: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (or ``-m ARGV`` when ``argv`` is given) with the shim as ``pynvml``,
    under ``prefix`` (a command that runs the rest, such as ``setpriv``)."""
    folder = _mounted(tmp_path)
    env = clean_env()
    env[nvml_shim.ENDPOINT_ENV] = str(endpoint)
    if stdlib_only:  # the shim loaded by path: -I ignores PYTHONPATH, -S every site-package
        loader = textwrap.dedent(f"""
            import importlib.util, sys
            spec = importlib.util.spec_from_file_location("pynvml", {str(folder / "pynvml.py")!r})
            pynvml = importlib.util.module_from_spec(spec)
            sys.modules["pynvml"] = pynvml
            spec.loader.exec_module(pynvml)
        """)
        command = [sys.executable, "-I", "-S", "-c", loader + textwrap.dedent(code)]
    else:
        env["PYTHONPATH"] = str(folder)
        check = f"import pynvml; assert pynvml.__file__ == {str(folder / 'pynvml.py')!r}\n"
        command = [sys.executable, *argv] if argv else [sys.executable, "-c", check + code]
    return subprocess.run(
        [*prefix, *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


AGENT = """
import json, time
from powerflow.nodeagent.nvml import NvmlGpus

out = {}
with NvmlGpus() as g:
    out["gpus"] = [[i.index, i.uuid, i.name] for i in g.gpus()]
    out["clocks"] = [list(g.supported_graphics_clocks_mhz(i)) for i in (0, 1)]
    out["sm_before"] = g.sm_clock_mhz(0)
    g.lock_clocks_mhz(0, 900, 1200)
    out["sm_locked"] = g.sm_clock_mhz(0)
    g.reset_clocks(0)
    out["sm_reset"] = g.sm_clock_mhz(0)
    r = g.power_limit_range_w(1)
    out["range"] = [r.min_w, r.max_w, r.default_w]
    out["limit_before"] = g.power_limit_w(1)
    g.set_power_limit_w(1, 250.5)
    out["limit_set"] = g.power_limit_w(1)
    g.reset_power_limit(1)
    out["limit_reset"] = g.power_limit_w(1)
    first = g.total_energy_mj(0)
    time.sleep(0.3)
    out["energy"] = [first, g.total_energy_mj(0)]
    out["power_mw"] = g.power_mw(0)
    g.lock_clocks_mhz(1, 600, 600)  # left so: the GPU keeps it after the agent
print(json.dumps(out))
"""


def test_the_agents_nvml_class_drives_the_twins_gpus(
    twin: tuple[GpuServer, TwinGpus, Path], tmp_path: Path
) -> None:
    server, gpus, endpoint = twin
    out = _json(_python(tmp_path, AGENT, endpoint))
    assert out["gpus"] == [[i.index, i.uuid, i.name] for i in gpus.gpus()]
    assert out["gpus"][0][1].startswith("GPU-")
    assert out["clocks"] == [list(gpus.supported_graphics_clocks_mhz(0))] * 2
    assert out["clocks"][0][:2] == [210, 225] and out["clocks"][0][-1] == 1410
    # An idle GPU runs its lowest clock, within a lock the lowest clock of the range.
    assert (out["sm_before"], out["sm_locked"], out["sm_reset"]) == (210, 900, 210)
    assert out["range"] == [100.0, 400.0, 400.0]  # W, from NVML's mW
    assert (out["limit_before"], out["limit_set"], out["limit_reset"]) == (400.0, 250.5, 400.0)
    first, then = out["energy"]
    assert then > first  # mJ: an idle A100 draws about 52 W, 0.3 s of it about 16 J
    assert 10_000 < then - first < 40_000
    assert 40_000 < out["power_mw"] < 70_000
    # The driver's side: every setting journaled, in order; the last one kept.
    assert [(s.node, s.gpu, s.call, s.args) for s in server.journal] == [
        (NODE, 0, "lock_clocks_mhz", (900, 1200)),
        (NODE, 0, "reset_clocks", ()),
        (NODE, 1, "set_power_limit_w", (250.5,)),
        (NODE, 1, "reset_power_limit", ()),  # NVML's reset: the default limit set
        (NODE, 1, "lock_clocks_mhz", (600, 600)),
    ]
    assert gpus.sm_clock_mhz(1) == 600 and gpus.power_limit_w(1) == 400.0


DIRECT = """
import json, sys

def error(call, *args):
    try:
        call(*args)
    except pynvml.NVMLError as err:
        assert err == pynvml.NVMLError(err.value) and isinstance(err, pynvml.NVMLError)
        return [type(err).__name__, err.value, str(err)]
    return None

out = {"before": error(pynvml.nvmlDeviceGetCount)}
pynvml.nvmlInit()
pynvml.nvmlInit()  # counted, as NVML counts them
h = pynvml.nvmlDeviceGetHandleByIndex(1)
out["count"] = pynvml.nvmlDeviceGetCount()
out["types"] = [type(pynvml.nvmlDeviceGetName(h)).__name__,
                type(pynvml.nvmlDeviceGetUUID(h)).__name__]
memory = pynvml.nvmlDeviceGetSupportedMemoryClocks(h)
out["memory"] = memory
clocks = pynvml.nvmlDeviceGetSupportedGraphicsClocks(h, max(memory))
out["clocks"] = [clocks[0], clocks[-1], len(clocks)]
out["limits_mw"] = [pynvml.nvmlDeviceGetPowerManagementLimit(h),
                    pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
                    pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)]
pynvml.nvmlDeviceSetPowerManagementLimit(h, 300000)
out["limit_mw"] = pynvml.nvmlDeviceGetPowerManagementLimit(h)
pynvml.nvmlDeviceSetGpuLockedClocks(h, 1005, 1005)
out["sm"] = [pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
             pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)]
out["energy"] = type(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)).__name__
out["errors"] = {
    "lo above hi": error(pynvml.nvmlDeviceSetGpuLockedClocks, h, 1410, 900),
    "zero clock": error(pynvml.nvmlDeviceSetGpuLockedClocks, h, 0, 900),
    "negative clock": error(pynvml.nvmlDeviceSetGpuLockedClocks, h, -1, 900),
    "limit too high": error(pynvml.nvmlDeviceSetPowerManagementLimit, h, 400001),
    "limit too low": error(pynvml.nvmlDeviceSetPowerManagementLimit, h, 99999),
    "no such GPU": error(pynvml.nvmlDeviceGetHandleByIndex, 2),
    "memory clock": error(pynvml.nvmlDeviceGetSupportedGraphicsClocks, h, 1000),
    "video clock": error(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_VIDEO),
    "not a handle": error(pynvml.nvmlDeviceGetPowerUsage, 1),
}
pynvml.nvmlShutdown()
out["after one shutdown"] = pynvml.nvmlDeviceGetPowerUsage(h) > 0
pynvml.nvmlShutdown()
out["after"] = error(pynvml.nvmlDeviceGetPowerUsage, h)
out["shutdown again"] = error(pynvml.nvmlShutdown)
out["classes"] = [type(pynvml.NVMLError(code)).__name__ for code in (4, 12, 18, 999, 12345)]
out["no argument"] = type(pynvml.NVMLError_LibraryNotFound()).__name__
out["modules"] = sorted(
    name for name in sys.modules
    if name.partition(".")[0] not in sys.stdlib_module_names
    and name not in ("__main__", "__mp_main__", "pynvml")  # __mp_main__: __main__ again
)
try:
    import powerflow
    out["powerflow"] = powerflow.__file__
except ImportError:
    out["powerflow"] = None
print(json.dumps(out))
"""


def test_with_only_the_standard_library_the_shim_answers_as_nvml(
    twin: tuple[GpuServer, TwinGpus, Path], tmp_path: Path
) -> None:
    """Units, types, NVML's error codes for what the driver refuses, the counted
    init; and nothing but the standard library loaded, PowerFlow not even reachable."""
    server, gpus, endpoint = twin
    out = _json(_python(tmp_path, DIRECT, endpoint, stdlib_only=True))
    assert out["powerflow"] is None and out["modules"] == []
    assert out["before"] == ["NVMLError_Uninitialized", 1, "Uninitialized"]
    assert out["count"] == 2 and out["types"] == ["str", "str"]
    assert out["memory"] == [nvml_shim.MEMORY_CLOCK_MHZ]
    assert out["clocks"] == [1410, 210, 81]  # NVML lists the highest first
    assert out["limits_mw"] == [400_000, 400_000, [100_000, 400_000]]
    assert out["limit_mw"] == 300_000 and gpus.power_limit_w(1) == 300.0
    assert out["sm"] == [1005, nvml_shim.MEMORY_CLOCK_MHZ] and out["energy"] == "int"
    invalid = ["NVMLError_InvalidArgument", 2, "Invalid Argument"]
    assert out["errors"] == {
        "lo above hi": invalid,
        "zero clock": invalid,
        "negative clock": invalid,  # ctypes makes -1 4294967295, above 900
        "limit too high": invalid,
        "limit too low": invalid,
        "no such GPU": invalid,
        "memory clock": ["NVMLError_NotFound", 6, "Not Found"],
        "video clock": ["NVMLError_NotSupported", 3, "Not Supported"],
        "not a handle": invalid,
    }
    assert out["after one shutdown"] is True
    assert out["after"] == out["shutdown again"] == out["before"]
    assert out["classes"] == [
        "NVMLError_NoPermission",
        "NVMLError_LibraryNotFound",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_Unknown",
        "NVMLError",
    ]
    assert out["no argument"] == "NVMLError_LibraryNotFound"
    # Only what the driver accepted reached the GPUs.
    assert [(s.gpu, s.call, s.args) for s in server.journal] == [
        (1, "set_power_limit_w", (300.0,)),
        (1, "lock_clocks_mhz", (1005, 1005)),
    ]


def test_the_shims_names_and_codes_are_nvidia_ml_pys() -> None:
    """Every name the agent uses exists in both, with the same value; so do the error
    classes, and ``NVMLError(code)`` picks the same class and message."""
    names = [n for n in dir(pynvml) if n.startswith(("NVML_ERROR_", "NVML_CLOCK_"))]
    names = [n for n in names if not n.startswith("NVML_CLOCK_ID_")]
    names = [n for n in names if not n.startswith("NVML_CLOCK_LIMIT_")]
    assert names and all(getattr(nvml_shim, n) == getattr(pynvml, n) for n in names)
    for code in range(31):
        ours, theirs = nvml_shim.NVMLError(code), pynvml.NVMLError(code)
        assert type(ours).__name__ == type(theirs).__name__
        if code in pynvml.NVMLError._errcode_to_string:
            assert str(ours) == str(theirs)
    used = [
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetSupportedMemoryClocks",
        "nvmlDeviceGetSupportedGraphicsClocks",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetClockInfo",
    ]
    for name in used:
        assert callable(getattr(nvml_shim, name)) and callable(getattr(pynvml, name))
    source = "".join(
        (Path(__file__).parents[1] / "nodeagent" / f).read_text()
        for f in ("nvml.py", "nvml_errors.py", "probe.py")
    )
    assert {n for n in used if f"pynvml.{n}(" in source} == set(used)


def test_no_endpoint_file_is_the_agents_one_line_for_a_node_without_a_driver(
    tmp_path: Path,
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    argv: tuple[str, ...] = ("-m", "powerflow", "nodeagent", "--kubeconfig", str(kubeconfig))
    argv += ("--node-name", NODE, "--once")
    done = _python(tmp_path, "", tmp_path / "missing.json", argv=argv)
    assert done.returncode == 2, done.stderr
    # The line NvmlGpus makes of nvidia-ml-py's own error when libnvidia-ml is missing.
    real = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    expected = f"powerflow nodeagent: error: {map_nvml_error(real, None)}"
    assert done.stderr.strip().splitlines() == [expected]
    assert "libnvidia-ml.so.1 not found" in expected
    if not has_nvml_library():  # and the real nvidia-ml-py on this machine says the same
        env = clean_env()
        real_run = subprocess.run(
            [sys.executable, *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (real_run.returncode, real_run.stderr) == (2, done.stderr)


CONNECT = """
import json
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(json.dumps([type(err).__name__, err.__notes__]))
else:
    print(json.dumps(["no error", pynvml.nvmlDeviceGetCount()]))
"""


def _endpoint(path: Path, address: str, node: str, key: str) -> Path:
    path.write_text(json.dumps({"address": address, "node": node, "key": key}))
    return path


def test_a_server_that_does_not_answer_is_a_driver_not_loaded(
    twin: tuple[GpuServer, TwinGpus, Path], tmp_path: Path
) -> None:
    server, _, endpoint = twin
    key = server.key.hex()
    cases = {
        "refused": (f"127.0.0.1:{free_port()}", NODE, key),
        "wrong key": (server.address, NODE, "00" * 32),
        "other node": (server.address, "elsewhere", key),
    }
    for why, (address, node, secret) in cases.items():
        path = _endpoint(tmp_path / f"{why}.json", address, node, secret)
        name, notes = _json(_python(tmp_path, CONNECT, path, stdlib_only=True))
        assert name == "NVMLError_DriverNotLoaded", why
        assert notes[0].startswith(f"PowerFlow twin: GPU server {address} for node '{node}': ")
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{")
    name, notes = _json(_python(tmp_path, CONNECT, garbled, stdlib_only=True))
    assert name == "NVMLError_Unknown" and str(garbled) in notes[0]
    assert _json(_python(tmp_path, CONNECT, endpoint, stdlib_only=True)) == ["no error", 2]


def test_a_server_gone_after_init_is_a_lost_gpu(tmp_path: Path) -> None:
    gpus = TwinGpus(1, node=NODE, seed=0, clock=time.monotonic)
    server = GpuServer({NODE: gpus}, tmp_path / "key").start()
    endpoint = server.endpoint_file(NODE, tmp_path / "gpus.json")
    code = """
        import json, sys
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        print("ready", flush=True)
        sys.stdin.readline()
        try:  # a stopped server answers a connection's next request, then closes it
            for _ in range(3):
                pynvml.nvmlDeviceGetPowerUsage(h)
        except pynvml.NVMLError as err:
            print(json.dumps(type(err).__name__))
    """
    folder = _mounted(tmp_path)
    env = {**clean_env(), "PYTHONPATH": str(folder), nvml_shim.ENDPOINT_ENV: str(endpoint)}
    with subprocess.Popen(
        [sys.executable, "-c", "import pynvml\n" + textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "ready"
            server.stop()
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == "NVMLError_GpuIsLost"
        finally:
            proc.kill()
            server.stop()


def test_the_endpoint_file_and_the_host(tmp_path: Path) -> None:
    """A server on every interface (what an agent in another network namespace needs),
    and an endpoint file naming where to dial it."""
    gpus = TwinGpus(1, node=NODE, seed=0, clock=time.monotonic)
    server = GpuServer({NODE: gpus}, tmp_path / "key", host="0.0.0.0").start()
    try:
        assert server.address.startswith("0.0.0.0:")
        path = server.endpoint_file(NODE, tmp_path / "run" / "powerflow-twin" / "gpus.json")
        body = json.loads(path.read_text())
        assert body == {"address": server.address, "node": NODE, "key": server.key.hex()}
        assert bytes.fromhex(body["key"]) == (tmp_path / "key").read_bytes()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert sorted(os.listdir(path.parent)) == ["gpus.json"]  # no part file left
        assert _json(_python(tmp_path, CONNECT, path, stdlib_only=True)) == ["no error", 1]
        port = server.address.rpartition(":")[2]
        other = server.endpoint_file(NODE, path, address=f"127.0.0.1:{port}")
        assert json.loads(other.read_text())["address"] == f"127.0.0.1:{port}"
        assert _json(_python(tmp_path, CONNECT, other, stdlib_only=True)) == ["no error", 1]
        with pytest.raises(ValueError, match="no GPUs served for node 'elsewhere'"):
            server.endpoint_file("elsewhere", tmp_path / "x.json")
    finally:
        server.stop()


UNPRIVILEGED = """
import json
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"read": pynvml.nvmlDeviceGetPowerManagementLimit(h) > 0}
for name, call in (
    ("lock", lambda: pynvml.nvmlDeviceSetGpuLockedClocks(h, 900, 900)),
    ("reset", lambda: pynvml.nvmlDeviceResetGpuLockedClocks(h)),
    ("limit", lambda: pynvml.nvmlDeviceSetPowerManagementLimit(h, 250000)),
):
    try:
        call()
        out[name] = "set"
    except pynvml.NVMLError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


def test_without_cap_sys_admin_settings_are_refused_as_the_driver_refuses_them(
    twin: tuple[GpuServer, TwinGpus, Path], tmp_path: Path
) -> None:
    """Reading is anyone's; locking clocks and setting limits need CAP_SYS_ADMIN, so a
    chart that dropped it from the agent would fail on the twin as on a node. Run with
    every capability dropped (``setpriv``, as root) or as this unprivileged user."""
    server, _, endpoint = twin
    drop = ("setpriv", "--inh-caps=-all", "--bounding-set=-all", "--")
    done = _python(tmp_path, UNPRIVILEGED, endpoint, prefix=drop if os.geteuid() == 0 else ())
    before = len(server.journal)
    out = _json(done)
    assert out == {
        "read": True,
        "lock": "NVMLError_NoPermission",
        "reset": "NVMLError_NoPermission",
        "limit": "NVMLError_NoPermission",
    }
    assert len(server.journal) == before
