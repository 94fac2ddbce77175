"""Measurements on the second kernel host, not pass/fail cases: figures
docs/performance.md records, taken on the real kstack.sys (`run.py
--measure NAME`, `cargo xtask bench sample`). Counts and bytes are the
driver's own; times are the model's clock, so a rate says what the driver
writes for a given load, not how fast the emulator runs it."""

import random
import time

from cases import Sampling, check, finished_with_apcs_delivered, thread_stacks
from ntoskrnl import KERNEL_FRAMES_BASE, THREAD_RUNNING, THREAD_WAITING


def sampling(w, threads=100, hz=100, seconds=1, running=20, seed=26):
    """`threads` threads of one process sampled at `hz` for `seconds` by
    `kstack sample`'s sampler, with the stack table on (the default): the
    records and ring bytes a second. Most threads wait, so their stack is
    the same at every tick (each capture after the first a table hit);
    `running` of them are caught at one of 64 places each tick."""
    started_at = time.monotonic()
    handle, client = thread_stacks(w)
    process = w.process()
    sampled = [w.user_thread(process) for _ in range(threads)]
    period = 1000 // hz
    sampler = Sampling(w, handle, client, hz=hz, threads_per_tick=256, timeout_ms=1000, pids=[process.id])
    rng = random.Random(seed)
    ticks = seconds * hz
    for tick in range(ticks):
        for thread in sampled[:running]:
            thread.kernel_frames[0] = KERNEL_FRAMES_BASE + 0x4000 + 0x10 * rng.randrange(64)
        sampler.tick(tick * period, sampled)
        for thread in sampled:
            w.kernel.deliver_apcs(thread)
        w.kernel.advance(period)
        sampler.read()
    counts = sampler.counts()
    status = w.status(handle, client)
    table = status["stack_table"]
    source = status["sources"]["thread_stack"]
    check(counts["captured"] == ticks * threads, f"{counts['captured']} captured of {ticks * threads}: {counts}")
    check(source["captured"] == counts["captured"] and status["dropped"] == 0, f"the driver dropped or lost records: {source}, dropped {status['dropped']}")
    finished_with_apcs_delivered(w, handle, client)
    records = counts["captured"] / seconds
    ring_bytes = sampler.trace_bytes / seconds
    return (
        f"{threads} threads ({running} running) at {hz} Hz for {seconds} s of the model's clock, table on: "
        f"{records:.0f} records/s, {ring_bytes:.0f} ring bytes/s ({sampler.trace_bytes / counts['captured']:.1f} bytes a record); "
        f"table: {table['hits']} hits, {table['inserts']} inserts, {table['used']} of {table['entries']} entries used; "
        f"{time.monotonic() - started_at:.1f} s of emulation"
    )


def sampling_states(w, threads=100, hz=100, seconds=1, running=5, seed=37):
    """`threads` threads of one process, `running` of them running (each
    tick switched to and charged 10 ms, caught at one of 64 places) and the
    rest waiting, sampled at `hz` for `seconds`: once listed as Toolhelp
    lists them (ids only: every thread interrupted every tick), once as
    SystemProcessInformation does (a thread that has not run is not
    interrupted, its stack repeated). Side by side, one run: APCs, the
    waits they interrupted, records and samples a second."""
    rng = random.Random(seed)
    period = 1000 // hz
    ticks = seconds * hz
    figures = {}
    for listing in ("toolhelp", "process_information"):
        handle, client = thread_stacks(w)
        process = w.process()
        sampled = [w.user_thread(process) for _ in range(threads)]
        for thread in sampled[:running]:
            thread.state = THREAD_RUNNING
        sampler = Sampling(w, handle, client, hz=hz, threads_per_tick=256, timeout_ms=1000, pids=[process.id])
        before = w.status(handle, client)["sources"]["thread_stack"]["captured"]
        interrupted_waits = repeated = 0
        for tick in range(ticks):
            for thread in sampled[:running]:
                thread.context_switches += 1
                thread.cpu_100ns += period * 10_000
                thread.kernel_frames[0] = KERNEL_FRAMES_BASE + 0x4000 + 0x10 * rng.randrange(64)
            repeated += len(sampler.tick(tick * period, sampled, facts=listing == "process_information"))
            for thread in sampled:
                if thread.apcs and thread.state == THREAD_WAITING:
                    interrupted_waits += 1
                w.kernel.deliver_apcs(thread)
            w.kernel.advance(period)
            sampler.read()
        counts = sampler.counts()
        captured = w.status(handle, client)["sources"]["thread_stack"]["captured"] - before
        check(counts["captured"] == captured == counts["queued"], f"{listing}: {counts}, the driver captured {captured}")
        check(counts["captured"] + repeated == ticks * threads, f"{listing}: {counts['captured']} captured and {repeated} repeated of {ticks * threads} samples")
        finished_with_apcs_delivered(w, handle, client)
        figures[listing] = (counts["queued"] / seconds, interrupted_waits / seconds, captured / seconds, (captured + repeated) / seconds)
    rows = ", ".join(f"{listing}: {apcs:.0f} APCs/s, {waits:.0f} waits interrupted/s, {records:.0f} records/s, {samples:.0f} samples/s" for listing, (apcs, waits, records, samples) in figures.items())
    ratio = figures["toolhelp"][0] / max(figures["process_information"][0], 1)
    return f"{threads} threads ({running} running) at {hz} Hz for {seconds} s of the model's clock: {rows}; {ratio:.1f}x fewer APCs"


MEASUREMENTS = {"sampling": sampling, "sampling_states": sampling_states}
