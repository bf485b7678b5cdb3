"""The generator's event loop: back-pressure on delivered messages, in order."""

from __future__ import annotations

import threading

from broker_ext.loop import EventLoop


def test_a_message_posted_beyond_the_limit_waits_until_the_loop_has_handled_one() -> None:
    loop = EventLoop(max_waiting=2)
    handled: list[int] = []
    for i in range(2):
        loop.post_message(lambda i=i: handled.append(i))  # type: ignore[misc]
    seen_when_posted: list[int] = []

    def third() -> None:
        loop.post_message(lambda: handled.append(2))
        seen_when_posted.append(len(handled))

    poster = threading.Thread(target=third)
    poster.start()
    poster.join(0.5)  # long enough for a post that did not wait to return
    loop.start()
    poster.join(10)
    try:
        assert seen_when_posted and seen_when_posted[0] >= 1  # it returned only once the loop had handled one
        done = threading.Event()
        loop.post(done.set)
        assert done.wait(10)
        assert handled == [0, 1, 2]
    finally:
        loop.stop()
