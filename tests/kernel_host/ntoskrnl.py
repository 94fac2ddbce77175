"""The modelled NT kernel: every routine kstack.sys imports or looks up,
after its WDK contract, with Driver Verifier's checks on each call.

Each routine is declared once with `@routine(name, max_irql, source)`:
`max_irql` is the highest IRQL the documentation allows (None: any), and
`source` is where that rule is written. Calling a routine above it is a
violation (Verifier's bug check 0xC4), named at the call site from kstack.pdb.

The ledger (`Ledger`) is what Verifier tracks: pool (tag, type, size, use
after free, leaks, double frees), registrations (notify routines, callbacks,
timers, device, symbolic link, handles) undone exactly once, and object
references balanced. A failure plan (`fail_at`) makes the n-th failable
call fail as the routine documents, for the low-resources runs.
"""

import struct

from emulator import BugCheck, Callout, Raise

PASSIVE, APC, DISPATCH = 0, 1, 2
STATUS_SUCCESS = 0
STATUS_ACCESS_VIOLATION = 0xC0000005
STATUS_INVALID_PARAMETER = 0xC000000D
STATUS_PROCEDURE_NOT_FOUND = 0xC000007A
STATUS_NO_MEMORY = 0xC0000017
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034
STATUS_OBJECT_NAME_COLLISION = 0xC0000035
STATUS_INSUFFICIENT_RESOURCES = 0xC000009A
STATUS_BUFFER_TOO_SMALL = 0xC0000023
STATUS_INVALID_HANDLE = 0xC0000008
NON_PAGED_POOL_NX = 0x200
POOL_FLAG_NON_PAGED = 0x40
POOL_FLAG_UNINITIALIZED = 0x2
MAXIMUM_EXPANSION_SIZE = 0xF000 - 0x800
KERNEL_FRAMES_BASE = 0xFFFFF80040000000
KI_DELIVER_APC = KERNEL_FRAMES_BASE + 0x4D10
# KTHREAD_STATE and KWAIT_REASON values (ReactOS sdk/include/ndk/ketypes.h;
# wdm.h): what SystemProcessInformation lists a thread as.
THREAD_RUNNING = 2
THREAD_WAITING = 5
WAIT_USER_REQUEST = 6
# The KAPC as wdm.h lays it out on x64: Type, SpareByte0, Size, SpareByte1,
# SpareLong0, Thread, ApcListEntry, then (Reserved[3] in wdm.h, named in
# ReactOS's ndk) KernelRoutine, RundownRoutine, NormalRoutine, then
# NormalContext, SystemArgument1, SystemArgument2, ApcStateIndex, ApcMode,
# Inserted: 0x58 bytes.
KAPC_SIZE = 0x58
KAPC_KERNEL_ROUTINE = 0x20
KAPC_NORMAL_CONTEXT = 0x38
KAPC_SYSTEM_ARGUMENT1 = 0x40
KAPC_MODE = 0x51
KAPC_INSERTED = 0x52
KERNEL_MODE = 0
BUGCHECK_VERIFIER = 0xC4

LEARN = "learn.microsoft.com/windows-hardware/drivers/ddi/"
ROUTINES = {}


def routine(name, max_irql, source, failable=None):
    """Declares the model of `name`. `failable`: the status (or result) it
    returns when the failure plan makes this call fail."""

    def declare(function):
        ROUTINES[name] = (function, max_irql, source, failable)
        return function

    return declare


class Thread:
    """A thread the model runs driver code in."""

    def __init__(self, kernel, process, thread_id, system=False, attached=False, user_frames=None, user_fault=False):
        self.process = process
        self.id = thread_id
        self.system = system
        self.attached = attached
        self.user_frames = list(user_frames or [])
        self.user_fault = user_fault
        # KTHREAD.ApcQueueable cleared (PspExitThread's
        # KeDisableThreadApcQueueing): KeInsertQueueApc refuses.
        self.exiting = False
        # KernelApcDisable != 0 (KeEnterCriticalRegion): special kernel APCs
        # are still delivered; SpecialApcDisable != 0 (KeEnterGuardedRegion):
        # none are.
        self.critical_region = False
        self.guarded_region = False
        # What the thread was doing in the kernel when an APC reaches it
        # (return addresses, innermost first): waiting in KeWaitForSingleObject.
        self.kernel_frames = [KERNEL_FRAMES_BASE + 0x9A00 + thread_id, KERNEL_FRAMES_BASE + 0x7700, KERNEL_FRAMES_BASE + 0x2100]
        # What SystemProcessInformation lists for it (KTHREAD_STATE,
        # KWAIT_REASON, ContextSwitches, kernel+user time in 100 ns): waiting
        # in a user-mode wait until a case makes it run.
        self.state = THREAD_WAITING
        self.wait_reason = WAIT_USER_REQUEST
        self.context_switches = 1
        self.cpu_100ns = 0
        # Addresses of the KAPCs queued to it, oldest first.
        self.apcs = []
        # (kernel routine, arguments) of APCs KiDeliverApc has taken off its
        # queue on another processor, their routines not yet run.
        self.delivering = []
        self.object = kernel.object_blob("thread", self)
        kernel.thread_counts[self.object] = 1


class Process:
    def __init__(self, kernel, process_id, wow64=False, create_time=0):
        self.id = process_id
        self.wow64 = wow64
        self.create_time = create_time
        self.object = kernel.object_blob("process", self)


class Ledger:
    """What Driver Verifier tracks for one load."""

    def __init__(self):
        self.pool = {}
        self.freed = {}
        self.allocations = 0
        self.frees = 0
        self.registrations = []
        self.references = {}
        self.handles = {}

    def register(self, kind, key, site):
        self.registrations.append({"kind": kind, "key": key, "site": site, "undone": None})

    def undo(self, kind, key, site):
        for entry in self.registrations:
            if entry["kind"] == kind and entry["key"] == key and entry["undone"] is None:
                entry["undone"] = site
                return True
        return False

    def live_registrations(self):
        return [entry for entry in self.registrations if entry["undone"] is None]


class Kernel:
    """The kernel state and every routine's model."""

    def __init__(self, machine, symbols):
        self.machine = machine
        self.symbols = symbols
        machine.kernel = self
        self.irql = PASSIVE
        self.calls_checked = 0
        self.exceptions_handled = 0
        self.forced_failures = 0
        self.fail_at = None
        # Routines this Windows does not export (MmGetSystemRoutineAddress
        # finds every modelled one but these).
        self.absent_routines = set()
        self.failable_calls = []
        self.registry = {}
        self.registry_times = {}
        self.boot_time = 133_000_000_000_000_000
        self.time = self.boot_time + 36_000_000_000
        self.counter = 0
        self.processors = 4
        self.processor = 0
        self.expansion_fails = False
        # Threads that run while a driver waits, taking their queued APCs.
        self.running_threads = []
        self.foreign_altitudes = set()
        self.in_driver_entry = False
        self.objects = {}
        # A thread object's pointer count: the kernel's own while the thread
        # runs (dropped at its exit), plus every reference taken on it. At 0
        # the object is deleted, its id with it (PspDeleteThread, ReactOS
        # ntoskrnl/ps/kill.c): any later use is a use after free.
        self.thread_counts = {}
        self.deleted_threads = set()
        self.process_type = self.machine.data(0x100)
        self.thread_type = self.machine.data(0x100)
        self.variables = {
            "PsProcessType": self._variable(self.process_type),
            "PsThreadType": self._variable(self.thread_type),
        }
        self.system_process = Process(self, 4)
        self.current = Thread(self, self.system_process, 8, system=True)
        self.ledgers = []
        # (entry point, "caller" or "callout", path) -> the most of that
        # stack kstack's own frames held at a kernel call (Machine.measure_stack).
        self.stack_use = {}
        self.reset_load()

    def _variable(self, value):
        address = self.machine.data(8)
        self.machine.write_u64(address, value)
        return address

    def object_blob(self, kind, owner):
        address = self.machine.data(0x80)
        self.objects[address] = (kind, owner)
        return address

    def reset_load(self):
        """A new load: nothing registered, nothing allocated."""
        self.ledger = Ledger()
        self.ledgers.append(self.ledger)
        self.device = None
        self.links = {}
        self.notify = {"process": [], "thread": [], "image": []}
        self.registry_callbacks = {}
        self.object_callbacks = {}
        self.timers = {}
        self.dpcs = {}
        # DPCs queued (a timer's expiry) and not yet run.
        self.queued_dpcs = []
        self.completed_irps = {}
        self.apcs = {}
        self.device_address = None
        # The kernel's own reference counts of the objects whose lifetime
        # decides when kstack.sys is unmapped: the driver object (the I/O
        # manager's reference while loaded, one per device) and the device
        # (its creator's, dropped by IoDeleteDevice, plus the driver's own).
        self.object_counts = {}
        self.lifetimes = {}
        # Deleted objects: address -> how ("inline" or "deferred").
        self.deleted_objects = {}
        self.driver_object = None
        # How the image was unmapped, once it is.
        self.image_unloaded = None

    def track_object(self, address, kind):
        """A device or driver object, with its one first reference."""
        self.object_counts[address] = 1
        self.lifetimes[address] = kind

    def drop_object_reference(self, target, how):
        """One reference fewer on a device or driver object. The last one
        deletes it: a device (IopDeleteDevice, ReactOS
        ntoskrnl/io/iomgr/device.c) drops its reference on its driver
        object; a driver object (IopDeleteDriver, driver.c) unmaps its image
        (MmUnloadSystemImage). At PASSIVE_LEVEL with APCs enabled that is
        done before ObfDereferenceObject returns ("inline"); otherwise a
        system worker does it ("deferred"), which may run on another
        processor at once, so the model does it at once either way: the
        earliest Windows can."""
        self.object_counts[target] -= 1
        if self.object_counts[target]:
            return
        del self.object_counts[target]
        self.deleted_objects[target] = how
        if self.lifetimes[target] == "device":
            self.drop_object_reference(self.driver_object, how)
        else:
            self.machine.unload_image()
            self.image_unloaded = how

    def hold_thread(self, thread):
        """A handle open on `thread` (another process's, say): its object
        outlives the thread's exit."""
        self.thread_counts[thread.object] += 1

    def drop_thread_reference(self, thread_object):
        """One reference fewer on a thread object; the last deletes it."""
        self.thread_counts[thread_object] -= 1
        if not self.thread_counts[thread_object]:
            self.deleted_threads.add(thread_object)

    def check_thread_alive(self, thread_object, what, site):
        if thread_object in self.deleted_threads:
            self.violation(f"{what} of thread object 0x{thread_object:X}, deleted at its last reference (a use after free)", site)

    def take_registry_altitude(self, altitude):
        """Another driver's registry callback at `altitude`."""
        self.foreign_altitudes.add(altitude)
        return altitude

    # --- APCs: delivery and thread exit, as the kernel does them -------------
    # Followed: ReactOS ntoskrnl/ke/apc.c (KiDeliverApc, KiInsertQueueApc,
    # KeRemoveQueueApc) and ntoskrnl/ps/kill.c (PspExitThread); where Windows
    # is known to differ, the model says so beside the rule.

    def deliver_apcs(self, thread):
        """`thread` runs again (below APC_LEVEL) and takes its queued kernel
        APCs, as KiDeliverApc does: unless the thread is in a guarded region
        (SpecialApcDisable), each special APC is taken off the queue (Inserted
        cleared) and its kernel routine called in that thread at APC_LEVEL
        with pointers to copies of the KAPC's normal routine, normal context
        and system arguments. A critical region (KernelApcDisable) does not
        hold a special APC back."""
        if thread.apcs and not thread.guarded_region and thread.state == THREAD_WAITING:
            # A waiting thread is unwaited for the APC (KiInsertQueueApc ->
            # KiUnwaitThread, STATUS_KERNEL_APC) and switched to:
            # KiSwapContextResume counts the switch-in
            # (ke/amd64/thrdini.c); it waits again after (ke/wait.c).
            thread.context_switches += 1
        while thread.apcs and not thread.guarded_region:
            apc = thread.apcs.pop(0)
            kernel_routine, arguments = self.dequeue_for_delivery(apc)
            self.run(kernel_routine, arguments, APC, thread, above=self.delivery_frames(thread))

    def dequeue_for_delivery(self, apc):
        """KiDeliverApc's part before the call: the APC off its queue, its
        routine and arguments read from the KAPC itself (not from what the
        driver passed KeInitializeApc), copied to the dispatcher's locals."""
        entry = self.apcs[apc]
        entry["queued"] = False
        self.machine.write(apc + KAPC_INSERTED, b"\0")
        kernel_routine, _rundown, normal, context, argument1, argument2 = struct.unpack("<QQQQQQ", self.machine.read(apc + KAPC_KERNEL_ROUTINE, 48))
        if normal:
            self.violation("a normal kernel APC reached KiDeliverApc: the model delivers special ones only", None)
        copies = self.machine.data(32)
        for index, value in enumerate((normal, context, argument1, argument2)):
            self.machine.write_u64(copies + 8 * index, value)
        return kernel_routine, [apc, copies, copies + 8, copies + 16, copies + 24]

    def delivery_frames(self, thread):
        """The kernel's frames above an APC's kernel routine: the APC
        dispatcher (KiDeliverApc), then what the thread was doing."""
        return [KI_DELIVER_APC] + thread.kernel_frames

    def start_running(self, thread):
        """`thread` runs on another processor: KiDeliverApc there takes its
        queued APCs off the queue at once (Inserted cleared, so
        KeRemoveQueueApc no longer finds them), and their kernel routines
        run while the driver under test waits (KeDelayExecutionThread). APCs
        queued to it later are taken the same way."""
        self.running_threads.append(thread)
        self.take_for_delivery(thread)

    def take_for_delivery(self, thread):
        while thread.apcs and not thread.guarded_region:
            thread.delivering.append(self.dequeue_for_delivery(thread.apcs.pop(0)))

    def next_apc_of_a_running_thread(self):
        """While a driver waits (KeDelayExecutionThread), other threads run
        and take their APCs: the first a running thread has taken off its
        queue, its kernel routine as a callout in that thread at APC_LEVEL,
        or None."""
        for thread in self.running_threads:
            if not thread.delivering:
                continue
            kernel_routine, arguments = thread.delivering.pop(0)
            saved = (self.current, self.irql, self.caller_frames)
            self.current, self.irql, self.caller_frames = thread, APC, self.delivery_frames(thread)
            stack = self.machine.new_stack()
            self.stacks.append(stack)

            def back(saved=saved, kernel_routine=kernel_routine):
                self.machine.free_stack(self.stacks.pop())
                if self.irql != APC:
                    self.violation(f"an APC's kernel routine returned at IRQL {self.irql} (IRQL_UNEXPECTED_VALUE)", kernel_routine)
                self.current, self.irql, self.caller_frames = saved
                return STATUS_SUCCESS

            return Callout(kernel_routine, arguments, stack, back)
        return None

    def advance(self, milliseconds):
        """Time passes: the system time and the performance counter (10 MHz)."""
        self.time += milliseconds * 10_000
        self.counter += milliseconds * 10_000

    def apc_threads(self):
        """The threads with APCs queued."""
        return {entry["thread"] for entry in self.apcs.values() if entry["queued"]}

    def thread_exit(self, thread):
        """`thread` exits, as PspExitThread (ReactOS ntoskrnl/ps/kill.c) runs
        it: near its end KeDisableThreadApcQueueing (no APC can be queued any
        more), then the critical region's exit delivers every kernel APC
        still queued (their kernel routines, at APC_LEVEL in the exiting
        thread), then the user-mode queue is flushed and each of its rundown
        routines called; a kernel APC still queued after that is
        KERNEL_APC_PENDING_DURING_EXIT (0x20). Rundown routines are for the
        user-mode queue only, so kstack's (kernel-mode APCs) is never run
        here."""
        thread.exiting = True
        self.deliver_apcs(thread)
        if thread.apcs:
            raise BugCheck(0x20, f"KERNEL_APC_PENDING_DURING_EXIT: thread {thread.id} exits with {len(thread.apcs)} kernel APC(s) queued")
        self.drop_thread_reference(thread.object)

    def run_down_apcs(self, thread):
        """`thread`'s queued APCs run down as PspExitThread runs down the
        user-mode queue (KeFlushQueueApc, then each rundown routine at
        PASSIVE_LEVEL in the exiting thread). Windows does this for user
        APCs only: a case uses it to reach a kernel APC's rundown routine."""
        thread.exiting = True
        while thread.apcs:
            apc = thread.apcs.pop(0)
            self.apcs[apc]["queued"] = False
            self.machine.write(apc + KAPC_INSERTED, b"\0")
            rundown = self.machine.read_u64(apc + KAPC_KERNEL_ROUTINE + 8)
            if rundown:
                self.run(rundown, [apc], PASSIVE, thread)

    def data_export(self, name):
        return self.variables.get(name)

    # --- naming and violations -----------------------------------------

    def name_site(self, address):
        return self.symbols.name(address - self.machine.base) if self.machine.base <= address < self.machine.base + self.machine.size else f"0x{address:X}"

    def violation(self, text, site, code=BUGCHECK_VERIFIER):
        where = self.name_site(site) if site is not None else "unload"
        raise BugCheck(code, f"{text} (at {where})")

    def resolve_thunk(self, address):
        slot = self.machine.thunk_target(address)
        return None if slot is None else self.machine.import_at_slot(slot)

    # --- calls -----------------------------------------------------------

    def dispatch(self, name, caller):
        if name not in ROUTINES:
            self.violation(f"{name} is called but not modelled", caller)
        function, max_irql, source, failable = ROUTINES[name]
        if max_irql is not None:
            self.calls_checked += 1
            if self.irql > max_irql:
                self.violation(f"{name} called at IRQL {self.irql}, above its maximum {max_irql} ({source})", caller)
        args = self.machine.args(function.__code__.co_argcount - 2)
        if callable(failable):
            failable = failable(args)
        if failable is not None:
            index = len(self.failable_calls)
            self.failable_calls.append((name, caller))
            if self.fail_at == index:
                self.forced_failures += 1
                return failable
        return function(self, caller, *args)

    def dispatch_handler(self, name, caller):
        """A routine the kernel itself calls (the exception dispatcher's
        language handler): counted and IRQL-checked like the others."""
        _function, max_irql, source, _ = ROUTINES[name]
        if max_irql is not None:
            self.calls_checked += 1
            if self.irql > max_irql:
                self.violation(f"{name} dispatched at IRQL {self.irql} ({source})", caller)

    def set_irql(self, irql, site):
        if irql > 15:
            self.violation(f"CR8 written with {irql}", site)
        self.irql = irql

    # --- pool ----------------------------------------------------------

    def allocate(self, size, tag, pool_type, site, zero):
        if not self.in_driver_entry:
            self.violation(f"pool allocated after DriverEntry ({size} bytes, tag {tag_text(tag)}): kstack allocates only at load", site)
        if size == 0:
            self.violation("pool allocation of 0 bytes (Verifier: BAD_POOL_CALLER 0x00)", site)
        if tag == 0 or tag_text(tag) == " kdD":
            self.violation(f"pool allocation without a tag of its own ({tag_text(tag)})", site)
        address, pages = self.machine.map_fresh(size)
        if not zero:
            self.machine.write(address, b"\xa5" * pages)
        self.ledger.pool[address] = {"size": size, "tag": tag, "type": pool_type, "site": site, "pages": pages}
        self.ledger.allocations += 1
        return address

    def free(self, address, tag, site):
        if address in self.ledger.freed:
            self.violation(f"pool at 0x{address:X} freed twice (BAD_POOL_CALLER 0x07)", site, code=0xC2)
        block = self.ledger.pool.pop(address, None)
        if block is None:
            self.violation(f"ExFreePoolWithTag of 0x{address:X}, which is not a pool block (BAD_POOL_CALLER)", site, code=0xC2)
        if tag is not None and tag != block["tag"]:
            self.violation(f"pool block tagged {tag_text(block['tag'])} freed with tag {tag_text(tag)} (BAD_POOL_CALLER 0x0A)", site, code=0xC2)
        self.machine.unmap(address, block["pages"])
        self.ledger.freed[address] = block
        self.ledger.frees += 1

    def check_range(self, address, size, site, what):
        """Special pool's bounds: a write into a pool block stays inside it."""
        for start, block in self.ledger.pool.items():
            if start <= address < start + block["pages"]:
                if address + size > start + block["size"]:
                    self.violation(f"{what} writes {address + size - start - block['size']} bytes past the end of a {block['size']}-byte pool block (special pool)", site, code=0xCD)
                return

    # --- handles and references ------------------------------------------

    def new_handle(self, kind, target, site):
        handle = 0xFFFFFFFF80000000 + 4 * (len(self.ledger.handles) + 1) + 0x1000 * len(self.ledger.registrations)
        self.ledger.handles[handle] = (kind, target)
        self.ledger.register("handle", handle, site)
        return handle

    def reference(self, address):
        self.ledger.references[address] = self.ledger.references.get(address, 0) + 1

    # --- running driver code ----------------------------------------------

    def run(self, target, args, irql=PASSIVE, thread=None, stack_left=None, above=None):
        """Calls driver code as the kernel would: in `thread`, at `irql`, on
        a fresh kernel stack (`stack_left` bytes left on it if given), with
        the kernel's frames `above` it (by default two made-up ones)."""
        self.current = thread or Thread(self, self.system_process, 8, system=True)
        self.irql = irql
        self.caller_frames = list(above) if above is not None else [KERNEL_FRAMES_BASE + 0x1234, KERNEL_FRAMES_BASE + 0x5678]
        stack = self.machine.new_stack()
        self.stacks = [stack]
        try:
            result = self.machine.call(target, args, stack, stack_left)
        finally:
            for used in self.stacks:
                self.machine.free_stack(used)
        if self.irql != irql:
            self.violation(f"returned at IRQL {self.irql}, not the IRQL {irql} it was called at", target)
        entry = self.name_site(target).split("+")[0]
        for (which, path), depth in self.machine.deepest.items():
            key = (entry, which, path)
            self.stack_use[key] = max(self.stack_use.get(key, 0), depth)
        return result


def tag_text(tag):
    return struct.pack("<I", tag & 0xFFFFFFFF).decode("latin-1")


# --- Ex: pool -------------------------------------------------------------


@routine("ExAllocatePoolWithTag", DISPATCH, LEARN + "wdm/nf-wdm-exallocatepoolwithtag: IRQL <= DISPATCH_LEVEL", failable=0)
def ex_allocate_pool_with_tag(k, site, pool_type, size, tag):
    if pool_type != NON_PAGED_POOL_NX:
        k.violation(f"pool type {pool_type}: kstack's memory is non-paged and non-executable (NonPagedPoolNx, 0x200)", site)
    return k.allocate(size, tag & 0xFFFFFFFF, pool_type, site, zero=False)


@routine("ExAllocatePool2", DISPATCH, LEARN + "wdm/nf-wdm-exallocatepool2: IRQL <= DISPATCH_LEVEL", failable=0)
def ex_allocate_pool2(k, site, flags, size, tag):
    if flags & ~(POOL_FLAG_NON_PAGED | POOL_FLAG_UNINITIALIZED) or not flags & POOL_FLAG_NON_PAGED:
        k.violation(f"ExAllocatePool2 flags 0x{flags:X}: kstack's memory is non-paged (POOL_FLAG_NON_PAGED, no NX opt-out)", site)
    return k.allocate(size, tag & 0xFFFFFFFF, "POOL_FLAG_NON_PAGED", site, zero=not flags & POOL_FLAG_UNINITIALIZED)


@routine("ExFreePoolWithTag", DISPATCH, LEARN + "wdm/nf-wdm-exfreepoolwithtag: IRQL <= DISPATCH_LEVEL")
def ex_free_pool_with_tag(k, site, address, tag):
    k.free(address, tag & 0xFFFFFFFF, site)


# --- Io: device, link, requests -----------------------------------------


@routine(
    "IoCreateDevice",
    PASSIVE,
    "learn.microsoft.com/windows-hardware/drivers/devtest/wdm-irqliopassive1: Verifier's rule IrqlIoPassive1, PASSIVE_LEVEL "
    "(the routine's own page says <= APC_LEVEL; Verifier is the stricter)",
    failable=STATUS_INSUFFICIENT_RESOURCES,
)
def io_create_device(k, site, driver, extension_size, name, device_type, characteristics, exclusive, out):
    if k.device is not None:
        return STATUS_OBJECT_NAME_COLLISION
    device = k.machine.data(0x150 + extension_size)
    k.machine.write_u64(device + 0x08, driver)
    k.machine.write_u32(device + 0x30, 0x80)  # DO_DEVICE_INITIALIZING
    k.machine.write_u64(device + 0x10, k.machine.read_u64(driver + 0x08))
    k.machine.write_u64(driver + 0x08, device)
    k.machine.write_u64(out, device)
    k.device = {"address": device, "name": k.machine.read_unicode_string(name) if name else None, "driver": driver}
    k.device_address = device
    # The device references its driver object until it is deleted.
    k.track_object(device, "device")
    k.object_counts[driver] += 1
    k.ledger.register("device", device, site)
    return STATUS_SUCCESS


@routine(
    "IoDeleteDevice",
    APC,
    LEARN + "wdm/nf-wdm-iodeletedevice: IRQL <= APC_LEVEL; after ReactOS ntoskrnl/io/iomgr/device.c IoDeleteDevice: "
    "marked delete-pending and unlinked from its driver, then its creator's reference dropped; the object (and its "
    "reference on the driver object) goes with its last reference",
)
def io_delete_device(k, site, device):
    if not k.ledger.undo("device", device, site):
        k.violation(f"IoDeleteDevice of 0x{device:X}, not a live device of this driver", site)
    driver = k.machine.read_u64(device + 0x08)
    k.machine.write_u64(driver + 0x08, k.machine.read_u64(device + 0x10))
    k.device = None
    k.drop_object_reference(device, "inline" if k.irql == PASSIVE else "deferred")


@routine("IoCreateSymbolicLink", PASSIVE, LEARN + "wdm/nf-wdm-iocreatesymboliclink: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def io_create_symbolic_link(k, site, link, device_name):
    # From here a user can open the device: the driver's dispatch routines
    # and unload routine must already be set.
    driver = k.device["driver"] if k.device else None
    if driver is None or not k.machine.read_u64(driver + 0x70) or not k.machine.read_u64(driver + 0x68):
        k.violation("the symbolic link is created before the driver object's MajorFunction[IRP_MJ_CREATE] and DriverUnload are set", site)
    name = k.machine.read_unicode_string(link)
    if name in k.links:
        return STATUS_OBJECT_NAME_COLLISION
    k.links[name] = k.machine.read_unicode_string(device_name)
    k.ledger.register("symbolic link", name, site)
    return STATUS_SUCCESS


@routine("IoDeleteSymbolicLink", PASSIVE, LEARN + "wdm/nf-wdm-iodeletesymboliclink: IRQL == PASSIVE_LEVEL")
def io_delete_symbolic_link(k, site, link):
    name = k.machine.read_unicode_string(link)
    if not k.ledger.undo("symbolic link", name, site):
        return STATUS_OBJECT_NAME_NOT_FOUND
    del k.links[name]
    return STATUS_SUCCESS


@routine("IoGetStackLimits", None, LEARN + "wdm/nf-wdm-iogetstacklimits: any IRQL (Windows Server 2003 SP1 and later)")
def io_get_stack_limits(k, site, low_out, high_out):
    low, high = k.stacks[-1]
    k.machine.write_u64(low_out, low)
    k.machine.write_u64(high_out, high)


@routine("IoIs32bitProcess", DISPATCH, LEARN + "wdm/nf-wdm-iois32bitprocess: IRQL <= DISPATCH_LEVEL")
def io_is_32bit_process(k, site, irp):
    return 1 if (not k.current.system and k.current.process.wow64) else 0


@routine("IofCompleteRequest", DISPATCH, LEARN + "wdm/nf-wdm-iocompleterequest: IRQL <= DISPATCH_LEVEL")
def iof_complete_request(k, site, irp, boost):
    if irp in k.completed_irps:
        k.violation(f"IRP 0x{irp:X} completed twice (MULTIPLE_IRP_COMPLETE_REQUESTS)", site, code=0x44)
    k.completed_irps[irp] = site


# --- Ke: bug check, timers, DPCs, waits, processors, stacks ------------------


@routine("KeBugCheckEx", None, LEARN + "wdm/nf-wdm-kebugcheckex: any IRQL")
def ke_bug_check_ex(k, site, code, p1, p2, p3, p4):
    k.violation(f"KeBugCheckEx(0x{code:X}, 0x{p1:X}, 0x{p2:X}, 0x{p3:X}, 0x{p4:X}): the driver stopped the machine (a panic)", site, code=code & 0xFFFFFFFF)


@routine("KeInitializeTimerEx", DISPATCH, LEARN + "wdm/nf-wdm-keinitializetimerex: IRQL <= DISPATCH_LEVEL")
def ke_initialize_timer_ex(k, site, timer, timer_type):
    k.timers[timer] = {"set": False, "dpc": None}


@routine("KeInitializeDpc", None, LEARN + "wdm/nf-wdm-keinitializedpc: any IRQL")
def ke_initialize_dpc(k, site, dpc, deferred_routine, context):
    k.dpcs[dpc] = (deferred_routine, context)


@routine("KeSetTimerEx", DISPATCH, LEARN + "wdm/nf-wdm-kesettimerex: IRQL <= DISPATCH_LEVEL")
def ke_set_timer_ex(k, site, timer, due, period, dpc):
    if timer not in k.timers:
        k.violation("KeSetTimerEx on a timer never initialized (KeInitializeTimerEx)", site)
    if dpc and dpc not in k.dpcs:
        k.violation("KeSetTimerEx with a DPC never initialized (KeInitializeDpc)", site)
    was_set = k.timers[timer]["set"]
    if not was_set:
        k.ledger.register("timer", timer, site)
    k.timers[timer] = {"set": True, "dpc": dpc, "period": period & 0xFFFFFFFF}
    return 1 if was_set else 0


@routine(
    "KeCancelTimer",
    DISPATCH,
    LEARN + "wdm/nf-wdm-kecanceltimer: IRQL <= DISPATCH_LEVEL; it takes the timer out of the timer queue, not a DPC "
    "an expiry already queued (ReactOS ntoskrnl/ke/timerobj.c): the model queues that DPC for a set timer, the worst case",
)
def ke_cancel_timer(k, site, timer):
    entry = k.timers.get(timer)
    if entry is None:
        k.violation("KeCancelTimer on a timer never initialized", site)
    if entry["set"]:
        entry["set"] = False
        k.ledger.undo("timer", timer, site)
        if entry["dpc"]:
            k.queued_dpcs.append(entry["dpc"])
        return 1
    return 0


@routine(
    "KeFlushQueuedDpcs",
    PASSIVE,
    LEARN + "wdm/nf-wdm-keflushqueueddpcs: IRQL == PASSIVE_LEVEL; returns after every DPC queued on every processor has run",
)
def ke_flush_queued_dpcs(k, site):
    saved = (k.irql, k.caller_frames)

    def next_dpc():
        if not k.queued_dpcs:
            k.irql, k.caller_frames = saved
            return STATUS_SUCCESS
        dpc = k.queued_dpcs.pop(0)
        routine, context = k.dpcs[dpc]
        # The DPC on its processor, at DISPATCH_LEVEL.
        k.irql = DISPATCH
        stack = k.machine.new_stack()
        k.stacks.append(stack)

        def back():
            k.machine.free_stack(k.stacks.pop())
            if k.irql != DISPATCH:
                k.violation(f"a DPC returned at IRQL {k.irql}", routine)
            return next_dpc()

        return Callout(routine, [dpc, context, 0, 0], stack, back)

    return next_dpc()


@routine("KeDelayExecutionThread", APC, LEARN + "wdm/nf-wdm-kedelayexecutionthread: IRQL <= APC_LEVEL")
def ke_delay_execution_thread(k, site, mode, alertable, interval):
    k.time += 10_000
    return k.next_apc_of_a_running_thread() or STATUS_SUCCESS


@routine("KeGetCurrentProcessorNumberEx", None, LEARN + "wdm/nf-wdm-kegetcurrentprocessornumberex: any IRQL")
def ke_get_current_processor_number_ex(k, site, number):
    if number:
        k.machine.write(number, struct.pack("<HBB", 0, k.processor, 0))
    return k.processor


@routine("KeQueryActiveProcessorCountEx", None, LEARN + "wdm/nf-wdm-kequeryactiveprocessorcountex: any IRQL")
def ke_query_active_processor_count_ex(k, site, group):
    return k.processors


@routine("KeIsAttachedProcess", APC, "undocumented (no learn.microsoft.com page); APC_LEVEL, the stricter annotation seen in public headers")
def ke_is_attached_process(k, site):
    return 1 if k.current.attached else 0


@routine("KeQuerySystemTimePrecise", None, LEARN + "wdm/nf-wdm-kequerysystemtimeprecise: any IRQL")
def ke_query_system_time_precise(k, site, out):
    k.time += 1
    k.machine.write_u64(out, k.time)


@routine("KeQuerySystemTime", None, LEARN + "wdm/nf-wdm-kequerysystemtime-r1: any IRQL")
def ke_query_system_time(k, site, out):
    k.machine.write_u64(out, k.time)


@routine("KeQueryPerformanceCounter", None, LEARN + "wdm/nf-wdm-kequeryperformancecounter: any IRQL")
def ke_query_performance_counter(k, site, frequency):
    if frequency:
        k.machine.write_u64(frequency, 10_000_000)
    k.counter += 17
    return k.counter


@routine(
    "KeExpandKernelStackAndCalloutEx",
    DISPATCH,
    LEARN + "ntddk/nf-ntddk-keexpandkernelstackandcalloutex: IRQL <= DISPATCH_LEVEL, Wait FALSE at DISPATCH_LEVEL, "
    "Size <= MAXIMUM_EXPANSION_SIZE, Context reserved (NULL); the page makes a bad Size or Wait an error return "
    "(STATUS_INVALID_PARAMETER_3, _4), which this model flags as a violation: kstack must never pass one",
    failable=STATUS_NO_MEMORY,
)
def ke_expand_kernel_stack_and_callout_ex(k, site, callout, parameter, size, wait, context):
    if size > MAXIMUM_EXPANSION_SIZE:
        k.violation(f"KeExpandKernelStackAndCalloutEx Size {size} above MAXIMUM_EXPANSION_SIZE {MAXIMUM_EXPANSION_SIZE}", site)
    if wait & 0xFF and k.irql >= DISPATCH:
        k.violation("KeExpandKernelStackAndCalloutEx with Wait TRUE at DISPATCH_LEVEL", site)
    if context:
        k.violation("KeExpandKernelStackAndCalloutEx with a Context, which is reserved and must be NULL", site)
    if k.expansion_fails:
        return STATUS_NO_MEMORY
    # The page guarantees Size bytes, no more: a stack of exactly that
    # (page-rounded). Windows runs the callout in place when the current
    # stack has Size left; the model always switches (kstack asks for a
    # whole kernel stack, which no caller has left).
    stack = k.machine.new_stack((size + 0xFFF) & ~0xFFF)
    k.stacks.append(stack)
    irql = k.irql

    def back():
        k.machine.free_stack(k.stacks.pop())
        if k.irql != irql:
            k.violation(f"the callout returned at IRQL {k.irql}, not {irql}", callout)
        return STATUS_SUCCESS

    return Callout(callout, [parameter], stack, back)


# --- Ke: APCs ---------------------------------------------------------------
# KeInitializeApc and KeInsertQueueApc are exported by every x64 ntoskrnl but
# not documented; their prototypes are the kernel's (as ReactOS and System
# Informer declare them).


@routine(
    "KeInitializeApc",
    DISPATCH,
    "undocumented (no learn.microsoft.com page); after ReactOS ntoskrnl/ke/apc.c KeInitializeApc: with no normal "
    "routine the APC is special, so its mode is KernelMode and its NormalContext NULL whatever the caller passed",
)
def ke_initialize_apc(k, site, apc, thread, environment, kernel_routine, rundown_routine, normal_routine, mode, context):
    owner_of(k, thread, "thread", "KeInitializeApc", site)
    if not kernel_routine:
        k.violation("KeInitializeApc without a kernel routine", site)
    if environment & 0xFFFFFFFF not in (0, 1, 2, 3):
        k.violation(f"KeInitializeApc with environment {environment}, not a KAPC_ENVIRONMENT", site)
    if entry := k.apcs.get(apc):
        if entry["queued"]:
            k.violation(f"KeInitializeApc of 0x{apc:X}, which is still queued (Inserted)", site)
    if not normal_routine:
        # ReactOS KeInitializeApc: "It's a special APC, which can only be
        # kernel mode"; the WRK's KeInitializeApc does the same.
        mode, context = KERNEL_MODE, 0
    k.machine.write(apc, struct.pack("<BBBBI", 0x12, 0, KAPC_SIZE, 0, 0) + struct.pack("<Q", thread) + b"\0" * 16)
    k.machine.write(apc + KAPC_KERNEL_ROUTINE, struct.pack("<QQQQQQ", kernel_routine, rundown_routine, normal_routine, context, 0, 0))
    k.machine.write(apc + 0x50, bytes([environment & 0xFF, mode & 0xFF, 0]))
    k.apcs[apc] = {"thread": k.objects[thread][1], "queued": False}


@routine(
    "KeInsertQueueApc",
    DISPATCH,
    "undocumented (no learn.microsoft.com page); after ReactOS ntoskrnl/ke/apc.c KeInsertQueueApc and KiInsertQueueApc: "
    "FALSE when the thread no longer queues APCs (exiting) or the APC is Inserted already; else the system arguments "
    "are stored in the KAPC, Inserted set, and a special APC queued after the special ones already there",
)
def ke_insert_queue_apc(k, site, apc, argument1, argument2, increment):
    entry = k.apcs.get(apc)
    if entry is None:
        k.violation(f"KeInsertQueueApc of 0x{apc:X}, never initialized (KeInitializeApc)", site)
    # It takes the APC's thread's APC lock first (ReactOS KeInsertQueueApc).
    k.check_thread_alive(entry["thread"].object, "KeInsertQueueApc", site)
    if k.machine.read(apc + KAPC_INSERTED, 1)[0] or entry["thread"].exiting:
        return 0
    entry["queued"] = True
    k.machine.write(apc + KAPC_SYSTEM_ARGUMENT1, struct.pack("<QQ", argument1, argument2))
    k.machine.write(apc + KAPC_INSERTED, b"\1")
    entry["thread"].apcs.append(apc)
    if entry["thread"] in k.running_threads:
        k.take_for_delivery(entry["thread"])
    return 1


@routine(
    "KeRemoveQueueApc",
    DISPATCH,
    "undocumented (no learn.microsoft.com page); after ReactOS ntoskrnl/ke/apc.c KeRemoveQueueApc: under the thread's "
    "APC lock, TRUE and the APC off its queue (Inserted cleared) if it was Inserted, else FALSE; no routine of the APC runs",
)
def ke_remove_queue_apc(k, site, apc):
    entry = k.apcs.get(apc)
    if entry is None:
        k.violation(f"KeRemoveQueueApc of 0x{apc:X}, never initialized (KeInitializeApc)", site)
    # It takes the APC's thread's APC lock first (ReactOS KeRemoveQueueApc).
    k.check_thread_alive(entry["thread"].object, "KeRemoveQueueApc", site)
    if not k.machine.read(apc + KAPC_INSERTED, 1)[0]:
        return 0
    entry["queued"] = False
    entry["thread"].apcs.remove(apc)
    k.machine.write(apc + KAPC_INSERTED, b"\0")
    return 1


@routine(
    "KeAreApcsDisabled",
    None,
    LEARN + "wdm/nf-wdm-keareapcsdisabled: any IRQL; TRUE in a critical or guarded region (ReactOS ntoskrnl/ke/apc.c: "
    "the thread's CombinedApcDisable, whatever the IRQL)",
)
def ke_are_apcs_disabled(k, site):
    return 1 if (k.current.critical_region or k.current.guarded_region) else 0


@routine("ObfReferenceObject", DISPATCH, LEARN + "wdm/nf-wdm-obfreferenceobject: IRQL <= DISPATCH_LEVEL")
def obf_reference_object(k, site, target):
    if target in k.deleted_objects:
        k.violation(f"ObfReferenceObject of 0x{target:X}, an object already deleted", site)
    k.check_thread_alive(target, "ObfReferenceObject", site)
    k.reference(target)
    if target in k.thread_counts:
        k.thread_counts[target] += 1
    if target in k.object_counts:
        k.object_counts[target] += 1
    return k.ledger.references[target]


# --- Mm: routine lookup -------------------------------------------------


@routine("MmGetSystemRoutineAddress", PASSIVE, LEARN + "wdm/nf-wdm-mmgetsystemroutineaddress: IRQL == PASSIVE_LEVEL")
def mm_get_system_routine_address(k, site, name):
    text = k.machine.read_unicode_string(name)
    if text in ROUTINES and text not in k.absent_routines:
        return k.machine.stub_for(text)
    return 0


# --- Ob: objects, references, callbacks ---------------------------------------


@routine("ObOpenObjectByPointer", APC, LEARN + "ntifs/nf-ntifs-obopenobjectbypointer: IRQL <= APC_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def ob_open_object_by_pointer(k, site, target, attributes, access_state, access, object_type, mode, out):
    if not attributes & OBJ_KERNEL_HANDLE:
        k.violation("ObOpenObjectByPointer without OBJ_KERNEL_HANDLE", site)
    k.machine.write_u64(out, k.new_handle("object", target, site))
    return STATUS_SUCCESS


@routine(
    "ObfDereferenceObject",
    DISPATCH,
    LEARN + "wdm/nf-wdm-obdereferenceobject: IRQL <= DISPATCH_LEVEL; the last reference deletes the object (ReactOS "
    "ntoskrnl/ob/obref.c ObfDereferenceObject: inline at PASSIVE_LEVEL, else queued to a system worker)",
)
def obf_dereference_object(k, site, target):
    count = k.ledger.references.get(target, 0)
    if count <= 0:
        k.violation(f"ObDereferenceObject of 0x{target:X}, which holds no reference this driver took", site)
    k.ledger.references[target] = count - 1
    if target in k.thread_counts:
        k.drop_thread_reference(target)
    if target in k.object_counts:
        # ReactOS: inline below APC_LEVEL outside a guarded region; a
        # critical region alone does not defer.
        k.drop_object_reference(target, "inline" if k.irql == PASSIVE and not k.current.guarded_region else "deferred")
    return count - 1


@routine("ObRegisterCallbacks", APC, LEARN + "wdm/nf-wdm-obregistercallbacks: IRQL <= APC_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def ob_register_callbacks(k, site, registration, handle_out):
    version, count = struct.unpack("<HH", k.machine.read(registration, 4))
    if version != 0x100:
        return STATUS_INVALID_PARAMETER
    altitude = k.machine.read_unicode_string(registration + 0x08)
    context = k.machine.read_u64(registration + 0x18)
    operations = k.machine.read_u64(registration + 0x20)
    entries = []
    for index in range(count):
        entry = operations + 0x20 * index
        type_variable = k.machine.read_u64(entry)
        object_type = k.machine.read_u64(type_variable)
        kind = {k.process_type: "process", k.thread_type: "thread"}.get(object_type)
        if kind is None:
            return STATUS_INVALID_PARAMETER
        entries.append({
            "type": kind,
            "operations": k.machine.read_u32(entry + 0x08),
            "pre": k.machine.read_u64(entry + 0x10),
            "post": k.machine.read_u64(entry + 0x18),
        })
    if any(callbacks["altitude"] == altitude for callbacks in k.object_callbacks.values()):
        return 0xC01C0011  # STATUS_FLT_INSTANCE_ALTITUDE_COLLISION
    handle = k.machine.data(0x10)
    k.object_callbacks[handle] = {"altitude": altitude, "context": context, "entries": entries}
    k.ledger.register("object callbacks", handle, site)
    k.machine.write_u64(handle_out, handle)
    return STATUS_SUCCESS


@routine("ObUnRegisterCallbacks", APC, LEARN + "wdm/nf-wdm-obunregistercallbacks: IRQL <= APC_LEVEL")
def ob_unregister_callbacks(k, site, handle):
    if not k.ledger.undo("object callbacks", handle, site):
        k.violation("ObUnRegisterCallbacks of a registration that is not live", site)
    del k.object_callbacks[handle]


# --- Ps: processes, threads, notify routines -------------------------------------


@routine("PsGetCurrentProcessId", None, LEARN + "ntddk/nf-ntddk-psgetcurrentprocessid: any IRQL")
def ps_get_current_process_id(k, site):
    return k.current.process.id


@routine("PsGetCurrentThreadId", None, LEARN + "ntddk/nf-ntddk-psgetcurrentthreadid: any IRQL")
def ps_get_current_thread_id(k, site):
    return k.current.id


@routine("PsGetCurrentThread", None, LEARN + "wdm/nf-wdm-psgetcurrentthread: any IRQL")
def ps_get_current_thread(k, site):
    return k.current.object


def owner_of(k, address, kind, routine_name, site):
    """The modelled process or thread behind an object pointer the driver
    passes; anything else is a violation."""
    found, owner = k.objects.get(address, (None, None))
    if found != kind:
        k.violation(f"{routine_name} of 0x{address:X}, not a {kind} object", site)
    k.check_thread_alive(address, routine_name, site)
    return owner


def look_up(k, kind, wanted, out):
    """Ps*Lookup*ById: a referenced object, which the caller must
    dereference; STATUS_INVALID_PARAMETER when no such id (the pages'
    return value, and ReactOS ntoskrnl/ps/thread.c and process.c). An
    exited thread or process is still found while its object exists (ReactOS
    checks no exit flag)."""
    for address, (found, owner) in k.objects.items():
        if found == kind and owner.id == wanted and address not in k.deleted_threads:
            k.reference(address)
            if address in k.thread_counts:
                k.thread_counts[address] += 1
            k.machine.write_u64(out, address)
            return STATUS_SUCCESS
    return STATUS_INVALID_PARAMETER


@routine("IoGetCurrentProcess", None, LEARN + "wdm/nf-wdm-iogetcurrentprocess: any IRQL")
def io_get_current_process(k, site):
    return k.current.process.object


@routine("PsLookupThreadByThreadId", APC, LEARN + "ntifs/nf-ntifs-pslookupthreadbythreadid: IRQL <= APC_LEVEL", failable=STATUS_INVALID_PARAMETER)
def ps_lookup_thread_by_thread_id(k, site, thread_id, out):
    return look_up(k, "thread", thread_id, out)


@routine("PsGetProcessId", None, LEARN + "ntddk/nf-ntddk-psgetprocessid: any IRQL")
def ps_get_process_id(k, site, process):
    return owner_of(k, process, "process", "PsGetProcessId", site).id


@routine("PsGetThreadProcessId", None, LEARN + "ntddk/nf-ntddk-psgetthreadprocessid: any IRQL")
def ps_get_thread_process_id(k, site, thread):
    return owner_of(k, thread, "thread", "PsGetThreadProcessId", site).process.id


@routine("PsIsSystemThread", DISPATCH, LEARN + "ntifs/nf-ntifs-psissystemthread: IRQL <= DISPATCH_LEVEL")
def ps_is_system_thread(k, site, thread):
    return 1 if owner_of(k, thread, "thread", "PsIsSystemThread", site).system else 0


@routine("PsLookupProcessByProcessId", APC, LEARN + "ntifs/nf-ntifs-pslookupprocessbyprocessid: IRQL <= APC_LEVEL", failable=STATUS_INVALID_PARAMETER)
def ps_lookup_process_by_process_id(k, site, process_id, out):
    return look_up(k, "process", process_id, out)


@routine("PsGetProcessCreateTimeQuadPart", None, LEARN + "ntddk/nf-ntddk-psgetprocesscreatetimequadpart: any IRQL")
def ps_get_process_create_time_quad_part(k, site, process):
    return owner_of(k, process, "process", "PsGetProcessCreateTimeQuadPart", site).create_time


def set_notify(k, site, kind, function, remove):
    """Registers or removes a notify routine. Removing one not registered
    is STATUS_PROCEDURE_NOT_FOUND (the Ps*Remove* pages; ReactOS
    ntoskrnl/ps/psnotify.c); registering one twice STATUS_INVALID_PARAMETER
    (PsSetCreateProcessNotifyRoutineEx's page, applied to all three)."""
    if remove:
        if function not in k.notify[kind]:
            return STATUS_PROCEDURE_NOT_FOUND
        k.notify[kind].remove(function)
        k.ledger.undo(f"{kind} notify", function, site)
        return STATUS_SUCCESS
    if function in k.notify[kind]:
        return STATUS_INVALID_PARAMETER
    k.notify[kind].append(function)
    k.ledger.register(f"{kind} notify", function, site)
    return STATUS_SUCCESS


@routine(
    "PsSetCreateProcessNotifyRoutineEx",
    PASSIVE,
    LEARN + "ntddk/nf-ntddk-pssetcreateprocessnotifyroutineex: IRQL == PASSIVE_LEVEL",
    # Registering can run out of resources; removing a registered routine cannot fail.
    failable=lambda args: None if args[1] & 0xFF else STATUS_INSUFFICIENT_RESOURCES,
)
def ps_set_create_process_notify_routine_ex(k, site, function, remove):
    return set_notify(k, site, "process", function, remove & 0xFF)


@routine("PsSetCreateThreadNotifyRoutine", PASSIVE, LEARN + "ntddk/nf-ntddk-pssetcreatethreadnotifyroutine: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def ps_set_create_thread_notify_routine(k, site, function):
    return set_notify(k, site, "thread", function, False)


@routine("PsRemoveCreateThreadNotifyRoutine", APC, LEARN + "ntddk/nf-ntddk-psremovecreatethreadnotifyroutine: IRQL <= APC_LEVEL")
def ps_remove_create_thread_notify_routine(k, site, function):
    return set_notify(k, site, "thread", function, True)


@routine("PsSetLoadImageNotifyRoutine", PASSIVE, LEARN + "ntddk/nf-ntddk-pssetloadimagenotifyroutine: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def ps_set_load_image_notify_routine(k, site, function):
    return set_notify(k, site, "image", function, False)


@routine("PsRemoveLoadImageNotifyRoutine", APC, LEARN + "ntddk/nf-ntddk-psremoveloadimagenotifyroutine: IRQL <= APC_LEVEL")
def ps_remove_load_image_notify_routine(k, site, function):
    return set_notify(k, site, "image", function, True)


# --- Cm: registry callbacks ------------------------------------------------------


@routine("CmRegisterCallbackEx", APC, LEARN + "wdm/nf-wdm-cmregistercallbackex: IRQL <= APC_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def cm_register_callback_ex(k, site, function, altitude, driver, context, cookie_out, reserved):
    if reserved:
        k.violation("CmRegisterCallbackEx with Reserved not NULL", site)
    altitude_text = k.machine.read_unicode_string(altitude)
    taken = k.foreign_altitudes | {callback["altitude"] for callback in k.registry_callbacks.values()}
    if altitude_text in taken:
        return 0xC01C0011  # STATUS_FLT_INSTANCE_ALTITUDE_COLLISION
    cookie = 0x1000 + len(k.ledger.registrations)
    k.registry_callbacks[cookie] = {"function": function, "context": context, "altitude": altitude_text}
    k.ledger.register("registry callback", cookie, site)
    k.machine.write_u64(cookie_out, cookie)
    return STATUS_SUCCESS


@routine("CmUnRegisterCallback", APC, LEARN + "wdm/nf-wdm-cmunregistercallback: IRQL <= APC_LEVEL")
def cm_unregister_callback(k, site, cookie):
    if not k.ledger.undo("registry callback", cookie, site):
        return STATUS_INVALID_PARAMETER
    del k.registry_callbacks[cookie]
    return STATUS_SUCCESS


# --- Rtl: stacks, security, memory -------------------------------------------


@routine(
    "RtlCaptureStackBackTrace",
    None,
    LEARN + "ntifs/nf-ntifs-rtlcapturestackbacktrace: no IRQL given; on x64 the walk can need a page fault "
    "where none is allowed (kstack's paging policy decides, not this check)",
)
def rtl_capture_stack_back_trace(k, site, skip, count, out, hash_out):
    frames = k.machine.unwind(site) + k.caller_frames
    frames = frames[skip & 0xFFFFFFFF :][: count & 0xFFFFFFFF]
    for index, frame in enumerate(frames):
        k.machine.write_u64(out + 8 * index, frame)
    if hash_out:
        k.machine.write_u32(hash_out, sum(frames) & 0xFFFFFFFF)
    return len(frames)


@routine(
    "RtlWalkFrameChain",
    APC,
    LEARN + "ntddk/nf-ntddk-rtlwalkframechain: reserved, no IRQL given; with RTL_WALK_USER_MODE_STACK it reads "
    "pageable user memory, so below DISPATCH_LEVEL, where a page fault can be taken",
)
def rtl_walk_frame_chain(k, site, out, count, flags):
    if flags != 1:
        k.violation(f"RtlWalkFrameChain flags {flags}: kstack walks only the user stack (1)", site)
    thread = k.current
    if thread.system:
        return 0
    if thread.user_fault:
        raise Raise(STATUS_ACCESS_VIOLATION)
    frames = thread.user_frames[: count & 0xFFFFFFFF]
    k.check_range(out, 8 * len(frames), site, "RtlWalkFrameChain")
    for index, frame in enumerate(frames):
        k.machine.write_u64(out + 8 * index, frame)
    return len(frames)


@routine(
    "__C_specific_handler",
    None,
    "learn.microsoft.com/windows/win32/devnotes/--c-specific-handler2: the language handler the exception "
    "dispatcher calls for a frame whose unwind information names it; no IRQL given",
)
def c_specific_handler(k, site, record, frame, context, dispatcher):
    k.violation("__C_specific_handler called directly", site)


@routine("RtlCreateAcl", APC, LEARN + "ntifs/nf-ntifs-rtlcreateacl: IRQL <= APC_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def rtl_create_acl(k, site, acl, length, revision):
    if length < 8:
        return STATUS_BUFFER_TOO_SMALL
    k.machine.write(acl, struct.pack("<BBHHH", revision, 0, length, 0, 0))
    return STATUS_SUCCESS


@routine("RtlAddAccessAllowedAce", APC, LEARN + "ntifs/nf-ntifs-rtladdaccessallowedace: IRQL < DISPATCH_LEVEL")
def rtl_add_access_allowed_ace(k, site, acl, revision, mask, sid):
    _revision, _, size, count, _ = struct.unpack("<BBHHH", k.machine.read(acl, 8))
    sid_length = 8 + 4 * k.machine.read(sid + 1, 1)[0]
    used = 8
    for _ in range(count):
        used += struct.unpack("<H", k.machine.read(acl + used + 2, 2))[0]
    ace = 8 + sid_length
    if used + ace > size:
        return 0xC0000099  # STATUS_ALLOTTED_SPACE_EXCEEDED
    k.machine.write(acl + used, struct.pack("<BBHI", 0, 0, ace, mask & 0xFFFFFFFF) + k.machine.read(sid, sid_length))
    k.machine.write(acl + 4, struct.pack("<H", count + 1))
    return STATUS_SUCCESS


@routine("RtlCreateSecurityDescriptor", PASSIVE, LEARN + "wdm/nf-wdm-rtlcreatesecuritydescriptor: IRQL == PASSIVE_LEVEL")
def rtl_create_security_descriptor(k, site, descriptor, revision):
    k.machine.write(descriptor, struct.pack("<BBH", revision, 0, 0) + b"\0" * 36)
    return STATUS_SUCCESS


@routine("RtlSetDaclSecurityDescriptor", PASSIVE, LEARN + "wdm/nf-wdm-rtlsetdaclsecuritydescriptor: IRQL == PASSIVE_LEVEL")
def rtl_set_dacl_security_descriptor(k, site, descriptor, present, dacl, defaulted):
    k.machine.write_u64(descriptor + 0x20, dacl)
    return STATUS_SUCCESS


@routine("memcpy", None, LEARN + "wdm/nf-wdm-rtlcopymemory: any IRQL on non-paged memory")
def memcpy(k, site, destination, source, size):
    k.check_range(destination, size, site, "memcpy")
    if size:
        k.machine.write(destination, k.machine.read(source, size))
    return destination


@routine("memmove", None, LEARN + "wdm/nf-wdm-rtlmovememory: any IRQL on non-paged memory; the ranges may overlap")
def memmove(k, site, destination, source, size):
    k.check_range(destination, size, site, "memmove")
    if size:
        k.machine.write(destination, k.machine.read(source, size))
    return destination


@routine("memset", None, LEARN + "wdm/nf-wdm-rtlfillmemory: any IRQL on non-paged memory")
def memset(k, site, destination, value, size):
    k.check_range(destination, size, site, "memset")
    if size:
        k.machine.write(destination, bytes([value & 0xFF]) * size)
    return destination


# --- Zw: registry, handles, security, system information -------------------------


OBJ_KERNEL_HANDLE = 0x200


def object_name(k, attributes, site):
    """The name an OBJECT_ATTRIBUTES gives. A driver's handle must be a
    kernel handle (OBJ_KERNEL_HANDLE): otherwise it lands in whatever
    process the thread runs in, which Verifier's handle checks flag
    (learn.microsoft.com/windows-hardware/drivers/devtest/handle-checking)."""
    if not k.machine.read_u32(attributes + 0x18) & OBJ_KERNEL_HANDLE:
        k.violation("a handle opened without OBJ_KERNEL_HANDLE", site)
    name = k.machine.read_u64(attributes + 0x10)
    return k.machine.read_unicode_string(name).lower()


@routine("ZwOpenKey", PASSIVE, LEARN + "wdm/nf-wdm-zwopenkey: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def zw_open_key(k, site, handle_out, access, attributes):
    path = object_name(k, attributes, site)
    if path not in k.registry:
        return STATUS_OBJECT_NAME_NOT_FOUND
    k.machine.write_u64(handle_out, k.new_handle("key", path, site))
    return STATUS_SUCCESS


@routine("ZwCreateKey", PASSIVE, LEARN + "wdm/nf-wdm-zwcreatekey: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def zw_create_key(k, site, handle_out, access, attributes, title_index, class_name, options, disposition):
    path = object_name(k, attributes, site)
    created = path not in k.registry
    k.registry.setdefault(path, {})
    if created:
        k.registry_times[path] = k.time
    if disposition:
        k.machine.write_u32(disposition, 1 if created else 2)
    k.machine.write_u64(handle_out, k.new_handle("key", path, site))
    return STATUS_SUCCESS


def key_of(k, handle, site):
    kind, path = k.ledger.handles.get(handle, (None, None))
    if kind != "key":
        k.violation(f"a registry routine given 0x{handle:X}, not an open key handle", site)
    return path


@routine("ZwQueryKey", PASSIVE, LEARN + "wdm/nf-wdm-zwquerykey: IRQL == PASSIVE_LEVEL")
def zw_query_key(k, site, handle, information_class, buffer, length, result_length):
    path = key_of(k, handle, site)
    if information_class != 0:  # KeyBasicInformation: LastWriteTime, TitleIndex, NameLength, Name
        return STATUS_INVALID_PARAMETER
    if result_length:
        k.machine.write_u32(result_length, 16)
    if length < 16:
        return STATUS_BUFFER_TOO_SMALL
    k.machine.write(buffer, struct.pack("<QII", k.registry_times.get(path, k.boot_time - 1), 0, 0))
    return STATUS_SUCCESS


@routine("ZwQueryValueKey", PASSIVE, LEARN + "wdm/nf-wdm-zwqueryvaluekey: IRQL == PASSIVE_LEVEL")
def zw_query_value_key(k, site, handle, name, information_class, buffer, length, result_length):
    path = key_of(k, handle, site)
    value = k.registry[path].get(k.machine.read_unicode_string(name).lower())
    if value is None:
        return STATUS_OBJECT_NAME_NOT_FOUND
    kind, data = value
    if information_class != 2:  # KeyValuePartialInformation: TitleIndex, Type, DataLength, Data
        return STATUS_INVALID_PARAMETER
    needed = 12 + len(data)
    if result_length:
        k.machine.write_u32(result_length, needed)
    if length < needed:
        return STATUS_BUFFER_TOO_SMALL if length < 12 else 0x80000005
    k.machine.write(buffer, struct.pack("<III", 0, kind, len(data)) + data)
    return STATUS_SUCCESS


@routine("ZwSetValueKey", PASSIVE, LEARN + "wdm/nf-wdm-zwsetvaluekey: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def zw_set_value_key(k, site, handle, name, title_index, kind, data, size):
    path = key_of(k, handle, site)
    k.registry[path][k.machine.read_unicode_string(name).lower()] = (kind, k.machine.read(data, size) if size else b"")
    k.registry_times[path] = k.time
    return STATUS_SUCCESS


@routine("ZwClose", PASSIVE, LEARN + "wdm/nf-wdm-zwclose: IRQL == PASSIVE_LEVEL")
def zw_close(k, site, handle):
    if handle not in k.ledger.handles:
        k.violation(f"ZwClose of 0x{handle:X}, not an open handle of this driver (INVALID_KERNEL_HANDLE)", site, code=0x93)
    del k.ledger.handles[handle]
    k.ledger.undo("handle", handle, site)
    return STATUS_SUCCESS


@routine("ZwSetSecurityObject", PASSIVE, LEARN + "ntifs/nf-ntifs-zwsetsecurityobject: IRQL == PASSIVE_LEVEL", failable=STATUS_INSUFFICIENT_RESOURCES)
def zw_set_security_object(k, site, handle, information, descriptor):
    kind, target = k.ledger.handles.get(handle, (None, None))
    if kind != "object":
        return STATUS_INVALID_HANDLE
    k.device_security = k.machine.read_u64(descriptor + 0x20)
    return STATUS_SUCCESS


@routine(
    "ZwQuerySystemInformation",
    PASSIVE,
    "learn.microsoft.com/windows/win32/sysinfo/zwquerysysteminformation: no IRQL given; PASSIVE_LEVEL as every Zw routine's page says",
    failable=STATUS_INSUFFICIENT_RESOURCES,
)
def zw_query_system_information(k, site, information_class, buffer, length, result_length):
    if information_class != 3:  # SystemTimeOfDayInformation
        return 0xC0000003  # STATUS_INVALID_INFO_CLASS
    data = struct.pack("<qqqIIQQ", k.boot_time, k.time, 0, 0, 0, 0, 0)
    if result_length:
        k.machine.write_u32(result_length, min(length, len(data)))
    if length < len(data):
        return 0xC0000004  # STATUS_INFO_LENGTH_MISMATCH
    k.machine.write(buffer, data)
    return STATUS_SUCCESS
