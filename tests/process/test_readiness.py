"""The readiness page's count of free app threads: a full worker reads it to decide whether a
sibling could take a connection instead, so a moment's 0 must not reach it."""

from refork.process.readiness import ALL_BUSY_AFTER, Readiness


def test_a_positive_count_is_published_at_once():
    page = Readiness()
    page.set_free_threads(3, now=0.0)
    assert page.free_threads == 3
    page.set_free_threads(1, now=0.1)
    assert page.free_threads == 1


def test_a_zero_read_in_the_middle_of_a_quick_request_is_not_published():
    page = Readiness()
    page.set_free_threads(1, now=0.0)
    page.set_free_threads(0, now=0.1)  # the sibling's last thread serves a quick request
    assert page.free_threads == 1
    page.set_free_threads(1, now=0.2)
    page.set_free_threads(0, now=0.3)
    page.set_free_threads(0, now=0.3 + ALL_BUSY_AFTER - 0.01)  # a fresh span of zeros, not yet long enough
    assert page.free_threads == 1


def test_zero_is_published_once_every_read_for_the_hold_was_zero():
    page = Readiness()
    page.set_free_threads(2, now=0.0)
    page.set_free_threads(0, now=1.0)
    page.set_free_threads(0, now=1.0 + ALL_BUSY_AFTER)
    assert page.free_threads == 0  # now a full worker accepts: no sibling can take the connection
    page.set_free_threads(0, now=5.0)
    assert page.free_threads == 0
    page.set_free_threads(1, now=5.1)
    assert page.free_threads == 1


def test_a_server_that_starts_with_every_thread_busy_says_so_at_once():
    page = Readiness()
    page.set_free_threads(0, now=0.0)
    assert page.free_threads == 0
