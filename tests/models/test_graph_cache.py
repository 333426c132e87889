"""The on-disk graph cache: one trace per key among processes (and threads) sharing the directory."""

from __future__ import annotations

import threading

import pytest

from remat_opt.models import graph_cache


def test_a_second_tracer_of_the_same_key_waits_for_the_first(tmp_path, monkeypatch):
    pytest.importorskip("fcntl")
    monkeypatch.setenv(graph_cache.ENV_VAR, str(tmp_path))
    first_inside, release = threading.Event(), threading.Event()
    entered: list[str] = []

    def first():
        with graph_cache.tracing_once("k"):
            entered.append("first")
            first_inside.set()
            release.wait(10)

    def second():
        with graph_cache.tracing_once("k"):
            entered.append("second")

    a = threading.Thread(target=first)
    a.start()
    assert first_inside.wait(10)
    b = threading.Thread(target=second)
    b.start()
    b.join(0.3)
    assert entered == ["first"]  # the second waits while the first holds the key
    with graph_cache.tracing_once("other"):  # another key is not held up
        entered.append("other")
    release.set()
    a.join(10), b.join(10)
    assert entered == ["first", "other", "second"]


def test_without_a_cache_directory_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(graph_cache.ENV_VAR, raising=False)
    with graph_cache.tracing_once("k"), graph_cache.tracing_once("k"):  # re-entrant: no lock at all
        pass
