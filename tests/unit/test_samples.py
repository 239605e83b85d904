"""The sample STORE streams the writer benchmark and store tests replay: with ``in_flight``, at most that
many keys are tuned at a time, in schedule order, each to its iteration count (as a fleet of that many
GPUs); without it, every key is interleaved."""

from __future__ import annotations

from tests.samples import sample_requests, schedule_keys

GPU, DSL = "sm90_NVIDIA_H200", "cuda"
KEYS = schedule_keys(6)


def iterations(requests: list) -> list[tuple[str, int]]:  # type: ignore[type-arg]
    return [(r.key, r.round.iteration) for r in requests if r.kind == "iteration"]


def test_in_flight_keys_start_in_schedule_order_and_each_gets_its_iterations() -> None:
    stream = iterations(list(sample_requests(GPU, DSL, KEYS, 3, seed=5, in_flight=2)))
    assert sorted(stream) == sorted((key, i) for key in KEYS for i in range(3))
    assert [key for key, _ in stream[:6]] == [KEYS[0], KEYS[1]] * 3  # the first two, interleaved
    assert {key for key, _ in stream[6:12]} == set(KEYS[2:4])
    for end in range(1, len(stream) + 1):  # never more than 2 keys begun and not finished
        begun = {key for key, _ in stream[:end]}
        finished = {key for key, i in stream[:end] if i == 2}
        assert len(begun - finished) <= 2


def test_without_in_flight_every_key_is_interleaved() -> None:
    stream = iterations(list(sample_requests(GPU, DSL, KEYS, 2, seed=5)))
    assert [key for key, _ in stream] == KEYS * 2
    assert [i for _, i in stream] == [0] * 6 + [1] * 6
