"""Where the test tree and the checkout are, for tests at any depth."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
