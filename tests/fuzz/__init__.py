"""Fuzzing helpers for the HTTP/1.1 request parser: a Hypothesis grammar and the two drivers."""
