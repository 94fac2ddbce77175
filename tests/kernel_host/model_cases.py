"""The model tested too: cases that run model-driver.sys (model_driver.c), a
small test driver that is not kstack, and pin the modelled kernel's
behaviour to the reference kernel's for each routine kstack relies on. Each
says where the behaviour is written (ReactOS's ntoskrnl, the WDK pages);
README.md lists them. A green kstack case means something only while these
pass.
"""

import struct

from emulator import BugCheck
from ntoskrnl import APC, KAPC_SIZE, PASSIVE, STATUS_INVALID_PARAMETER, STATUS_SUCCESS
from symbols import Symbols

MODEL_CASES = []

# model_driver.c's `struct model_seen`, in order.
SEEN_FIELDS = (
    "delivered",
    "run_down",
    "apc",
    "normal_context",
    "argument1",
    "argument2",
    "context_cell",
    "argument1_cell",
    "irql",
    "apcs_disabled",
    "thread_id",
    "mode",
    "inserted",
)
USER_MODE = 1


def model_case(function):
    """A case run on model-driver.sys loaded on a fresh kernel."""

    def body(w):
        driver = ModelDriver(w, w.kernel.symbols)
        evidence = function(driver)
        if w.loaded:
            w.unload()
        return evidence

    body.__name__ = function.__name__
    MODEL_CASES.append(body)
    return function


class ExportSymbols(Symbols):
    """Names for addresses in model-driver.sys, from its export table (it
    has no PDB): the export at or before an address."""

    image_name = "model-driver.sys"

    def __init__(self, pe):
        self.procedures = []
        self.publics = sorted((symbol.address, symbol.name.decode()) for symbol in pe.DIRECTORY_ENTRY_EXPORT.symbols)


class ModelDriver:
    """model-driver.sys loaded on a fresh modelled kernel."""

    def __init__(self, w, symbols):
        self.w = w
        self.symbols = symbols
        status = self.w.load()
        if status != STATUS_SUCCESS:
            raise AssertionError(f"model-driver.sys's DriverEntry returned 0x{status:08X}")
        self.kernel = self.w.kernel

    def call(self, probe, *args, irql=PASSIVE, thread=None):
        address = self.w.machine.base + self.symbols.public(probe)
        return self.kernel.run(address, list(args), irql, thread or self.w.system_thread())

    def seen(self):
        data = self.w.machine.read(self.w.machine.base + self.symbols.public("ModelSeen"), 8 * len(SEEN_FIELDS))
        return dict(zip(SEEN_FIELDS, struct.unpack(f"<{len(SEEN_FIELDS)}Q", data)))

    def apc(self):
        return self.w.machine.base + self.symbols.public("ModelApc")

    def unload_keeping_a_device_reference(self):
        """DriverUnload, then the I/O manager's reference on the driver
        object dropped (IopUnloadDriver), with the device still referenced
        by the driver itself: the image stays mapped."""
        device = self.call("ProbeReferenceDevice")
        unload = self.w.machine.read_u64(self.w.driver + 0x68)
        self.kernel.run(unload, [self.w.driver], PASSIVE, self.w.system_thread())
        self.w.loaded = False
        self.kernel.drop_object_reference(self.w.driver, "inline")
        return device


def check(condition, text):
    if not condition:
        raise AssertionError(text)


@model_case
def special_apc_context_mode_and_delivery(d):
    """ReactOS KeInitializeApc: no normal routine makes the APC kernel mode
    with a NULL normal context, whatever was passed. KeInsertQueueApc stores
    the system arguments. KiDeliverApc takes it off the queue (Inserted
    cleared) and calls the kernel routine in the target thread at
    APC_LEVEL with pointers to copies, not into the KAPC."""
    thread = d.w.user_thread()
    queued = d.call("ProbeQueueSpecialApc", thread.object, 0x1234, 0xA1, 0xA2)
    initialized = d.seen()
    check(queued == 1, f"KeInsertQueueApc returned {queued}")
    check((initialized["mode"], initialized["normal_context"]) == (0, 0), f"after KeInitializeApc with UserMode and a context: mode {initialized['mode']}, context 0x{initialized['normal_context']:X}")
    d.kernel.deliver_apcs(thread)
    seen = d.seen()
    check(seen["delivered"] == 1 and seen["run_down"] == 0, f"{seen}")
    check((seen["normal_context"], seen["argument1"], seen["argument2"]) == (0, 0xA1, 0xA2), f"the kernel routine saw context 0x{seen['normal_context']:X}, arguments 0x{seen['argument1']:X}, 0x{seen['argument2']:X}")
    apc = d.apc()
    check(seen["apc"] == apc, "the kernel routine got another KAPC")
    for cell in ("context_cell", "argument1_cell"):
        check(not apc <= seen[cell] < apc + KAPC_SIZE, f"{cell} points into the KAPC: KiDeliverApc passes copies")
    check((seen["irql"], seen["thread_id"], seen["inserted"], seen["apcs_disabled"]) == (APC, thread.id, 0, 0), f"{seen}")
    return "a special APC initialized with UserMode and context 0x1234 is kernel mode with a NULL context; delivered in its thread at APC_LEVEL, Inserted cleared, arguments through copies"


@model_case
def insert_twice_and_remove(d):
    """ReactOS KeInsertQueueApc: FALSE for an APC already Inserted.
    KeRemoveQueueApc: TRUE once for a queued APC, then FALSE; no routine of
    a removed APC ever runs."""
    thread = d.w.user_thread()
    results = [d.call("ProbeQueueSpecialApc", thread.object, 0, 1, 2), d.call("ProbeQueueAgain"), d.call("ProbeRemove"), d.call("ProbeRemove")]
    check(results == [1, 0, 1, 0], f"queue, queue again, remove, remove: {results}")
    d.kernel.hold_thread(thread)
    d.kernel.thread_exit(thread)
    seen = d.seen()
    check((seen["delivered"], seen["run_down"]) == (0, 0), f"a removed APC ran: {seen}")
    check(d.call("ProbeQueueSpecialApc", thread.object, 0, 1, 2) == 0, "KeInsertQueueApc queued to an exited thread")
    return "queue 1, queue again 0 (Inserted), remove 1, remove 0; the removed APC never ran; an exited thread queues nothing"


@model_case
def critical_and_guarded_regions(d):
    """KiDeliverApc: a special kernel APC is delivered inside a critical
    region (KernelApcDisable), where KeAreApcsDisabled is TRUE, and held
    back inside a guarded region (SpecialApcDisable) until it ends."""
    thread = d.w.user_thread()
    thread.critical_region = True
    d.call("ProbeQueueSpecialApc", thread.object, 0, 1, 2)
    d.kernel.deliver_apcs(thread)
    in_critical = d.seen()
    check(in_critical["delivered"] == 1 and in_critical["apcs_disabled"] == 1, f"in a critical region: {in_critical}")
    thread.critical_region, thread.guarded_region = False, True
    d.call("ProbeQueueSpecialApc", thread.object, 0, 1, 2)
    d.kernel.deliver_apcs(thread)
    check(d.seen()["delivered"] == 1 and thread.apcs, "delivered inside a guarded region")
    thread.guarded_region = False
    d.kernel.deliver_apcs(thread)
    after = d.seen()
    check(after["delivered"] == 2 and after["apcs_disabled"] == 0, f"after the guarded region: {after}")
    return "delivered inside a critical region (KeAreApcsDisabled TRUE there), held back inside a guarded region and delivered after it"


@model_case
def thread_exit_delivers_kernel_apcs(d):
    """ReactOS PspExitThread: the exit path delivers queued kernel APCs
    (rundown routines are the user-mode queue's); nothing can be queued
    after."""
    thread = d.w.user_thread()
    d.call("ProbeQueueSpecialApc", thread.object, 0, 1, 2)
    d.kernel.thread_exit(thread)
    seen = d.seen()
    check((seen["delivered"], seen["run_down"], seen["thread_id"], seen["irql"]) == (1, 0, thread.id, APC), f"{seen}")
    return "an APC queued to a thread that exits: its kernel routine ran in the exiting thread at APC_LEVEL, its rundown routine did not"


@model_case
def thread_lookup(d):
    """PsLookupThreadByThreadId: STATUS_SUCCESS and a reference for a live
    thread (and an exited one whose object a handle keeps),
    STATUS_INVALID_PARAMETER for an unknown id or an exited thread whose
    object is gone (learn.microsoft.com; ReactOS ntoskrnl/ps/thread.c: the
    id goes with the object)."""
    thread = d.w.user_thread()
    found = d.call("ProbeLookUpThread", thread.id)
    d.kernel.hold_thread(thread)
    d.kernel.thread_exit(thread)
    exited = d.call("ProbeLookUpThread", thread.id)
    gone = d.w.user_thread()
    d.kernel.thread_exit(gone)
    deleted = d.call("ProbeLookUpThread", gone.id)
    missing = d.call("ProbeLookUpThread", 999_999)
    check(
        (found, exited, deleted, missing) == (STATUS_SUCCESS, STATUS_SUCCESS, STATUS_INVALID_PARAMETER, STATUS_INVALID_PARAMETER),
        f"0x{found:X}, 0x{exited:X}, 0x{deleted:X}, 0x{missing:X}",
    )
    check(not any(d.kernel.ledger.references.values()), "a lookup's reference was not balanced")
    return "a live thread and an exited one a handle keeps found (referenced, dropped again); an exited thread's id once its object is gone, and an unknown id: STATUS_INVALID_PARAMETER"


@model_case
def last_reference_after_unload_unmaps_the_image(d):
    """ReactOS ObfDereferenceObject, IopDeleteDevice and IopDeleteDriver:
    after DriverUnload, the device's last reference deletes the device, then
    the driver object, whose deletion unmaps the image, inline at
    PASSIVE_LEVEL. A driver routine that returns into the image after
    dropping it runs unmapped code: a bug check. One that tail-jumps into
    ObfDereferenceObject returns to its caller."""
    device = d.unload_keeping_a_device_reference()
    check(d.w.machine.image_mapped, "the image went while its device was still referenced")
    try:
        d.call("ProbeDropAndReturn", device)
    except BugCheck as error:
        check(error.code == 0xCE and "ProbeDropAndReturn" in str(error), f"{error}")
        caught = str(error)
    else:
        raise AssertionError("a return into the unmapped image went unnoticed")
    check(d.kernel.image_unloaded == "inline", f"deletion {d.kernel.image_unloaded}")
    return f"after unload, the device's last reference unmapped the image inline; the return into it: {caught.split(': ', 1)[0]}"


@model_case
def last_reference_by_a_tail_jump(d):
    """As above, but dropped by a tail jump: ObfDereferenceObject returns to
    the caller, outside the image; at APC_LEVEL the deletion is a worker's,
    which the model runs at once (the earliest Windows can)."""
    device = d.unload_keeping_a_device_reference()
    d.call("ProbeDropByTailJump", device, irql=APC)
    check(not d.w.machine.image_mapped and d.kernel.image_unloaded == "deferred", f"image mapped {d.w.machine.image_mapped}, deletion {d.kernel.image_unloaded}")
    return "dropped by a tail jump at APC_LEVEL: the deferred deletion unmapped the image, and ObfDereferenceObject returned to the kernel"
