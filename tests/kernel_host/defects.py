"""Deliberate defects: each one puts a bug Driver Verifier would catch into
the loaded image (an import pointed elsewhere, or the exception scope's
table emptied), runs the case that should catch it, and reports whether it
did. run.py runs them all on every run, so the checks are shown to be live;
docs/testing.md lists them.
"""

from cases import load_and_unload, registry_pre_and_post_with_the_user_stack, registry_unmapped_user_stack, timer_dpc_at_dispatch
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
        w.after_reload = lambda: self.patch(machine)
        try:
            self.case(w)
        except (AssertionError, BugCheck) as error:
            return Verdict(True, f"{self.description}: case {self.case.__name__} fails: {error}")
        return Verdict(False, f"{self.description}: case {self.case.__name__} still passes")


def import_instead(name, replacement):
    return lambda machine: machine.patch_slot(name, machine.stub_for(replacement))


def empty_the_exception_scope(machine):
    """The scope table of the one function whose handler is
    __C_specific_handler (kstack_guarded_walk) gets no scopes."""
    for function in machine.functions:
        handler = machine.language_handler(function)
        if handler is not None:
            machine.write_u32(handler[1], 0)
            return
    raise AssertionError("the image has no function with an exception handler")


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
]
