"""What Windows does around a driver: loads it (service key, driver object,
DriverEntry at PASSIVE_LEVEL in a system thread), sends it requests as the
I/O manager does (an IRP per request, METHOD_BUFFERED system buffers, in the
requesting thread at PASSIVE_LEVEL), fires its callbacks at the IRQL and in
the thread Windows uses, and unloads it. After unload it checks the ledger:
every allocation freed, every registration undone once, every reference
dropped.
"""

import json
import struct
import subprocess

from emulator import BugCheck
from ntoskrnl import DISPATCH, PASSIVE, ROUTINES, STATUS_SUCCESS, Kernel, Process, Thread, tag_text

SERVICE_KEY = r"\Registry\Machine\System\CurrentControlSet\Services\kstack"
PAGING_KEY = r"\registry\machine\system\currentcontrolset\control\session manager\memory management"
IRP_MJ_CREATE, IRP_MJ_CLOSE, IRP_MJ_DEVICE_CONTROL = 0, 2, 0xE
REG_DWORD = 4
STATUS_IMAGE_ALREADY_LOADED = 0xC000010E


class Bridge:
    """kstack-abi's codes, encoders and decoders, through the
    `kernel-host-abi` program (so no layout is written twice)."""

    def __init__(self, path):
        self.process = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.facts = self.ask(op="facts")

    def ask(self, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        if "error" in answer:
            raise ValueError(f"kernel-host-abi: {answer['error']} (for {request})")
        return answer


class Windows:
    """One modelled machine with kstack.sys on it."""

    def __init__(self, machine, symbols, bridge):
        self.machine = machine
        self.bridge = bridge
        self.kernel = Kernel(machine, symbols)
        unmodelled = sorted({name for _, (_, name) in machine.imports} - set(ROUTINES) - set(self.kernel.variables))
        if unmodelled:
            raise SystemExit(f"kstack.sys imports {', '.join(unmodelled)}, which the modelled kernel lacks: model each in ntoskrnl.py, after its WDK contract")
        self.driver = None
        self.processes = {}
        self.next_id = 1000
        self.loaded = False
        self.after_reload = None
        self.received_stacks = {}

    # --- processes and threads -------------------------------------------

    def process(self, wow64=False):
        self.next_id += 4
        process = Process(self.kernel, self.next_id, wow64=wow64, create_time=self.kernel.time - self.next_id)
        self.processes[process.id] = process
        return process

    def user_thread(self, process=None, user_frames=None, user_fault=False, attached=False):
        process = process or self.process()
        self.next_id += 4
        frames = user_frames if user_frames is not None else [0x7FF6_1234_0000 + 0x10 * n for n in range(8)]
        return Thread(self.kernel, process, self.next_id, attached=attached, user_frames=frames, user_fault=user_fault)

    def system_thread(self):
        self.next_id += 4
        return Thread(self.kernel, self.kernel.system_process, self.next_id, system=True)

    # --- load and unload -------------------------------------------------

    def set_parameter(self, name, value):
        path = (SERVICE_KEY + r"\Parameters").lower()
        self.kernel.registry.setdefault(path, {})[name.lower()] = (REG_DWORD, struct.pack("<I", value))

    def set_paging_executive(self, value, written_after_boot=False):
        self.kernel.registry.setdefault(PAGING_KEY, {})["disablepagingexecutive"] = (REG_DWORD, struct.pack("<I", value))
        self.kernel.registry_times[PAGING_KEY] = self.kernel.time if written_after_boot else self.kernel.boot_time - 10_000_000

    def load(self, fail_at=None):
        """DriverEntry as the I/O manager calls it: its NTSTATUS. While the
        previous load's image is still mapped (its driver object not yet
        deleted), MmLoadSystemImage finds it and the load fails with
        STATUS_IMAGE_ALREADY_LOADED (ReactOS ntoskrnl/mm/ARM3/sysldr.c; `sc
        start` shows 1056)."""
        kernel = self.kernel
        if self.driver is not None and self.driver not in kernel.deleted_objects:
            return STATUS_IMAGE_ALREADY_LOADED
        self.machine.reload()
        if self.after_reload:
            self.after_reload()
        kernel.reset_load()
        kernel.fail_at = fail_at
        kernel.failable_calls = []
        kernel.registry.setdefault(SERVICE_KEY.lower(), {})
        m = self.machine
        self.driver = m.data(0x150)
        m.write(self.driver, struct.pack("<HH", 4, 0x150))
        m.write_u64(self.driver + 0x18, m.base)
        m.write_u32(self.driver + 0x20, m.size)
        # The I/O manager's reference on the driver object while the driver
        # is loaded (ReactOS ntoskrnl/io/iomgr/driver.c).
        kernel.driver_object = self.driver
        kernel.track_object(self.driver, "driver")
        registry_path = self.unicode(SERVICE_KEY)
        kernel.in_driver_entry = True
        try:
            status = kernel.run(m.entry, [self.driver, registry_path], PASSIVE, self.system_thread()) & 0xFFFFFFFF
        finally:
            kernel.in_driver_entry = False
        kernel.fail_at = None
        self.loaded = status < 0x80000000
        if not self.loaded:
            # A failed DriverEntry: the I/O manager deletes the driver object.
            kernel.drop_object_reference(self.driver, "inline")
            self.check_clean("after the failed DriverEntry")
        return status

    def unload(self, leaves=frozenset()):
        """DriverUnload, then Verifier's unload checks. `leaves`: the tags of
        pool blocks the driver documents it leaves allocated in this case
        (each must be left, with the device references its APCs hold);
        returns what was left."""
        unload = self.machine.read_u64(self.driver + 0x68)
        if not unload:
            raise BugCheck(0xCE, "the driver has no DriverUnload: it could never be stopped")
        self.kernel.run(unload, [self.driver], PASSIVE, self.system_thread())
        self.loaded = False
        # IopUnloadDriver (ReactOS ntoskrnl/io/iomgr/driver.c), once
        # DriverUnload has returned: the driver object made temporary and
        # its load reference dropped. The image stays mapped while any of
        # its devices is still referenced.
        self.kernel.drop_object_reference(self.driver, "inline")
        self.check_clean("at unload", leaves)
        return ", ".join(sorted(leaves))

    def check_clean(self, when, leaves=frozenset()):
        """Verifier's checks once the driver is gone: nothing allocated,
        registered or referenced, but the pool blocks of the tags in
        `leaves`, which must be left, and the references the APCs still
        queued hold (their thread and the device)."""
        ledger = self.kernel.ledger
        problems = []
        left = {tag_text(block["tag"]) for block in ledger.pool.values()}
        if not set(leaves) <= left:
            problems.append(f"pool tagged {sorted(set(leaves) - left)} was freed, though an APC may still use it")
        held = set()
        for entry in self.kernel.apcs.values():
            if entry["queued"]:
                held |= {entry["thread"].object, self.kernel.device_address}
        for address, block in ledger.pool.items():
            if tag_text(block["tag"]) in leaves:
                continue
            problems.append(f"{block['size']} bytes of pool (tag '{tag_text(block['tag'])}') allocated at {self.kernel.name_site(block['site'])} never freed")
        for entry in ledger.live_registrations():
            problems.append(f"{entry['kind']} registered at {self.kernel.name_site(entry['site'])} not undone")
        for target, count in ledger.references.items():
            if count and target not in held:
                problems.append(f"{count} reference(s) to object 0x{target:X} not dropped")
        if self.kernel.device is not None:
            problems.append("the device object is still there")
        if not held and self.machine.image_mapped:
            problems.append("the image is still mapped, though nothing references its device or driver object")
        if self.kernel.queued_dpcs:
            problems.append(f"{len(self.kernel.queued_dpcs)} DPC(s) still queued: they would run after the driver freed its state (KeFlushQueuedDpcs)")
        if problems:
            raise BugCheck(0xCE, f"{when}: " + "; ".join(problems))

    # --- memory the kernel owns -------------------------------------------

    def unicode(self, text):
        encoded = text.encode("utf-16-le")
        m = self.machine
        buffer = m.data(len(encoded) + 2)
        m.write(buffer, encoded)
        string = m.data(16)
        m.write(string, struct.pack("<HHIQ", len(encoded), len(encoded) + 2, 0, buffer))
        return string

    def io_buffer(self, size):
        return self.machine.map_fresh(size)

    # --- requests ----------------------------------------------------------

    def irp(self, major, file_object, thread, code=0, input_bytes=b"", output_length=0, stack_left=None):
        """Sends one IRP to the driver's dispatch routine: (status, output)."""
        m = self.machine
        dispatch = m.read_u64(self.driver + 0x70 + 8 * major)
        if not dispatch:
            raise BugCheck(0xC4, f"no dispatch routine for major function {major}")
        device = self.kernel.device["address"]
        length = max(len(input_bytes), output_length)
        buffer, pages = self.io_buffer(length) if length else (0, 0)
        if input_bytes:
            m.write(buffer, input_bytes)
        irp, irp_pages = self.io_buffer(0xD0 + 0x48)
        m.write(irp, struct.pack("<HH", 6, 0xD0 + 0x48))
        m.write_u64(irp + 0x18, buffer)
        m.write(irp + 0x40, b"\x01")  # RequestorMode: UserMode
        location = irp + 0xD0
        m.write_u64(irp + 0xB8, location)
        m.write(location, bytes([major]))
        m.write_u32(location + 0x08, output_length)
        m.write_u32(location + 0x10, len(input_bytes))
        m.write_u32(location + 0x18, code)
        m.write_u64(location + 0x28, device)
        m.write_u64(location + 0x30, file_object)
        returned = self.kernel.run(dispatch, [device, irp], PASSIVE, thread, stack_left=stack_left) & 0xFFFFFFFF
        if irp not in self.kernel.completed_irps:
            raise BugCheck(0xC4, f"dispatch returned 0x{returned:08X} without completing the IRP (and without STATUS_PENDING)")
        status = m.read_u32(irp + 0x30)
        if status != returned:
            raise BugCheck(0xC4, f"dispatch returned 0x{returned:08X} but completed the IRP with 0x{status:08X}")
        information = m.read_u64(irp + 0x38)
        if information > output_length:
            raise BugCheck(0xC4, f"IoStatus.Information {information} is more than the {output_length}-byte output buffer")
        output = m.read(buffer, information) if information else b""
        if buffer:
            m.unmap(buffer, pages)
        m.unmap(irp, irp_pages)
        return status, output

    def open(self, thread):
        file_object = self.machine.data(0xD8)
        status, _ = self.irp(IRP_MJ_CREATE, file_object, thread)
        if status != STATUS_SUCCESS:
            raise AssertionError(f"IRP_MJ_CREATE failed: 0x{status:08X}")
        return file_object

    def close(self, file_object, thread):
        self.irp(IRP_MJ_CLOSE, file_object, thread)

    def control(self, file_object, thread, request, input_hex="", output_length=0, stack_left=None):
        code = self.bridge.facts[request]
        return self.irp(IRP_MJ_DEVICE_CONTROL, file_object, thread, code, bytes.fromhex(input_hex), output_length, stack_left)

    def status(self, file_object, thread):
        status, output = self.control(file_object, thread, "status", output_length=self.bridge.facts["status_size"])
        if status != STATUS_SUCCESS:
            raise AssertionError(f"the status request failed: 0x{status:08X}")
        return self.bridge.ask(op="decode_status", reply=output.hex())

    def configure(self, file_object, thread, **config):
        request = self.bridge.ask(op="configure", **config)
        status, _ = self.control(file_object, thread, "configure", request["input"])
        return status

    def read(self, file_object, thread, size=None):
        status, output = self.control(file_object, thread, "read", output_length=size or 4 * self.bridge.facts["min_read_buffer"])
        if status != STATUS_SUCCESS:
            raise AssertionError(f"the read request failed: 0x{status:08X}")
        return self.bridge.ask(op="decode_read", reply=output.hex())

    def capture_now(self, file_object, thread, stack_left=None, tag=7):
        request = self.bridge.ask(op="capture_now", tag=tag)
        return self.control(file_object, thread, "capture_now", request["input"], self.bridge.facts["min_read_buffer"], stack_left)

    def capture_threads(self, file_object, thread, thread_ids, tag=1, timeout_ms=1000):
        """A capture-threads request: its status and each id's outcome."""
        request = self.bridge.ask(op="capture_threads", tag=tag, timeout_ms=timeout_ms, thread_ids=thread_ids)
        status, reply = self.control(file_object, thread, "capture_threads", request["input"], self.bridge.facts["capture_threads_reply_size"])
        if status != STATUS_SUCCESS:
            return status, None
        return status, self.bridge.ask(op="decode_capture_threads_reply", reply=reply.hex(), count=len(thread_ids))["outcomes"]

    # --- callbacks, as Windows fires them -------------------------------------

    def fire_process(self, thread, process, create=True):
        m = self.machine
        info = 0
        if create:
            info = m.data(0x48)
            m.write_u64(info, 0x48)
            m.write_u64(info + 0x10, thread.process.id)
        for routine in list(self.kernel.notify["process"]):
            self.kernel.run(routine, [process.object, process.id, info], PASSIVE, thread)

    def fire_thread(self, thread, target, create=True):
        for routine in list(self.kernel.notify["thread"]):
            self.kernel.run(routine, [target.process.id, target.id, 1 if create else 0], PASSIVE, thread)

    def fire_image(self, thread, name=r"\Windows\System32\ntdll.dll", base=0x7FFA_0000_0000, size=0x1F0000):
        m = self.machine
        info = m.data(0x28)
        m.write_u64(info + 0x08, base)
        m.write_u64(info + 0x18, size)
        for routine in list(self.kernel.notify["image"]):
            self.kernel.run(routine, [self.unicode(name), thread.process.id, info], PASSIVE, thread)

    def fire_registry(self, thread, notify_class=1, stack_left=None):
        statuses = []
        for callback in list(self.kernel.registry_callbacks.values()):
            statuses.append(self.kernel.run(callback["function"], [callback["context"], notify_class, self.machine.data(0x40)], PASSIVE, thread, stack_left=stack_left) & 0xFFFFFFFF)
        return statuses

    def fire_object(self, thread, target, irql=PASSIVE):
        """A handle to `target` (a Process or Thread) opened in `thread`:
        pre-operation then post-operation callbacks, at PASSIVE_LEVEL or
        APC_LEVEL as Windows calls them."""
        m = self.machine
        kind = "process" if isinstance(target, Process) else "thread"
        object_type = self.kernel.process_type if kind == "process" else self.kernel.thread_type
        results = []
        for registration in list(self.kernel.object_callbacks.values()):
            for entry in registration["entries"]:
                if entry["type"] != kind:
                    continue
                info = m.data(0x30)
                m.write_u32(info, 1)  # OB_OPERATION_HANDLE_CREATE
                m.write_u64(info + 0x08, target.object)
                m.write_u64(info + 0x10, object_type)
                m.write_u64(info + 0x20, m.data(0x20))
                if entry["pre"]:
                    results.append(self.kernel.run(entry["pre"], [registration["context"], info], irql, thread) & 0xFFFFFFFF)
                if entry["post"]:
                    self.kernel.run(entry["post"], [registration["context"], info], irql, thread)
        return results

    def fire_timer(self, interrupted_thread):
        """Every set timer's DPC at DISPATCH_LEVEL, on whatever thread the
        processor was running."""
        fired = 0
        for timer, entry in list(self.kernel.timers.items()):
            if entry["set"] and entry["dpc"]:
                routine, context = self.kernel.dpcs[entry["dpc"]]
                self.kernel.run(routine, [entry["dpc"], context, 0, 0], DISPATCH, interrupted_thread)
                fired += 1
        return fired
