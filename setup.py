"""Build the one native piece: the heap immortalizer (C, CPython 3.12+ GIL builds)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "refork.memory._immortal",
            sources=["refork/memory/_immortal.c"],
            optional=False,
        )
    ]
)
