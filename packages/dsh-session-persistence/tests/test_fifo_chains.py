"""The per-id FIFO chain's bookkeeping (``_coordinator/fifo.py``): a released ticket leaves its id's queue, an idle
id keeps no queue, and releasing is idempotent: a ticket released a second time never takes a follower's place.

The last test pins the live commit's fast path (a ticket alone in its id's queue is dropped with the queue): a
fast path that trusted the queue's length alone would drop the follower's queue on a stale release.
"""

from __future__ import annotations

from dsh.session_persistence._coordinator.fifo import FifoChains


def test_releasing_the_only_ticket_leaves_no_queue_and_marks_it_left() -> None:
    chains = FifoChains()
    ticket = chains.take("a")
    assert list(chains.queues["a"]) == [ticket]
    chains.release("a", ticket)
    assert chains.queues == {}
    assert ticket.left


def test_releasing_the_first_of_two_keeps_the_second_queued_in_order() -> None:
    chains = FifoChains()
    first, second = chains.take("a"), chains.take("a")
    other = chains.take("b")
    chains.release("a", first)
    assert list(chains.queues["a"]) == [second]
    assert list(chains.queues["b"]) == [other]
    chains.release("a", second)
    chains.release("b", other)
    assert chains.queues == {}


def test_a_ticket_released_twice_never_drops_its_followers_queue() -> None:
    chains = FifoChains()
    first, second = chains.take("a"), chains.take("a")
    chains.release("a", first)
    chains.release("a", first)  # stale: the queue now holds only the follower
    assert list(chains.queues["a"]) == [second]
    assert not second.left
    chains.release("a", second)
    assert chains.queues == {}
