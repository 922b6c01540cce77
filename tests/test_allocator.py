"""The worker's malloc tuning (wsfleet.worker.allocator): glibc's mmap threshold fixed,
its arenas capped, and the operator's environment variables left to win."""

from __future__ import annotations

import platform

import pytest

from wsfleet.worker import allocator

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@glibc
def test_the_threshold_and_the_arenas_are_set_where_the_environment_does_not(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert allocator.tune() == {"allocator": "glibc", "mmap_threshold": allocator.MMAP_THRESHOLD, "arena_max": allocator.ARENAS}


@glibc
def test_glibcs_own_variables_win(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4194304")
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    done = allocator.tune()
    assert done["mmap_threshold"] == "from MALLOC_MMAP_THRESHOLD_"
    assert done["arena_max"] == allocator.ARENAS


def test_without_mallopt_it_does_nothing_and_says_so(monkeypatch):
    monkeypatch.setattr(allocator, "_mallopt", lambda: None)
    assert allocator.tune() == {"allocator": "not glibc"}
