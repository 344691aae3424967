"""App loading: spec forms, one-line errors for APP mistakes, tracebacks for the app's own bugs."""

from __future__ import annotations

import itertools
import os
import sys
import textwrap

import pytest

from refork.config import ConfigError
from refork.loading import load_app, prepare_import_path, resolve_interface

_counter = itertools.count()


@pytest.fixture
def make_module(tmp_path, monkeypatch):
    """Write a uniquely named module into tmp_path (on sys.path) and return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source: str) -> str:
        name = f"refork_test_mod_{os.getpid()}_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    yield make
    for name in [m for m in sys.modules if m.startswith("refork_test_mod_")]:
        del sys.modules[name]


APP = """
def app(environ, start_response):
    return [b"ok"]

def create_app(name="default", n=1):
    def made(environ, start_response):
        return [name.encode() * n]
    made.label = (name, n)
    return made

class Holder:
    app = app

holder = Holder()
answer = 42

def nothing():
    return None
"""


def test_module_attr(make_module):
    mod = make_module(APP)
    assert load_app(f"{mod}:app").__name__ == "app"
    assert load_app(f"{mod}:holder.app").__name__ == "app"


def test_module_alone_uses_app_or_application(make_module):
    assert load_app(make_module(APP)).__name__ == "app"
    mod = make_module("def application(e, s):\n    return []\n")
    assert load_app(mod).__name__ == "application"
    mod = make_module("def handler(e, s):\n    return []\n")
    with pytest.raises(ConfigError, match=r"no 'app' or 'application'.*handler"):
        load_app(mod)


def test_factory(make_module):
    mod = make_module(APP)
    assert load_app(f"{mod}:create_app()").label == ("default", 1)
    assert load_app(f'{mod}:create_app("x", 2)').label == ("x", 2)
    assert load_app(f"{mod}:create_app(n=3)").label == ("default", 3)
    with pytest.raises(ConfigError, match="factory returned None"):
        load_app(f"{mod}:nothing()")


@pytest.mark.parametrize(
    "spec", ["", ":app", "mod:", "a-b:app", "mod:app(", "mod:create_app(os.getcwd())", "mod:1+2", "m:a[0]"]
)
def test_bad_spec_is_one_line(spec):
    with pytest.raises(ConfigError) as e:
        load_app(spec)
    assert "module:attribute or module:factory()" in str(e.value)
    assert "\n" not in str(e.value)


def test_module_not_found():
    with pytest.raises(ConfigError) as e:
        load_app("refork_no_such_module:app")
    msg = str(e.value)
    assert "refork_no_such_module" in msg and "--chdir/--pythonpath" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="no module named 'refork.nosuch'"):
        load_app("refork.nosuch.deeper:app")


def test_import_error_inside_app_is_reraised(make_module):
    mod = make_module("import refork_dependency_that_is_missing\napp = None\n")
    with pytest.raises(ModuleNotFoundError, match="refork_dependency_that_is_missing"):
        load_app(f"{mod}:app")
    mod = make_module("raise RuntimeError('boom at import')\n")
    with pytest.raises(RuntimeError, match="boom at import"):
        load_app(mod)


def test_missing_attribute_lists_callables(make_module):
    mod = make_module(APP)
    with pytest.raises(ConfigError) as e:
        load_app(f"{mod}:missing")
    msg = str(e.value)
    assert "has no attribute 'missing'" in msg and "create_app" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_app(f"{mod}:holder.nope")


def test_not_callable(make_module):
    mod = make_module(APP)
    with pytest.raises(ConfigError, match="is not callable"):
        load_app(f"{mod}:answer")
    with pytest.raises(ConfigError, match="cannot be a factory"):
        load_app(f"{mod}:answer()")


def test_prepare_import_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(os.getcwd())
    (tmp_path / "lib").mkdir()
    prepare_import_path(str(tmp_path), ["lib"])
    assert os.getcwd() == str(tmp_path)
    assert sys.path[:2] == [str(tmp_path), str(tmp_path / "lib")]
    with pytest.raises(ConfigError, match="--chdir"):
        prepare_import_path(str(tmp_path / "nope"), [])


async def asgi_app(scope, receive, send):
    pass


class AsgiObject:
    async def __call__(self, scope, receive, send):
        pass


class WsgiObject:
    def __call__(self, environ, start_response):
        return []


class Asgi2Class:
    def __init__(self, scope):
        pass

    async def __call__(self, receive, send):
        pass


def wsgi_app(environ, start_response):
    return []


def test_resolve_interface():
    assert resolve_interface(asgi_app, "auto") == "asgi"
    assert resolve_interface(AsgiObject(), "auto") == "asgi"
    assert resolve_interface(wsgi_app, "auto") == "wsgi"
    assert resolve_interface(WsgiObject(), "auto") == "wsgi"
    assert resolve_interface(WsgiObject, "auto") == "wsgi"
    assert resolve_interface(asgi_app, "wsgi") == "wsgi"
    assert resolve_interface(wsgi_app, "asgi") == "asgi"
    with pytest.raises(ConfigError, match="ASGI3"):
        resolve_interface(Asgi2Class, "auto")
