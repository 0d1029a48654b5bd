"""Strip a Python environment's shared objects of what nothing loads (the image's build).

Wheels ship their extension modules and libraries with symbol tables and debug
sections; ``strip --strip-unneeded`` drops them (about 30 MB of the image).
Some files do not survive it: libraries auditwheel patched with patchelf (numpy's
OpenBLAS in ``numpy.libs/``, numba's ``omppool``) then fail to load ("ELF load
command address/offset not page-aligned"). So each file is stripped, loaded in a
fresh interpreter, and put back as it was unless the stripped file loads.

    python3 scripts/strip-shared.py PREFIX
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

LOAD = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"


def loads(lib: Path) -> bool:
    done = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True)
    return done.returncode == 0


def main(prefix: str) -> int:
    libs = sorted(
        p
        for p in Path(prefix).rglob("*.so*")
        if p.is_file() and not p.is_symlink() and ".so" in p.suffixes
    )
    before = after = 0
    kept = []
    for lib in libs:
        size = lib.stat().st_size
        before += size
        backup = lib.with_name(lib.name + ".unstripped")
        shutil.copy2(lib, backup)
        stripped = subprocess.run(["strip", "--strip-unneeded", str(lib)], capture_output=True)
        if stripped.returncode != 0 or not loads(lib):
            shutil.move(backup, lib)
            kept.append(lib.name)
        else:
            backup.unlink()
        after += lib.stat().st_size
    print(
        f"stripped {len(libs) - len(kept)} of {len(libs)} shared objects: "
        f"{before / 1e6:.0f} -> {after / 1e6:.0f} MB; kept as they were: {', '.join(kept) or '-'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
