"""``gpucheck run`` in one process (:class:`Run`): the passes of a run over its target
devices, the wrong-device check's re-runs, the run-level diagnoses (:func:`diagnose`), the
reports and the exit code.

The distributed controller (:mod:`~gpucheck.controller.dist_pipeline`) builds on the same
:class:`Run` (its own plan and passes, the same header, finish and reports);
:mod:`~gpucheck.controller.entry` chooses between them.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucheck.controller import devlock, sharding
from gpucheck.controller import suites as suites_mod
from gpucheck.controller.config import (
    DEFAULT_MODES,
    DIST_MODE,
    RunConfig,
    Target,
    check_same_devices,
    choose_targets,
    header,
    make_console,
    plan_passes,
    prepare_out,
    select_runnable,
)
from gpucheck.controller.harness import Harness
from gpucheck.controller.progress import Progress
from gpucheck.controller.spawning import THREADS_ENV, WorkerSpec, thread_share
from gpucheck.errors import GpucheckError, OutputProblem
from gpucheck.model import clock, modes, results
from gpucheck.model.contract import CURRENT_ENV, OTHER_CURRENT, TARGET_CURRENT
from gpucheck.model.layout import RunFolder
from gpucheck.model.modes import Mode, tool_of
from gpucheck.model.runlog import Diagnosis, Resume, RunEnd, RunHeader, RunLog
from gpucheck.model.timeline import TimelineWriter
from gpucheck.sanitizer import command as sanitizer_cmd

if TYPE_CHECKING:
    from rich.console import Console

    from gpucheck.devices import Inventory
    from gpucheck.nvml_sampler import Sampler

# What the run needs after its workers start (the reports, the run-level detectors, rich) is
# imported then (:meth:`Run.workers_started`): a worker takes a few hundred milliseconds to
# its first case, which the controller spends on it, not the worker on waiting for it.

#: a pass a run adds after its own (the distributed suite as a CPU group, in the default run
#: without a GPU): (cfg, run folder, results file, run id, notes) -> True when interrupted
ExtraPass = Callable[[RunConfig, Path, Path, str, list[str]], bool]


def run(
    cfg: RunConfig, previous: RunHeader | None = None, cpu_dist_pass: ExtraPass | None = None
) -> int:
    """Run the suites on every target device; returns the exit code of the whole run.
    ``previous``: the header of the run ``cfg.resume`` continues. ``cpu_dist_pass``: runs the
    distributed suite in the default ``--cpu-only`` run (given by the entry point, which
    knows the distributed controller; this module does not)."""
    return Run(cfg, previous, cpu_dist_pass).execute()


class Run:
    """One ``gpucheck run`` in this process: :meth:`plan` (targets, sanitizer), the devices'
    :meth:`lock`, the run folder and its :meth:`header`, the :meth:`passes`, and
    :meth:`finish` (end record, diagnoses, reports, summary, exit code). Each step reads and
    sets the run's own fields; none hands the settings down one by one.

    The distributed controller's run (:class:`~gpucheck.controller.dist_pipeline.DistRun`)
    is one too, with its own plan and passes.
    """

    #: its passes start workers through :meth:`harness_pass`, which writes a fresh run's
    #: header once they are started (a run whose passes do not says False)
    header_after_start = True

    def __init__(
        self,
        cfg: RunConfig,
        previous: RunHeader | None = None,
        cpu_dist_pass: ExtraPass | None = None,
    ) -> None:
        self.cfg = cfg
        self.previous = previous
        self.cpu_dist_pass = cpu_dist_pass
        self.notes: list[str] = []
        self.not_runnable: dict[str, str] = {}
        self.targets: list[Target] = []
        self.inv: Inventory | None = None
        self.sanitizer: Path | None = None
        self.asked: tuple[str, ...] = ()
        self.passes: list[tuple[str, str | None]] = []
        self.requested: dict[str, Path] = {}
        self.suites: dict[str, Path] = {}
        self.cpu_defaults = False  # the default first run without a GPU (see plan_passes)
        self.out = Path()
        self.run_id = ""
        self.header_due = False  # a fresh run's header, written once its first workers run
        self.warm = False  # what the end needs is imported, the page's templates compiled
        self.log = RunLog(Path())
        self.stopped: list[str] = []  # the signal that stopped the run (SIGTERM), if one did
        self.gpus: int | None = None  # GPUs seen, where not from the inventory (a Ray node)

    @classmethod
    def in_folder(
        cls,
        cfg: RunConfig,
        out: Path,
        run_id: str,
        notes: list[str],
        not_runnable: dict[str, str] | None = None,
    ) -> Run:
        """A run whose folder and header exist already (a merge, a Ray head or node): its
        passes or its :meth:`finish` without the steps before them."""
        run = cls(cfg)
        run.out, run.run_id, run.notes = out, run_id, notes
        run.not_runnable = dict(not_runnable or {})
        run.log = RunLog(run.results_path)
        return run

    @functools.cached_property
    def console(self) -> Console:
        """The run's console (made when first used: rich is imported after the first workers
        are started)."""
        return make_console()

    @property
    def results_path(self) -> Path:
        return RunFolder(self.out).results

    @property
    def visible(self) -> int:
        """GPUs this process sees."""
        if self.gpus is not None:
            return self.gpus
        return len(self.inv.devices) if self.inv else 0

    def execute(self) -> int:
        """The whole run; its exit code."""
        self.plan()
        with self.lock() as lock:
            self.plan_passes()
            self.open_folder(lock)
            self.write_header()
            interrupted = self.run_passes()
            return self.finish(
                (self.stopped[0] if self.stopped else "Ctrl-C") if interrupted else None
            )

    # ---- the steps -----------------------------------------------------------------------
    def plan(self) -> None:
        """The modes asked, the sanitizer they need, the target devices."""
        self.asked = tuple(dict.fromkeys(self.cfg.modes)) or DEFAULT_MODES
        if any(tool_of(m) for m in self.asked):
            self.sanitizer = sanitizer_cmd.find()
        self.targets, self.notes, _, self.inv = choose_targets(self.cfg)
        if self.previous is not None:
            check_same_devices(self.previous, self.targets)

    def lock(self) -> contextlib.AbstractContextManager[devlock.Held]:
        """The target GPUs' locks (and, once it is known, the run folder's)."""
        return devlock.held(self.targets, self.cfg.resume, self.cfg.wait_for_devices, self.notes)

    def plan_passes(self) -> None:
        """The passes over the targets and the suites asked for."""
        cfg, asked = self.cfg, self.asked
        run_modes = asked
        if cfg.cpu_only and "nvml" in asked:
            run_modes = tuple(m for m in asked if m != "nvml")
            self.notes.append("--cpu-only: mode 'nvml' has no GPU to sample")
        self.passes = plan_passes(run_modes, self.visible) or [(modes.BARE, None)]
        if share := thread_share(len(self.targets)):
            self.notes.append(
                f"{len(self.targets)} workers at once: each runs torch's CPU operators on "
                f"{THREADS_ENV}={share[THREADS_ENV]} threads (this machine's CPUs shared "
                f"out; set {THREADS_ENV} to choose)"
            )
        self.requested = (
            cfg.suite_paths
            if cfg.suite_paths is not None
            else suites_mod.resolve(cfg.suites, cpu_only=cfg.cpu_only)
        )
        # the default first run without a GPU: the suites that need none, then the distributed
        # suite as a gloo group of CPU ranks (cpu_dist_pass)
        self.cpu_defaults = self.cpu_dist_pass is not None and (
            DIST_MODE in self.previous.modes
            if self.previous is not None
            else cfg.cpu_only and not cfg.suites and suites_mod.defaults_are_ours()
        )
        if self.cpu_defaults and (note := suites_mod.left_out_note()):
            self.notes.append(note)

    def open_folder(self, lock: devlock.Held) -> None:
        """The run folder (a fresh one, or the one resumed), locked; the suites that can run."""
        cfg = self.cfg
        existed = cfg.out is not None and cfg.out.exists()
        self.out = cfg.resume if cfg.resume is not None else prepare_out(cfg.out)
        lock.note_folder(self.out)
        try:
            self.suites, self.not_runnable = select_runnable(cfg, self.requested)
        except GpucheckError:
            if cfg.resume is None and not existed:
                with contextlib.suppress(OSError):
                    self.out.rmdir()  # nothing ran: leave no empty run folder behind
            raise
        sharding.prepare(self.cfg.shard, self.cfg.durations, self.out)

    def write_header(self) -> None:
        """The ``run`` header (or, resumed, a ``resume`` record); the run's one log of its
        results file from here on. A fresh run whose passes are this class's writes its
        header once its first workers are started (:meth:`workers_started`): they wait for it
        before their first record, and the header's parts (the detectors' settings, from the
        installed packages) take imports of their own."""
        if self.previous is None:
            self.run_id = uuid.uuid4().hex[:12]
            self.header_due = True
            if not self.header_after_start:
                self.flush_header()
        else:
            self.run_id = self.previous.run_id
            record = Resume(self.run_id, clock.now(), self.notes, self.not_runnable)
            results.append(self.results_path, record.to_json())
        self.log = RunLog(self.results_path)  # the controller's one reader of the records

    def flush_header(self) -> None:
        """The fresh run's ``run`` header, if it is not written yet."""
        if not self.header_due:
            return
        self.header_due = False
        passes = self.passes + ([(DIST_MODE, None)] if self.cpu_defaults else [])
        results.append(
            self.results_path,
            header(
                self.cfg,
                run_id=self.run_id,
                targets=self.targets,
                inv=self.inv,
                suites=self.requested,
                passes=passes,
                notes=self.notes,
                not_runnable=self.not_runnable,
                modes=self.asked,
            ),
        )

    def workers_started(self) -> None:
        """What waits for the first workers to start: the header, then what the end of the
        run needs imported, the HTML page's templates compiled (while the workers import
        pytest and collect: this process is idle until their first case anyway, and a
        thread would import beside the progress lines' imports)."""
        self.flush_header()
        if not self.warm:
            self.warm = True
            _warm()

    def run_passes(self) -> bool:
        """Every pass; True when Ctrl-C or SIGTERM stopped the run. When the harness itself
        fails, what was recorded is still reported."""
        try:
            with sigterm_as_interrupt(self.stopped):
                return self.passes_here()
        except BaseException as err:  # the harness itself failed: report what was recorded
            with contextlib.suppress(OutputProblem):  # the disk that failed may fail again
                self.end_record(True, f"the harness stopped: {err!r}")
            with contextlib.suppress(Exception):
                from gpucheck.report import publish

                publish(self.out, formats=self.cfg.report_formats, log=self.log)
            raise

    def passes_here(self) -> bool:
        """The passes of this run (True when interrupted)."""
        interrupted = self.device_passes()
        if (
            self.cpu_defaults
            and self.cpu_dist_pass is not None
            and not interrupted
            and not mode_done(self.log, self.run_id, DIST_MODE)
        ):
            interrupted = self.cpu_dist_pass(
                self.cfg, self.out, self.results_path, self.run_id, self.notes
            )
        return interrupted

    def device_passes(self) -> bool:
        """Every pass on every target; after a plain pass on 2+ GPUs, the wrong-device
        re-runs of its suspects. True when Ctrl-C stopped it."""
        rerun_log = RunLog(RunFolder(self.out).rerun)
        with Progress(lambda: self.console, quiet=self.cfg.quiet) as progress:
            for label, tool in self.passes:
                mode = Mode.parse(label)
                interval = self.cfg.nvml_interval if mode.nvml else 0.0
                current = TARGET_CURRENT if mode.target_current else OTHER_CURRENT
                specs = [
                    WorkerSpec(
                        t_label,
                        index,
                        u,
                        self.suites,
                        label,
                        self.pass_env(label, current),
                        [*self.cfg.pytest_args, *sharding.worker_args(self.out)],
                        interval,
                        tool,
                        self.sanitizer,
                    )
                    for t_label, index, u, _ in self.targets
                ]
                if self.harness_pass(specs, self.log, progress, interval):
                    return True
                if (
                    self.visible > 1
                    and tool is None
                    and current == OTHER_CURRENT
                    and self.rerun_suspects(label, specs, rerun_log, progress)
                ):
                    return True
        return False

    def pass_env(self, label: str, current: str) -> dict[str, str]:
        env = {CURRENT_ENV: current, **thread_share(len(self.targets))}
        if Mode.parse(label).blocking:
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        if self.cfg.cpu_only:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def harness_pass(
        self, specs: list[WorkerSpec], log: RunLog, progress: Progress, interval: float = 0.0
    ) -> bool:
        """One pass of workers writing into ``log``'s file (with the NVML timeline when
        asked); True after Ctrl-C."""
        progress.follow(log)
        timeline = TimelineWriter(RunFolder(self.out).timeline) if interval > 0 else None
        sampling: list[Sampler] = []

        def started() -> None:  # the workers run: what could wait for them
            if timeline is not None:
                from gpucheck.nvml_sampler import Sampler

                sampling.append(Sampler(interval, timeline).start())
            self.workers_started()

        harness = Harness(
            specs,
            self.out,
            log,
            self.run_id,
            self.cfg.timeout,
            on_update=progress.update,
            on_start=started,
            wait_header=self.header_due,
        )
        try:
            return run_until_interrupted(harness)
        finally:
            self.notes.extend(harness.notes)
            if sampling and timeline is not None:
                sampler = sampling[0]
                sampler.stop()
                timeline.close()
                self.notes.append(
                    f"nvml: {sampler.samples} samples of {len(sampler.devices)} "
                    f"device(s) every {interval * 1000:g} ms in {timeline.path.name}"
                )
                if sampler.first_failure is not None:
                    when, why = sampler.first_failure
                    self.notes.append(
                        f"nvml: NVML failed in {sampler.failures} of {sampler.samples} "
                        f"samples, first at {clock.local_time(when)} "
                        f"({why}): the timeline has no memory where it failed, and the "
                        "cases that ran then have no NVML peak (a warning each)"
                    )

    def rerun_suspects(
        self, label: str, specs: list[WorkerSpec], rerun_log: RunLog, progress: Progress
    ) -> bool:
        """The wrong-device check: cases of this pass that went wrong with another device
        current run again with their target current, in fresh workers, records to
        rerun.jsonl. True after Ctrl-C."""
        from gpucheck.detectors.wrong_device import suspects

        self.log.refresh()
        bad = suspects([r for r in self.log.cases if r.run_id == self.run_id], label)
        folder = RunFolder(self.out)
        rerun, control = (
            str(Mode.parse(label).with_variant(v))
            for v in (modes.RERUN_TARGET, modes.RERUN_CONTROL)
        )
        reruns, controls = [], []
        for spec in specs:
            mine = sorted({r.case for r in bad if r.device == spec.label})
            if not mine:
                continue
            only = folder.worker(spec.label, rerun).only
            only.parent.mkdir(parents=True, exist_ok=True)
            only.write_text("\n".join(mine) + "\n")
            args = [*spec.pytest_args, "--gpucheck-only", str(only)]
            reruns.append(_again(spec, rerun, self.pass_env(label, TARGET_CURRENT), args))
            # the control: the same arrangement as the first time, in a fresh worker; a
            # failure that does not come back (a random input, a race) is no evidence of a
            # device bug
            controls.append(_again(spec, control, self.pass_env(label, OTHER_CURRENT), args))
        if not reruns:
            return False
        self.notes.append(
            f"wrong-device check: {len(bad)} case(s) that went wrong with another device "
            f"current ran again, with their target current and (control) with the other "
            f"device current again ({folder.rerun.name})"
        )
        return any(self.harness_pass(group, rerun_log, progress) for group in (reruns, controls))

    def end_record(
        self, interrupted: bool, reason: str | None, stopped_by: str | None = None
    ) -> None:
        self.flush_header()  # a run stopped before its first workers started
        record = RunEnd(self.run_id, clock.now(), interrupted, reason, stopped_by)
        results.append(self.results_path, record.to_json())

    def finish(self, stopped_by: str | None) -> int:
        """End record, run-level diagnoses, reports, the summary, and the exit code: the run's
        verdict (gpucheck.report.verdict) decides it, as it decides every report's."""
        stopped = (
            (
                f"stopped by {stopped_by}: finished cases were kept; `gpucheck run --resume "
                f"{self.out}` runs the rest"
            )
            if stopped_by is not None
            else None
        )
        from gpucheck.report import publish
        from gpucheck.report.console import print_summary

        self.end_record(stopped is not None, stopped, stopped_by)
        rerun_log = RunLog(RunFolder(self.out).rerun)
        diagnose(self.log, rerun_log, self.run_id)
        done = publish(
            self.out,
            formats=self.cfg.report_formats,
            allow_empty=self.cfg.allow_empty,
            stopped_by=stopped_by,
            log=self.log,
        )
        reruns = [r for r in rerun_log.cases if r.run_id == self.run_id]
        print_summary(
            self.console, done, self.notes, self.not_runnable, self.results_path, stopped, reruns
        )
        return done.verdict.exit_code


def _again(spec: WorkerSpec, mode: str, env: dict[str, str], args: list[str]) -> WorkerSpec:
    """A worker that runs some of ``spec``'s cases again (``args`` name them) in ``mode``,
    without NVML sampling or a sanitizer."""
    return replace(
        spec,
        mode=mode,
        env=env,
        pytest_args=args,
        nvml_interval=0.0,
        sanitizer_tool=None,
        sanitizer=None,
    )


def mode_done(log: RunLog, run_id: str, mode: str) -> bool:
    """Whether the run already recorded the cases of ``mode``, each its workers planned (a
    resumed run skips that pass; one stopped mid-way runs the cases it has no record of)."""
    log.refresh()
    return any(r.run_id == run_id and r.mode == mode for r in log.cases) and not any(
        m == mode for _, _, _, m in log.unrecorded()
    )


@contextlib.contextmanager
def sigterm_as_interrupt(stopped: list[str]) -> Iterator[None]:
    """SIGTERM (a CI job cancelled, a scheduler's time limit) stops the run the way Ctrl-C
    does: workers stopped, finished cases kept, reports written, ``--resume`` possible."""

    def handler(signum: int, frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_until_interrupted(harness: Any) -> bool:
    """Run a harness (or a distributed one) to its end; True when Ctrl-C or SIGTERM stopped
    it, after its workers were stopped (finished records are kept)."""
    try:
        harness.run()
    except KeyboardInterrupt:
        harness.interrupt()
        return True
    except OutputProblem:  # no record can be written: stop every worker, say it in one line
        harness.interrupt()
        raise
    return False


def diagnose(log: RunLog, rerun_log: RunLog, run_id: str) -> list[Diagnosis]:
    """Run-level detectors over every record of the run (``log``, the controller's reader of
    its results: what it already read is not read again) and of its wrong-device re-runs
    (``rerun_log``), and what those re-runs found besides their outcome
    (:func:`~gpucheck.controller.reruns.carried`): their findings become diagnosis records
    of the cases they are about, appended to the results file."""
    from gpucheck.controller import reruns
    from gpucheck.detectors import registry

    log.refresh(final=True)
    rerun_log.refresh(final=True)
    records = [r for r in log.cases if r.run_id == run_id]
    records += [r for r in rerun_log.cases if r.run_id == run_id]
    head = next((h for h in log.headers if h.run_id == run_id), None)
    found = [
        f
        for detector in registry.run_detectors(registry.RunContext.of_header(head))
        for f in detector.run_finished(records)
    ]
    made = []
    for finding in [*found, *reruns.carried(records)]:
        mine = [
            r
            for r in records
            if (r.device, r.suite, r.case) == (finding.device, finding.suite, finding.case)
        ]
        if not mine:  # a detector's finding about no case of the run: nowhere to attach
            continue
        original = next((r for r in mine if not Mode.parse(r.mode).variant), mine[0])
        diagnosis = Diagnosis(
            run_id, original.device, original.suite, original.case, original.mode, [finding]
        )
        results.append(log.path, diagnosis.to_json())
        made.append(diagnosis)
    return made


def _warm() -> None:
    """Import what the end of a run needs, and compile the HTML page's templates (while the
    workers start; where this fails, the end meets the same failure and reports it)."""
    with contextlib.suppress(Exception):
        from gpucheck import report
        from gpucheck.controller import reruns  # noqa: F401
        from gpucheck.detectors import registry
        from gpucheck.report import console  # noqa: F401

        registry.manager()  # the run-level detectors, from the installed packages too
        report.warm()
