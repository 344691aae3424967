"""Fork integrations and the app-level fork API in real refork processes (the start_server fixture)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import TESTS
from support.fake_redis import FakeRedis

APP = "apps.fork_hooks:app"


@pytest.fixture
def fake_redis():
    server = FakeRedis()
    yield server
    server.close()


def answers(server, count=40):
    return [json.loads(server.get("/")[1]) for _ in range(count)]


def by_worker(server, count=40):
    seen = {}
    for answer in answers(server, count):
        seen.setdefault(answer["pid"], answer)
    return seen


def test_active_integrations_are_named_and_each_worker_has_its_own_redis_connection(start_server, fake_redis):
    server = start_server(app=APP, workers=2, env={"REFORK_TEST_REDIS": str(fake_redis.port)})
    log = server.log()
    assert re.search(r"fork integrations: .*redis.*numpy", log), log
    assert "fork safety" not in log  # the mold's redis connection was closed before the check
    workers = server.wait_for(lambda: len(seen := by_worker(server)) == 2 and seen, what="both workers")
    ids = {answer["redis"] for answer in workers.values()}
    assert len(ids) == 2 and 1 not in ids  # connection 1 was the mold's, closed before the fork
    assert 1 not in fake_redis.open


def test_without_integrations_strict_refuses_naming_the_line(start_server, fake_redis):
    server = start_server(
        "--fork-integrations", "none", "--fork-safety", "strict",
        app=APP, workers=1, wait=False, env={"REFORK_TEST_REDIS": str(fake_redis.port)},
    )  # fmt: skip
    assert server.wait_exit() == 2
    app_file = re.escape(str(TESTS / "apps" / "fork_hooks.py"))
    made_at = rf"a connection to 127\.0\.0\.1:{fake_redis.port} \(fd \d+\), made at {app_file}:\d+"
    assert re.search(made_at, server.log())
    assert "fork integrations: none (off: " in server.log()


def test_decorators_run_in_the_mold_the_workers_and_before_a_promotion(start_server, tmp_path):
    hooks = tmp_path / "hooks.txt"
    server = start_server("--refork-after", "off", app=APP, workers=2, env={"REFORK_TEST_HOOKS": str(hooks)})
    mold = server.mold()["pid"]
    workers = {w["pid"] for w in server.workers()}

    def seen(hook):
        return {int(line.split()[1]) for line in hooks.read_text().splitlines() if line.split()[0] == hook}

    assert seen("before_fork") == {mold} and seen("after_fork") == workers
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: seen("before_promotion"), what="the before_promotion hook")
    assert seen("before_promotion") <= workers


def two_workers_answers(server):
    """Each worker's first answer (its first draws), however many rounds of requests it takes the
    kernel to give both workers one."""
    seen: dict = {}

    def both():
        for answer in answers(server, 40):
            seen.setdefault(answer["pid"], answer)
        return len(seen) == 2 and seen

    return server.wait_for(both, what="both workers")


def two_workers(server):
    return two_workers_answers(server).values()


def test_per_process_objects_are_rebuilt_in_each_worker(start_server):
    server = start_server(app=APP, workers=2)
    workers = server.wait_for(lambda: len(seen := by_worker(server)) == 2 and seen, what="both workers")
    assert all(answer["built"] == pid for pid, answer in workers.items())


def test_random_and_numpy_draws_differ_between_workers(start_server):
    server = start_server(app=APP, workers=2)
    first, second = two_workers(server)
    assert first["random"] != second["random"] and first["numpy"] != second["numpy"]


def test_without_the_numpy_integration_workers_draw_the_same_numbers(start_server):
    # (no refork meanwhile: a new generation's workers would start from a promoted worker's state)
    server = start_server("--fork-integrations", "redis", "--refork-after", "off", app=APP, workers=2)
    first, second = two_workers(server)
    assert first["numpy"] == second["numpy"]  # what the integration prevents
    assert first["random"] != second["random"]  # the stdlib's generator is reseeded by refork itself


def test_a_file_opened_at_load_is_made_harmless_unless_kept(start_server, tmp_path):
    (tmp_path / "kept.txt").write_text("kept")
    (tmp_path / "shared.txt").write_text("shared")
    server = start_server(app=APP, workers=1, env={"REFORK_TEST_FILES": str(tmp_path)})
    answer = json.loads(server.get("/")[1])
    assert answer["kept"] == str(tmp_path / "kept.txt")
    assert answer["shared"] == "/dev/null"
    shared = re.escape(str(tmp_path / "shared.txt"))
    assert re.search(rf"fork safety: worker 0 \(gen 0\) made fd \d+ harmless \(was {shared}\)", server.log())
    assert "kept.txt) " not in server.log()


def test_fork_safety_off_leaves_descriptors_alone(start_server, tmp_path):
    (tmp_path / "kept.txt").write_text("kept")
    (tmp_path / "shared.txt").write_text("shared")
    env = {"REFORK_TEST_FILES": str(tmp_path)}
    server = start_server("--fork-safety", "off", app=APP, workers=1, env=env)
    assert json.loads(server.get("/")[1])["shared"] == str(tmp_path / "shared.txt")


def test_after_a_refork_each_worker_still_has_its_own_redis_connection(start_server, fake_redis):
    server = start_server(app=APP, workers=2, env={"REFORK_TEST_REDIS": str(fake_redis.port)})
    before = {answer["redis"] for answer in two_workers(server)}
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: server.one_generation(2) == 1, timeout=30, what="gen 1 everywhere")
    after = {pid: answer["redis"] for pid, answer in two_workers_answers(server).items()}
    assert len(set(after.values())) == 2  # one connection per worker
    assert not set(after.values()) & before  # none inherited from the worker that became the mold
    assert "fork safety: the promoted mold holds" not in server.log()  # closed before the promotion


def test_numpys_openblas_pool_is_not_a_hazard_under_strict(start_server):
    """OpenBLAS stops and restarts its own thread pool around a fork: strict must not refuse numpy."""
    import os
    import subprocess
    import sys

    script = "import numpy; from refork.integrations.numpy import openblas_pool_threads as n; print(n())"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    pool = int(run.stdout)
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        assert pool == len(os.sched_getaffinity(0)) - 1  # the app below really has a pool (2 cores: 1)
    server = start_server("--fork-safety", "strict", app="apps.fork_hooks:app", workers=1)
    assert server.get("/")[0] == 200
    assert "native thread" not in server.log()
