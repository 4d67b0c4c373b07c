"""The HTML page's templates are compiled once and kept between runs (jinja's bytecode cache
in the temporary folder); a cache that cannot be made or written costs a compile, never the
report."""

from __future__ import annotations

import tempfile

import jinja2
import pytest

from gpucheck.report import html

NAMES = html._ENV.list_templates(extensions=["j2"])


def _env(cache: jinja2.BytecodeCache | None) -> jinja2.Environment:
    return jinja2.Environment(loader=html._ENV.loader, autoescape=True, bytecode_cache=cache)


def test_a_second_run_loads_the_compiled_templates(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = _env(html._template_cache())
    for name in NAMES:
        first.get_template(name)
    kept = list(tmp_path.glob("_jinja2-cache-*/__jinja2_*.cache"))
    assert len(kept) == len(NAMES) > 0

    second = _env(html._template_cache())

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(second, "compile", no_compile)
    for name in NAMES:
        assert second.get_template(name).render is not None


def test_a_cache_that_cannot_be_written_costs_a_compile(tmp_path):
    env = _env(html._TemplateCache(str(tmp_path / "gone")))  # no such folder: writing fails
    assert env.get_template(NAMES[0]).name == NAMES[0]
    assert not (tmp_path / "gone").exists()


def test_no_private_temporary_folder_means_no_cache(monkeypatch):
    def unsafe(self, *args, **kwargs):
        raise RuntimeError("Cannot determine safe temp directory.")

    monkeypatch.setattr(html._TemplateCache, "__init__", unsafe)
    assert html._template_cache() is None


@pytest.mark.parametrize("name", NAMES)
def test_every_template_renders_from_the_cache_as_compiled(name, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fresh = _env(None).get_template(name)
    _env(html._template_cache()).get_template(name)  # compiled, kept
    cached = _env(html._template_cache()).get_template(name)  # loaded
    assert cached.blocks.keys() == fresh.blocks.keys()
