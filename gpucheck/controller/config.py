"""What a run is before it starts: its settings (``RunConfig``), its output folder, its
targets, its passes, its header record, and the refusals of options that cannot apply.
Shared by the single-process controller (:mod:`~gpucheck.controller.pipeline`) and the
distributed one (:mod:`~gpucheck.controller.dist_pipeline`)."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import gpucheck
from gpucheck.controller import suites as suites_mod
from gpucheck.errors import EnvironmentProblem, UsageProblem
from gpucheck.model import clock, modes, results
from gpucheck.model.layout import DEFAULT_REPORTS, RESULTS
from gpucheck.model.modes import PLAIN, Mode, tool_of
from gpucheck.model.runlog import RunHeader, RunLog
from gpucheck.model.settings import RunSettings
from gpucheck.model.timeline import DEFAULT_INTERVAL_S

if TYPE_CHECKING:  # the run's first worker starts before these are imported (docs/architecture.md)
    from rich.console import Console

    from gpucheck.devices import Inventory

DEFAULT_MODES = PLAIN
#: the mode label of a distributed pass (records of gpucheck.controller.dist_pipeline)
DIST_MODE = modes.DIST


@dataclass
class RunConfig:
    all_devices: bool = False
    devices: tuple[int, ...] = ()
    suites: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    out: Path | None = None
    timeout: float = 900.0
    quiet: bool = False
    cpu_only: bool = False
    pytest_args: list[str] = field(default_factory=list)
    nvml_interval: float = DEFAULT_INTERVAL_S
    allow_empty: bool = False
    resume: Path | None = None
    suite_paths: dict[str, Path] | None = None  # resolved suites (set when resuming)
    distributed: bool = False  # one rank per device through torch.distributed
    world_size: int | None = None  # ranks of a --distributed --cpu-only run (default 2)
    backend: str | None = None  # torch.distributed backend (default nccl on GPUs, else gloo)
    formats: tuple[str, ...] = ()  # reports to write (default: layout.DEFAULT_REPORTS)
    #: seconds to wait for target GPUs another gpucheck run holds (0: refuse at once;
    #: gpucheck.controller.devlock); not a setting of the run, so --resume takes it too
    wait_for_devices: float = 0.0
    #: the options the user gave on the command line (``--nvml-interval``, ...): a default
    #: cannot be told apart from the same value given, and a given option must apply
    given: frozenset[str] = frozenset()
    #: ``--shard I/N`` (index, count) and the earlier run it balances by (gpucheck.model.shard)
    shard: tuple[int, int] | None = None
    durations: Path | None = None
    #: ``--ray [ADDRESS]``: the Ray cluster to run on ("local": a local instance;
    #: gpucheck.controller.fleet); kept by --resume unless given again
    ray: str | None = None

    @property
    def report_formats(self) -> tuple[str, ...]:
        return self.formats or DEFAULT_REPORTS


#: what ``[tool.gpucheck]`` of pyproject.toml may set: the defaults of ``gpucheck run``'s
#: ``--suite``, ``--mode``, ``--timeout`` and ``--format`` (given options override them)
PROJECT_KEYS = ("suites", "modes", "timeout", "formats")


def project_settings(
    folder: Path, mode_choices: tuple[str, ...], format_choices: tuple[str, ...]
) -> dict[str, Any]:
    """``[tool.gpucheck]`` of ``folder/pyproject.toml``, checked (empty without one).

    Raises:
        UsageProblem: the file is not TOML, or the table holds a key or a value that
            ``gpucheck run`` would not take (one sentence naming it).
    """
    path = folder / "pyproject.toml"
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("gpucheck", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageProblem(f"cannot read the [tool.gpucheck] settings of {path}: {err}") from err
    where = f"[tool.gpucheck] of {path}"
    if not isinstance(table, dict):
        raise UsageProblem(f"{where} must be a table")
    unknown = sorted(set(table) - set(PROJECT_KEYS))
    if unknown:
        raise UsageProblem(
            f"{where} has unknown setting(s) {', '.join(unknown)}; known: {', '.join(PROJECT_KEYS)}"
        )
    out: dict[str, Any] = {}
    lists: tuple[tuple[str, tuple[str, ...] | None], ...] = (
        ("suites", None),
        ("modes", mode_choices),
        ("formats", format_choices),
    )
    for key, choices in lists:
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageProblem(f"{where}: {key} must be a list of strings, got {value!r}")
        bad = [v for v in value if choices is not None and v not in choices]
        if bad and choices is not None:
            raise UsageProblem(f"{where}: {key} {bad[0]!r} is not one of {', '.join(choices)}")
        out[key] = tuple(value)
    if "timeout" in table:
        value = table["timeout"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UsageProblem(
                f"{where}: timeout must be a number of seconds above 0, got {value!r}"
            )
        out["timeout"] = float(value)
    return out


def _unwritable(path: Path, err: OSError) -> UsageProblem:
    return UsageProblem(f"cannot write to the output folder {str(path)!r}: {err.strerror or err}")


def _used_out(path: Path, command: str) -> str:
    """Why a new run or merge cannot write into ``path``, and only what would work."""
    results_path = path / RESULTS
    log = RunLog.read(results_path) if results_path.is_file() else None
    held = "other files" if log is None else "a gpucheck run"
    new = "a new merge" if command == "merge" else "a new run"
    said = (
        f"the output folder {str(path)!r} already holds {held}; {new} needs an empty "
        "folder (omit --out for a new reports/<timestamp>/)"
    )
    end = log.end if log is not None else None
    if (
        command == "run"
        and log is not None
        and log.header is not None
        and not log.header.config.merged_from
        and (end is None or end.interrupted)
    ):
        said += f", and `gpucheck run --resume {path}` continues its interrupted run"
    return said


def _new_default_out(base: Path) -> Path:
    """reports/<timestamp>/, made atomically: a run started in the same second gets -2, -3..."""
    stamp = clock.folder_stamp()
    for n in range(1, 1000):
        path = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as err:
            raise _unwritable(path, err) from err
        return path
    raise UsageProblem(f"cannot find a free output folder for {stamp} under {str(base)!r}")


def prepare_out(out: Path | None, command: str = "run") -> Path:
    """A fresh output folder for a new run (default reports/<timestamp>/), proven writable.

    A run never writes into a folder that holds anything already: results of two runs in one
    results.jsonl would be counted together. ``--resume DIR`` is the way to continue an
    interrupted run, and the refusal says so where it applies (``command`` ``"merge"``: a
    merge is never resumed, nor a finished or merged run).
    """
    if out is None:
        path = _new_default_out(Path("reports"))
    else:
        path = out
        try:
            path.mkdir(parents=True, exist_ok=True)
            used = any(path.iterdir())
        except OSError as err:
            raise _unwritable(path, err) from err
        if used:
            raise UsageProblem(_used_out(path, command))
    try:
        probe = path / ".gpucheck-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise _unwritable(path, err) from err
    return path


def load_resume(folder: Path, cfg: RunConfig) -> tuple[RunConfig, RunHeader]:
    """The config and header of the run in ``folder``, for ``--resume``."""
    given = [
        flag
        for flag, value in (
            ("--all-devices", cfg.all_devices),
            ("--device", cfg.devices),
            ("--suite", cfg.suites),
            ("--mode", cfg.modes),
            ("--out", cfg.out),
            ("--cpu-only", cfg.cpu_only),
            ("--allow-empty", cfg.allow_empty),
            ("pytest arguments", cfg.pytest_args),
            ("--timeout", "timeout" in cfg.given),
            ("--nvml-interval", "nvml_interval" in cfg.given),
            ("--distributed", cfg.distributed),
            ("--world-size", cfg.world_size is not None),
            ("--backend", cfg.backend is not None),
            ("--shard", cfg.shard is not None),
            ("--durations", cfg.durations is not None),
        )
        if value
    ]
    if given:
        raise UsageProblem(
            f"--resume continues a run with the settings it was started with; "
            f"drop {', '.join(given)}"
        )
    path = folder / RESULTS
    header = RunLog.read(path).header if path.is_file() else None
    if header is None:
        raise UsageProblem(
            f"{str(folder)!r} holds no gpucheck run to resume (no results.jsonl with a run header)"
        )
    if header.config.merged_from:
        raise UsageProblem(
            f"{str(folder)!r} was made by `gpucheck merge`: resume the run folders it was "
            "merged from, then merge again"
        )
    end = RunLog.read(path).end
    if end is not None and not end.interrupted:
        at = f" at {end.finished_at}" if end.finished_at else ""
        raise UsageProblem(
            f"the run in {str(folder)!r} finished{at}: there is nothing to "
            f"resume (`gpucheck report {folder}` writes its reports again)"
        )
    saved = header.config
    if not saved.recorded:
        raise UsageProblem(
            f"the run in {str(folder)!r} was written by a gpucheck that did not "
            "record its settings; it cannot be resumed"
        )
    _check_resumable(folder, saved)
    resumed = RunConfig(
        all_devices=saved.all_devices,
        devices=tuple(saved.devices),
        suites=tuple(saved.suites),
        modes=tuple(saved.modes),
        out=folder,
        timeout=cfg.timeout if saved.timeout is None else saved.timeout,
        quiet=cfg.quiet,
        cpu_only=saved.cpu_only,
        pytest_args=list(saved.pytest_args),
        nvml_interval=cfg.nvml_interval if saved.nvml_interval is None else saved.nvml_interval,
        allow_empty=saved.allow_empty,
        resume=folder,
        distributed=saved.distributed,
        world_size=saved.world_size,
        backend=saved.backend,
        formats=cfg.formats,
        wait_for_devices=cfg.wait_for_devices,
        suite_paths={n: Path(p) for n, p in saved.suite_paths.items()},
        shard=saved.shard_of,
        ray=cfg.ray or saved.ray,
    )
    return resumed, header


def _check_resumable(folder: Path, saved: RunSettings) -> None:
    """``--resume`` runs code: the suites the header names, with its pytest arguments, and
    writes into the folder. A folder someone else produced is refused, in one sentence, when
    its settings are not what gpucheck writes, when a suite it names lies inside the folder
    (code that came with the folder) or no longer exists, or when the folder holds a link or
    a FIFO (a worker would write through it, outside the folder)."""

    def refuse(what: str) -> UsageProblem:
        return UsageProblem(
            f"cannot resume {str(folder)!r}: {what}; gpucheck writes no such "
            "run folder (start a new run instead)"
        )

    if saved.problems:  # settings of types gpucheck does not write (model.settings)
        raise refuse(saved.problems[0])
    inside = folder.resolve()
    for name, where in saved.suite_paths.items():
        resolved = Path(where).resolve()
        if resolved == inside or inside in resolved.parents:
            raise refuse(f"suite {name!r} lies inside the run folder ({where})")
        if not resolved.exists():
            raise refuse(f"suite {name!r} ({where}) no longer exists")
    for root, dirs, files in os.walk(folder):
        for entry in [*dirs, *files]:
            path = Path(root) / entry
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise refuse(f"it holds {str(path)!r}, a link or a special file")


def suite_problem(probe: str) -> str | None:
    """Why the suites that declare ``probe`` (their suite.toml, ``module:function``) cannot
    run here, or None when they can. gpucheck's kernel suites name the check of its compiled
    kernels, made in a child process (the parent never imports torch, and a broken build must
    not take the harness down with it); where the kernels were not built at install, the
    child builds them first, once, with one progress line."""
    return suites_mod.probe_problem(probe)


Target = tuple[str, int | None, str | None, str | None]  # label, CUDA index, UUID, name


def choose_targets(
    cfg: RunConfig,
) -> tuple[list[Target], list[str], str | None, Inventory | None]:
    """Each target, notes for the run header, the driver version, and the inventory of the
    visible devices (the targets are some of them; None with --cpu-only)."""
    if cfg.cpu_only:
        return (
            [("cpu", None, None, None)],
            ["--cpu-only: GPUs hidden; cases that need one are skipped"],
            None,
            None,
        )
    from gpucheck import devices as devices_mod

    inv = devices_mod.discover()
    if inv.environment_error:
        raise EnvironmentProblem(inv.environment_error)
    if not inv.devices:
        raise EnvironmentProblem(f"{inv.reason} Use --cpu-only to run without a GPU.")
    visible = [d.cuda_index for d in inv.devices]
    wanted = list(dict.fromkeys(cfg.devices)) if cfg.devices else visible
    for index in wanted:
        if index not in visible:
            raise UsageProblem(
                f"--device {index} is out of range: {len(visible)} CUDA device(s) "
                f"visible ({', '.join(map(str, visible))})"
            )
    notes = []
    if len(visible) < 2:
        notes.append(
            "only one CUDA device is visible: wrong-device checks (another device "
            "current while the target runs) could not run"
        )
    chosen = [d for d in inv.devices if d.cuda_index in wanted]
    return (
        [(f"cuda:{d.cuda_index}", d.cuda_index, d.uuid, d.name) for d in chosen],
        notes,
        inv.driver_version,
        inv,
    )


def plan_passes(asked: tuple[str, ...], devices: int = 1) -> list[tuple[str, str | None]]:
    """(mode label, sanitizer tool) of each pass: blocking/nvml share one worker per device;
    every sanitizer tool needs its own, and with two or more devices it runs twice: with
    another device current, and with the target current (``|target-current``), because a
    wrong-device fault ends the process before memcheck sees a second bug in the kernel."""
    passes: list[tuple[str, str | None]] = []
    plain = [m for m in PLAIN if m in asked]
    if plain:
        passes.append((str(Mode.plain(plain)), None))
    for m in asked:
        tool = tool_of(m)
        if tool is None:
            continue
        base = Mode.sanitizer(tool)
        for mode in (base, *((base.with_variant(modes.TARGET_CURRENT),) if devices > 1 else ())):
            if (str(mode), tool) not in passes:
                passes.append((str(mode), tool))
    return passes


def check_same_devices(header: RunHeader, targets: list[Target]) -> None:
    """A resumed run must target the same GPUs (by UUID) as the run it continues."""
    before = {d.device: d.uuid for d in header.devices}
    for label, _, uuid_now, _ in targets:
        if before.get(label) and uuid_now and before[label] != uuid_now:
            raise UsageProblem(
                f"cannot resume: {label} is now {uuid_now}, but the run was "
                f"started on {before[label]}"
            )


def select_runnable(
    cfg: RunConfig, suites: dict[str, Path]
) -> tuple[dict[str, Path], dict[str, str]]:
    """The suites that can run, and the reason of each that cannot (gpucheck's own kernels
    are not built). Raises when none can: one sentence with the fix, before any worker."""
    if cfg.cpu_only:  # their cases need a GPU and are skipped anyway
        return suites, {}
    probes = {n: suites_mod.declared(p).probe for n, p in suites.items()}
    problems = {probe: suite_problem(probe) for probe in sorted({p for p in probes.values() if p})}
    blocked = {n: problems[probe] for n, probe in probes.items() if probe and problems[probe]}
    if not blocked:
        return suites, {}
    names = ", ".join(blocked)
    if len(blocked) == len(suites):
        first = next(iter(blocked.values())) or ""
        raise EnvironmentProblem(
            f"{first.rstrip('.')}. Nothing was run: the suite(s) "
            f"{names} test gpucheck's own kernels."
        )
    runnable = {n: p for n, p in suites.items() if n not in blocked}
    return runnable, {n: f"not runnable: {problem}" for n, problem in blocked.items()}


def header(
    cfg: RunConfig,
    run_id: str,
    targets: list[Target],
    inv: Inventory | None,
    suites: dict[str, Path],
    passes: list[tuple[str, str | None]],
    notes: list[str],
    not_runnable: dict[str, str],
    modes: tuple[str, ...],
) -> dict[str, Any]:
    config = RunSettings(  # as asked (the targets themselves are the header's "devices")
        all_devices=cfg.all_devices,
        devices=list(cfg.devices),
        suites=list(cfg.suites),
        suite_paths={n: str(p) for n, p in suites.items()},
        modes=list(modes),
        timeout=cfg.timeout,
        cpu_only=cfg.cpu_only,
        pytest_args=list(cfg.pytest_args),
        nvml_interval=cfg.nvml_interval,
        allow_empty=cfg.allow_empty,
        distributed=cfg.distributed,
        world_size=cfg.world_size,
        backend=cfg.backend,
        shard=f"{cfg.shard[0]}/{cfg.shard[1]}" if cfg.shard else None,
        durations=str(cfg.durations) if cfg.durations else None,
        ray=cfg.ray,
    )
    from gpucheck import devices as devices_mod
    from gpucheck.detectors import registry

    memory = {d.uuid: d.memory_total for d in inv.devices} if inv else {}
    return {
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": run_id,
        "started_at": clock.now(),
        "gpucheck_version": gpucheck.__version__,
        "torch_version": devices_mod.torch_version(),
        "driver_version": inv.driver_version if inv else None,
        "cuda_driver_version": inv.cuda_driver_version if inv else None,
        "host": socket.gethostname(),
        "devices": [
            {"device": label, "uuid": u, "name": name, "memory_total": memory.get(u or "")}
            for label, _, u, name in targets
        ],
        "suites": sorted(suites),
        "modes": [label for label, _ in passes],
        "notes": notes,
        "not_runnable": not_runnable,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "detectors": registry.settings(),
        "command": ["gpucheck", *sys.argv[1:]],
        "config": config.to_json(),
    }


def refuse_inapplicable(cfg: RunConfig) -> None:
    """An option that cannot apply to the run asked for is an error, not silently ignored:
    one sentence naming the option to drop."""
    if cfg.all_devices and cfg.devices:
        raise UsageProblem("--all-devices and --device exclude each other")
    sanitizer = any(tool_of(m) for m in cfg.modes)
    if cfg.cpu_only:
        for flag, given in (("--device", bool(cfg.devices)), ("--all-devices", cfg.all_devices)):
            if given:
                raise UsageProblem(
                    f"{flag} picks GPUs, and --cpu-only runs without any: drop one of them"
                )
        if sanitizer:
            raise UsageProblem("the sanitizer modes need a GPU; drop --cpu-only")
        if "nvml" in cfg.modes:
            raise UsageProblem(
                "mode nvml samples GPU memory, and --cpu-only has no GPU: drop --mode nvml"
            )
    if cfg.distributed and cfg.modes:
        raise UsageProblem(
            "--distributed does not combine with the sanitizer modes"
            if sanitizer
            else "--distributed runs its ranks in its own mode (dist): drop --mode"
        )
    if not cfg.distributed and (cfg.world_size is not None or cfg.backend is not None):
        raise UsageProblem("--world-size and --backend go with --distributed")
    if "nvml_interval" in cfg.given:
        modes = cfg.modes or DEFAULT_MODES
        why = (
            "--cpu-only has no GPU to sample"
            if cfg.cpu_only
            else "--distributed does not sample NVML"
            if cfg.distributed
            else "mode nvml is not among the --mode given"
            if "nvml" not in modes
            else None
        )
        if why:
            raise UsageProblem(
                f"--nvml-interval sets the sampling of mode nvml, and {why}: drop --nvml-interval"
            )


#: width of the tables in a log (no terminal, no COLUMNS): wide enough not to fold a name
LOG_WIDTH = 160


def make_console(file: IO[str] | None = None) -> Console:
    """The console of a run (on ``file``, default stdout): rich decides from the stream
    whether it is a terminal (colour, live progress) or a log (plain text, no redraws); long
    lines are never wrapped."""
    from rich.console import Console

    console = Console(soft_wrap=True, file=file)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH
    return console
