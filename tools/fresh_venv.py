"""A fresh virtual environment that sees the packages of the Python that makes it (its torch),
gpucheck's own left out.

A venv made with ``--system-site-packages`` sees its base interpreter's packages; where that
Python runs inside a virtual environment itself (a user's venv with torch, the GPU machines'
``/opt/torch/.venv``), that environment's packages are shown too: through a .pth file in the
new venv's site-packages naming a folder of links to them (after the venv's own packages).
gpucheck's own entries are left out (:data:`OWN_ENTRIES`): an installed gpucheck would shadow
the one the new venv installs, and its metadata would make pip think it installed already.

The noxfile's sessions see the venv nox runs in this way; ``tools/gpu readme`` runs README's
blocks for GPU machines in such a venv. Standard library only (loaded by path).

Command line: ``python3 tools/fresh_venv.py DIR`` makes the venv DIR so, and prints what it
shares.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

#: the file that shows a venv the packages of another (in the venv's site-packages), and the
#: folder of links to them it names (in the venv's own folder: a short path, as the frames of
#: a traceback through it show it)
OUTER_PTH = "gpucheck-outer-venv.pth"
OUTER_LINKS = "outer-site-packages"
#: the entries of a site-packages folder that are gpucheck's own, whichever way it was
#: installed: its package, its metadata under its distribution's name (torch-gpucheck,
#: gpucheck/_distribution.py) or the older one, an editable install's files; and .pth files,
#: which a folder named by a .pth file does not run
OWN_ENTRIES = re.compile(r"(gpucheck|(torch_)?gpucheck-.*|__editable__.*|.*\.pth)", re.I)


def outer_scripts() -> str | None:
    """The scripts folder of the virtual environment this Python runs in (py-spy, ninja, ...:
    what its packages run as commands), or None outside one."""
    return sysconfig.get_paths()["scripts"] if sys.prefix != sys.base_prefix else None


def outer_site_packages() -> list[str]:
    """The site-packages of the virtual environment this Python runs in; none outside one
    (then --system-site-packages already shows its packages)."""
    if sys.prefix == sys.base_prefix:
        return []
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def write_outer_pth(site_packages: Path, outer: list[str]) -> Path | None:
    """Make a venv whose site-packages is ``site_packages`` see the packages of the folders
    ``outer`` after its own (see the module's docstring). Returns the .pth file written, or
    None where there is nothing to show (an earlier one removed)."""
    lib = site_packages.parent.parent  # venv/lib/pythonX.Y/site-packages
    pth, links = site_packages / OUTER_PTH, (lib.parent if lib.name == "lib" else lib) / OUTER_LINKS
    shutil.rmtree(links, ignore_errors=True)  # links only: what they point to stays
    if not outer:
        pth.unlink(missing_ok=True)
        return None
    links.mkdir()
    for folder in map(Path, outer):
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not OWN_ENTRIES.fullmatch(entry.name) and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    pth.write_text(f"{links}\n")
    return pth


def site_packages(python: Path | str) -> Path:
    """The site-packages folder of the Python ``python`` (a venv's)."""
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(purelib.stdout.strip())


def make(where: Path) -> Path:
    """The venv ``where``, made with this Python and --system-site-packages, seeing this
    Python's own venv too; returns its python. Where this Python's base has no ensurepip
    (a venv made by another tool), the venv is made without pip: the shared one's serves."""
    made = [sys.executable, "-m", "venv", "--system-site-packages", str(where)]
    if subprocess.run(made).returncode != 0:
        subprocess.run([*made, "--without-pip"], check=True)
    python = where / "bin" / "python"
    write_outer_pth(site_packages(python), outer_site_packages())
    return python


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: fresh_venv.py DIR", file=sys.stderr)
        return 2
    python = make(Path(argv[0]))
    shared = outer_site_packages()
    print(f"{python}: this Python's packages{' and ' + ', '.join(shared) if shared else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
