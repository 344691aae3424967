"""Build the native pieces: the heap immortalizer (C, CPython 3.12+ GIL builds) and the native
request path refork._native (Rust, PyO3 + httparse, native/; see docs/native.md)."""

from setuptools import Extension, setup
from setuptools_rust import Binding, RustExtension

setup(
    ext_modules=[
        Extension(
            "refork.memory._immortal",
            sources=["refork/memory/_immortal.c"],
            optional=False,
        )
    ],
    rust_extensions=[
        RustExtension(
            "refork._native",
            path="native/Cargo.toml",
            binding=Binding.PyO3,
            py_limited_api="cp310",
            debug=False,
            optional=True,  # no cargo: installed without it, and --wsgi-loop auto serves with Python
        )
    ],
)
