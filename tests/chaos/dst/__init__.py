"""The chaos suite's deterministic simulation tier (DST; shared/reference/chaos-plan.md
§4.10): real replicas, one thread, virtual time, an in-memory network and FaultFS disks.

    clock.py       the virtual clock (global, and one local clock per node)
    network.py     SimNetwork (links, connections, partitions) and SimTransport
    node.py        SimNode: a FaultFS disk and the ShardReplica built on it
    workload.py    simulated clients -> history Ops
    observer.py    Raft events and the per-step invariants (S12, committed prefixes)
    simulation.py  one seeded run -> SeedResult (trace hash, evidence, violations)
    checks.py      the final safety check of a run (tests/chaos/checker.py)
    runner.py      seeds in PYTHONHASHSEED=0 subprocesses; the reproduction command
    __main__.py    `PYTHONHASHSEED=0 python -m tests.chaos.dst --seed N [--seeds K]`
"""
