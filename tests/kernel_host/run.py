"""The second kernel host: runs the real kstack.sys under speakeasy with a
modelled ntoskrnl (see README.md here), and prints one line per case and
the summary line CI reads:

kernel host: N passed, 0 failed; C calls IRQL-checked; A allocations, F frees; R registrations, U undone; X forced failures

Three parts: the cases (cases.py); the low-resources runs, where DriverEntry
and then each request kind are rerun with each failable kernel call made to
fail in turn (the driver must refuse the load with nothing left behind, or
run degraded as the ABI docs say, and unload clean); and the deliberate
defects (defects.py), each of which some case must catch, so the checks are
shown to be live on every run.
"""

import argparse
import sys
import time
import traceback

from cases import CASES, check, finished, started, status_code
from defects import DEFECTS
from emulator import BugCheck, Machine
from host import SERVICE_KEY, Bridge, Windows
from measure import MEASUREMENTS
from model_cases import MODEL_CASES, ExportSymbols
from ntoskrnl import STATUS_SUCCESS
from symbols import Symbols

REGISTRATIONS = {
    "CmRegisterCallbackEx": "registry",
    "ObRegisterCallbacks": "object_handle",
    "PsSetCreateProcessNotifyRoutineEx": "process",
    "PsSetCreateThreadNotifyRoutine": "thread",
    "PsSetLoadImageNotifyRoutine": "image_load",
}


class Totals:
    def __init__(self):
        self.passed = self.failed = 0
        self.checked = self.allocations = self.frees = 0
        self.registrations = self.undone = self.forced = 0

    def add(self, w):
        kernel = w.kernel
        self.checked += kernel.calls_checked
        self.forced += kernel.forced_failures
        for ledger in kernel.ledgers:
            self.allocations += ledger.allocations
            self.frees += ledger.frees
            self.registrations += len(ledger.registrations)
            self.undone += sum(1 for entry in ledger.registrations if entry["undone"] is not None)


def run_one(name, body, machine, symbols, bridge, totals):
    w = Windows(machine, symbols, bridge)
    try:
        evidence = body(w)
    except (AssertionError, BugCheck) as error:
        totals.failed += 1
        print(f"FAIL {name}: {error}", flush=True)
        return False
    except Exception:
        totals.failed += 1
        print(f"FAIL {name}: the harness failed:\n{traceback.format_exc()}", flush=True)
        return False
    totals.passed += 1
    totals.add(w)
    print(f"PASS {name}: {evidence}", flush=True)
    return True


def driver_entry_failures(machine, symbols, bridge):
    """One run per failable call DriverEntry makes."""
    probe = Windows(machine, symbols, bridge)
    check(probe.load() == STATUS_SUCCESS, "DriverEntry failed with nothing forced")
    calls = list(probe.kernel.failable_calls)
    probe.unload()
    runs = []
    for index, (routine, site) in enumerate(calls):
        where = probe.kernel.name_site(site)

        def body(w, index=index, routine=routine):
            status = w.load(fail_at=index)
            check(w.kernel.forced_failures == 1, "the forced failure was not reached")
            if status != STATUS_SUCCESS:
                return f"{routine} failed: DriverEntry refused the load with 0x{status:08X}, nothing left behind"
            client = w.user_thread()
            handle = w.open(client)
            source = REGISTRATIONS.get(routine)
            degraded = "loaded"
            if source is not None:
                counters = w.status(handle, client)["sources"][source]
                check(counters["registration"] != 0, f"{source}'s registration failed but the status says 0")
                result = w.configure(handle, client, sources=[source])
                check(result == status_code(w, "STATUS_NOT_SUPPORTED"), f"enabling {source} returned 0x{result:08X}, not STATUS_NOT_SUPPORTED")
                degraded = f"loaded without {source} (status registration 0x{counters['registration'] & 0xFFFFFFFF:08X}; enabling it: STATUS_NOT_SUPPORTED)"
            finished(w, handle, client)
            return f"{routine} failed: {degraded}; unload clean"

        runs.append((f"low resources: DriverEntry, {routine} at {where} fails", body))
    return runs


def request_scenario(w, fail_at=None):
    """Every request kind and a walked event, with the failure plan armed
    only after DriverEntry."""
    handle, client = started(w, {"sources": ["registry", "on_demand", "process"], "user_frames": {"process": 3}})
    w.kernel.fail_at = fail_at
    w.kernel.failable_calls = []
    w.fire_registry(w.user_thread())
    w.fire_process(w.user_thread(), w.process())
    w.fire_image(w.user_thread())
    status, _ = w.capture_now(handle, client)
    entries = w.read(handle, client)["entries"]
    w.kernel.fail_at = None
    calls = list(w.kernel.failable_calls)
    finished(w, handle, client)
    return status, entries, calls


def request_failures(machine, symbols, bridge):
    probe = Windows(machine, symbols, bridge)
    *_, calls = request_scenario(probe)
    runs = []
    for index, (routine, site) in enumerate(calls):
        where = probe.kernel.name_site(site)

        def body(w, index=index, routine=routine):
            status, entries, _calls = request_scenario(w, fail_at=index)
            check(w.kernel.forced_failures == 1, "the forced failure was not reached")
            records = [entry for entry in entries if entry["kind"] == "trace"]
            keys = [entry["process_key"] for entry in entries if entry["kind"] == "module"]
            parts = sorted({record["user_part"] for record in records})
            if routine == "KeExpandKernelStackAndCalloutEx":
                check("no_stack" in parts, f"user parts {parts}: the walk without a stack is not no_stack")
            if routine == "PsLookupProcessByProcessId":
                check(keys == [0], f"module record keys {keys}: a process that cannot be looked up has key 0")
            return (
                f"{routine} failed: capture-now 0x{status:08X}, {len(records)} records (user parts {', '.join(parts)}), "
                f"module record keys {keys}, unload clean"
            )

        runs.append((f"low resources: requests, {routine} at {where} fails", body))
    return runs


def unload_failures(machine, symbols, bridge):
    """One run per failable call DriverUnload makes (it writes the
    service's LastUnloadPoolAllocations): unload must still leave nothing."""

    def scenario(w, fail_at=None):
        handle, client = started(w, {"sources": ["registry", "timer"]}, before_load=lambda w: w.set_paging_executive(1))
        w.close(handle, client)
        w.kernel.failable_calls = []
        w.kernel.fail_at = fail_at
        w.unload()
        return list(w.kernel.failable_calls)

    probe = Windows(machine, symbols, bridge)
    calls = scenario(probe)
    check(probe.kernel.registry.get(SERVICE_KEY.lower() + r"\parameters", {}).get("lastunloadpoolallocations") is not None, "unload wrote no LastUnloadPoolAllocations")
    runs = []
    for index, (routine, site) in enumerate(calls):
        where = probe.kernel.name_site(site)

        def body(w, index=index, routine=routine):
            scenario(w, fail_at=index)
            check(w.kernel.forced_failures == 1, "the forced failure was not reached")
            return f"{routine} failed during unload: timer cancelled, callbacks removed, pool freed all the same"

        runs.append((f"low resources: DriverUnload, {routine} at {where} fails", body))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--pdb", required=True)
    parser.add_argument("--test-image", help="the test-injection build, for the cases that need it")
    parser.add_argument("--test-pdb")
    parser.add_argument("--model-driver", required=True, help="model-driver.sys, whose cases pin the modelled kernel (model_cases.py)")
    parser.add_argument("--abi-bridge", required=True)
    parser.add_argument("--measure", choices=sorted(MEASUREMENTS), help="take this measurement (measure.py) instead of running the cases")
    parser.add_argument("--case", choices=sorted(body.__name__ for body in CASES if not getattr(body, "test_build", False)), help="run only this case (while working on it; CI runs them all)")
    options = parser.parse_args()
    started_at = time.monotonic()
    machine = Machine(options.image)
    symbols = Symbols(options.pdb, machine.pe)
    bridge = Bridge(options.abi_bridge)
    totals = Totals()
    if options.measure:
        return 0 if run_one(f"measure {options.measure}", MEASUREMENTS[options.measure], machine, symbols, bridge, totals) else 1
    if options.case:
        body = next(body for body in CASES if body.__name__ == options.case)
        return 0 if run_one(options.case, body, machine, symbols, bridge, totals) else 1
    # Every Machine is made before any runs code (see
    # Machine.free_the_null_region).
    test_build = None
    if any(getattr(body, "test_build", False) for body in CASES):
        if options.test_image is None:
            raise SystemExit("the test-build cases need --test-image and --test-pdb")
        test_machine = Machine(options.test_image)
        test_build = (test_machine, Symbols(options.test_pdb, test_machine.pe))
    model_machine = Machine(options.model_driver)
    model_symbols = ExportSymbols(model_machine.pe)
    for body in MODEL_CASES:
        run_one(f"model: {body.__name__}", body, model_machine, model_symbols, bridge, totals)
    for body in CASES:
        if getattr(body, "test_build", False):
            run_one(body.__name__, body, *test_build, bridge, totals)
        else:
            run_one(body.__name__, body, machine, symbols, bridge, totals)
    runs = driver_entry_failures(machine, symbols, bridge) + request_failures(machine, symbols, bridge) + unload_failures(machine, symbols, bridge)
    for name, body in runs:
        run_one(name, body, machine, symbols, bridge, totals)
    caught = 0
    for defect in DEFECTS:
        verdict = defect.run(machine, symbols, bridge)
        caught += verdict.caught
        print(f"{'CAUGHT' if verdict.caught else 'MISSED'} defect {defect.name}: {verdict.text}", flush=True)
    print(f"deliberate defects: {caught} of {len(DEFECTS)} caught; {time.monotonic() - started_at:.1f} s")
    print(
        f"kernel host: {totals.passed} passed, {totals.failed} failed; {totals.checked} calls IRQL-checked; "
        f"{totals.allocations} allocations, {totals.frees} frees; {totals.registrations} registrations, "
        f"{totals.undone} undone; {totals.forced} forced failures",
        flush=True,
    )
    balanced = totals.allocations == totals.frees and totals.registrations == totals.undone
    return 0 if totals.failed == 0 and caught == len(DEFECTS) and balanced else 1


if __name__ == "__main__":
    sys.exit(main())
