"""``s3_objects.Probes``: after a whole-file probe misses, only every N-th large GET of
that version probes again; other versions and files are not affected; bounded."""

from __future__ import annotations

from shoal.gateway.s3_objects import PROBE_EVERY, Probes


def test_a_missed_probe_is_asked_again_every_n_gets() -> None:
    p = Probes(every=4)
    assert p.due("/ds/a", "v1")  # never probed: ask
    p.missed("/ds/a", "v1")
    assert [p.due("/ds/a", "v1") for _ in range(4)] == [False, False, False, True]
    # the probe after the skips: asked again until it misses again
    assert p.due("/ds/a", "v1")
    p.missed("/ds/a", "v1")
    assert not p.due("/ds/a", "v1")


def test_other_versions_and_files_still_probe() -> None:
    p = Probes(every=4)
    p.missed("/ds/a", "v1")
    assert p.due("/ds/a", "v2")  # an overwrite: its own probe
    assert p.due("/ds/b", "v1")


def test_the_book_is_bounded_oldest_first() -> None:
    p = Probes(every=PROBE_EVERY, limit=2)
    for name in ("a", "b", "c"):
        p.missed(f"/ds/{name}", "v")
    assert p.due("/ds/a", "v")  # forgotten: probed again
    assert not p.due("/ds/c", "v")
