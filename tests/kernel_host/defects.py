"""Deliberate defects: each one puts a bug Driver Verifier would catch into
the loaded image (an import pointed elsewhere, or the exception scope's
table emptied), runs the case that should catch it, and reports whether it
did. run.py runs them all on every run, so the checks are shown to be live;
docs/testing.md lists them.
"""

from cases import (
    apc_delivered_after_unload_returns_to_the_kernel,
    load_and_unload,
    registry_pre_and_post_with_the_user_stack,
    registry_unmapped_user_stack,
    timer_dpc_at_dispatch,
)
from emulator import BugCheck
from host import Windows
from ntoskrnl import ROUTINES

NOTHING = "kernel-host!nothing"
# The stand-in a defect points an import at: does nothing, returns
# STATUS_SUCCESS, callable at any IRQL.
ROUTINES[NOTHING] = (lambda k, site: 0, None, "a deliberate defect's stand-in", None)


class Verdict:
    def __init__(self, caught, text):
        self.caught = caught
        self.text = text


class Defect:
    def __init__(self, name, description, patch, case):
        self.name = name
        self.description = description
        self.patch = patch
        self.case = case

    def run(self, machine, symbols, bridge):
        w = Windows(machine, symbols, bridge)
        w.after_reload = lambda: self.patch(machine, symbols)
        try:
            self.case(w)
        except (AssertionError, BugCheck) as error:
            return Verdict(True, f"{self.description}: case {self.case.__name__} fails: {error}")
        return Verdict(False, f"{self.description}: case {self.case.__name__} still passes")


def import_instead(name, replacement):
    return lambda machine, symbols: machine.patch_slot(name, machine.stub_for(replacement))


def empty_the_exception_scope(machine, symbols):
    """The scope table of the one function whose handler is
    __C_specific_handler (kstack_guarded_walk) gets no scopes."""
    for function in machine.functions:
        handler = machine.language_handler(function)
        if handler is not None:
            machine.write_u32(handler[1], 0)
            return
    raise AssertionError("the image has no function with an exception handler")


def drop_the_last_reference_by_a_call(machine, symbols):
    """kstack_apc_kernel_routine's tail jump into ObfDereferenceObject
    (`jmp [rip+disp32]`, FF 25) made a call (FF 15, the same length and
    slot), and the `int3` after it a `ret`: the routine then returns
    through kstack's code after dropping the device's last reference."""
    thunk = machine.base + symbols.public("kstack_apc_kernel_routine")
    code = machine.read(thunk, 64)
    jump = code.index(b"\xff\x25")
    if code[jump + 6] != 0xCC:
        raise AssertionError("kstack_apc_kernel_routine's tail jump is not followed by its int3")
    machine.write(thunk + jump, b"\xff\x15")
    machine.write(thunk + jump + 6, b"\xc3")


DEFECTS = [
    Defect(
        "routine above its IRQL",
        "the import of KeGetCurrentProcessorNumberEx (called inside the DISPATCH_LEVEL publish section) "
        "points at KeFlushQueuedDpcs, a PASSIVE_LEVEL-only routine",
        import_instead("KeGetCurrentProcessorNumberEx", "KeFlushQueuedDpcs"),
        registry_pre_and_post_with_the_user_stack,
    ),
    Defect(
        "leaked allocation",
        "ExFreePoolWithTag does nothing, so unload frees none of the driver's pool",
        import_instead("ExFreePoolWithTag", NOTHING),
        load_and_unload,
    ),
    Defect(
        "registration not undone",
        "PsRemoveLoadImageNotifyRoutine does nothing, so unload leaves the image notify routine registered",
        import_instead("PsRemoveLoadImageNotifyRoutine", NOTHING),
        load_and_unload,
    ),
    Defect(
        "timer left running",
        "KeCancelTimer does nothing, so unload leaves the sampling timer set",
        import_instead("KeCancelTimer", NOTHING),
        timer_dpc_at_dispatch,
    ),
    Defect(
        "missed exception scope",
        "kstack_guarded_walk's scope table lists no scope, so the user walk's access violation has no handler",
        empty_the_exception_scope,
        registry_unmapped_user_stack,
    ),
    Defect(
        "return after the last reference",
        "the APC's kernel routine drops the device's last reference with a call and returns through kstack.sys "
        "instead of tail-jumping into ObfDereferenceObject",
        drop_the_last_reference_by_a_call,
        apc_delivered_after_unload_returns_to_the_kernel,
    ),
    Defect(
        "DPC left queued",
        "KeFlushQueuedDpcs does nothing, so unload frees the driver's state while the timer's DPC an expiry queued is still to run",
        import_instead("KeFlushQueuedDpcs", NOTHING),
        timer_dpc_at_dispatch,
    ),
]
