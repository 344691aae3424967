"""Import the user's app from "module:attr" / "module:factory()" and tell WSGI from ASGI.

A mistake in APP (bad syntax, module not found, attribute missing) is a ConfigError: one line.
An error raised by the app's own code while importing is the user's bug: it keeps its traceback.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
from typing import Any, Literal

from refork.errors import ConfigError

_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_FIX = "check APP and --chdir/--pythonpath"
AppInterface = Literal["wsgi", "asgi"]  # what an app speaks, once "auto" is resolved


def change_directory(chdir: str | None) -> None:
    """--chdir, with one readable line when it cannot be done."""
    if chdir:
        try:
            os.chdir(chdir)
        except OSError as e:
            raise ConfigError(f"--chdir {chdir}: {e.strerror}") from None


def prepare_import_path(chdir: str | None, pythonpath: list[str]) -> None:
    """chdir, then put the working directory first on sys.path (like gunicorn), then pythonpath."""
    change_directory(chdir)
    paths = [os.getcwd()] + [os.path.abspath(p) for p in pythonpath]
    for p in paths:
        while p in sys.path:
            sys.path.remove(p)
    sys.path[0:0] = paths


def _parse_spec(spec: str) -> tuple[str, list[str], tuple[list[Any], dict[str, Any]] | None]:
    """'pkg.mod:obj.attr(1, x="y")' -> ('pkg.mod', ['obj', 'attr'], ([1], {'x': 'y'}))."""
    module, _, expr = spec.partition(":")
    bad = f'APP "{spec}" is not module:attribute or module:factory() (e.g. mysite.wsgi:app)'
    if not _MODULE_RE.match(module.strip()):
        raise ConfigError(bad)
    module = module.strip()
    if not expr.strip():
        if ":" in spec:
            raise ConfigError(bad)
        return module, [], None
    try:
        node = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        raise ConfigError(bad) from None
    call = None
    if isinstance(node, ast.Call):
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except ValueError:
            raise ConfigError(f'{bad}: factory arguments must be literals like "x" or 2') from None
        if len(kwargs) != len(node.keywords):
            raise ConfigError(f"{bad}: **kwargs is not supported")
        call, node = (args, kwargs), node.func
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ConfigError(bad)
    names.insert(0, node.id)
    return module, names, call


def _callables(module: Any) -> str:
    found = [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__
    ]
    return ", ".join(found[:4]) or "none"


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing == module or module.startswith(missing + "."):
            raise ConfigError(
                f"cannot import {module!r}: no module named {missing!r} ({_FIX}; cwd is {os.getcwd()})"
            ) from None
        raise  # an import inside the app's own code failed: the user's bug, keep the traceback


def check_app_path(spec: str, chdir: str | None, pythonpath: list[str]) -> None:
    """Before anything is bound: a module APP names that is nowhere on the path is one line now,
    not a mold failure later. Nothing is imported: packages are looked up as files, so the
    monitor still never runs app code; whatever cannot be told without importing passes."""
    import importlib.machinery

    module, _, _ = _parse_spec(spec)
    base = os.path.abspath(chdir) if chdir else os.getcwd()
    paths = [base] + [os.path.join(base, p) for p in pythonpath] + [p for p in sys.path if p]
    search: list[str] | None = paths
    parts = module.split(".")
    for i, part in enumerate(parts):
        if i == 0 and (part in sys.builtin_module_names or part in sys.modules):
            return
        found = importlib.machinery.PathFinder.find_spec(part, search)
        if found is None:
            missing = ".".join(parts[: i + 1])
            raise ConfigError(
                f"cannot import {module!r}: no module named {missing!r} ({_FIX}; cwd is {base})"
            )
        if found.submodule_search_locations is None:
            return  # a module: what follows is its attributes, known only by importing
        search = list(found.submodule_search_locations)


def app_traceback(error: BaseException) -> str:
    """The traceback of an error raised while importing the app, without refork's and importlib's
    frames above the app's own (as `python -m` shows a script's)."""
    import traceback

    te = traceback.TracebackException.from_exception(error)
    machinery = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(importlib.__file__), "<frozen ")
    frames = list(te.stack)
    while frames and frames[0].filename.startswith(machinery):
        frames.pop(0)
    if frames:
        te.stack = traceback.StackSummary.from_list(frames)
    return "".join(te.format()).rstrip("\n")


def load_app(spec: str) -> Any:
    """Import and return the app callable named by spec (calling it first if it is a factory)."""
    module_name, names, call = _parse_spec(spec)
    module = _import(module_name)
    if not names:
        for default in ("app", "application"):
            if hasattr(module, default):
                names = [default]
                break
        else:
            raise ConfigError(
                f"module {module_name!r} has no 'app' or 'application'; name it as {module_name}:NAME "
                f"(callables found: {_callables(module)})"
            )
    obj: Any = module
    for i, name in enumerate(names):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            where = module_name + (":" + ".".join(names[:i]) if i else "")
            hint = f" (callables found: {_callables(module)})" if i == 0 else ""
            raise ConfigError(f"{where} has no attribute {name!r}{hint}; {_FIX}") from None
    if call is not None:
        if not callable(obj):
            raise ConfigError(f"{spec}: {'.'.join(names)} is not callable, so it cannot be a factory")
        obj = obj(*call[0], **call[1])
        if obj is None:
            raise ConfigError(f"{spec}: the factory returned None; it must return the app")
    if not callable(obj):
        raise ConfigError(f"{spec} is not callable (it is {type(obj).__name__}); point APP at the app object")
    return obj


def resolve_interface(app: Any, interface: str) -> AppInterface:
    """auto -> "asgi" for ASGI3 apps (async function or object with async __call__), else "wsgi"."""
    if interface == "wsgi":
        return "wsgi"
    if interface == "asgi":
        return "asgi"
    if interface != "auto":
        raise ConfigError(f'--interface must be one of auto|wsgi|asgi, got "{interface}"')
    if inspect.isclass(app):
        if inspect.iscoroutinefunction(app.__call__):
            raise ConfigError(
                "the app looks like an ASGI2 class; refork serves ASGI3 only "
                "(wrap it with asgiref.compatibility.guarantee_single_callable)"
            )
        return "wsgi"
    if inspect.iscoroutinefunction(app) or inspect.iscoroutinefunction(type(app).__call__):
        return "asgi"
    return "wsgi"
