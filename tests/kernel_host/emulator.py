"""The machine: speakeasy maps kstack.sys; this binds its imports to the
modelled kernel and runs its code.

speakeasy (PyPI `speakeasy-emulator`, on unicorn) loads the PE image at a
kernel address, with its relocations applied, and gives the x64 CPU and its
memory. Everything kstack.sys asks of the kernel goes through its import
address table, and every slot of it is pointed here at a stub of our own: a
code hook on the stubs hands each call to the model (`ntoskrnl.py`), which
checks the call against the routine's contract and answers it. speakeasy's
own kernel routines are never called: their contracts are not the WDK's
(its `MmGetSystemRoutineAddress` finds every name, its `ZwOpenKey` fails on
a missing key by raising).

Three things the CPU does not do as Windows would are done here:
- IRQL: x64 keeps it in CR8, which unicorn does not model, so every
  `mov` to or from CR8 in the image (found by disassembling each function
  the image's .pdata lists) is hooked and done against the model's IRQL.
- Calls back into the driver from inside a kernel routine (the callout of
  `KeExpandKernelStackAndCalloutEx`): the stub switches the CPU to the
  callout on a stack of its own, and a return stub switches back.
- Exception dispatch: a routine that raises (an access violation in
  `RtlWalkFrameChain`) is dispatched as RtlDispatchException does it on
  x64: the caller's frame is looked up in .pdata, its language handler must
  be ntoskrnl's `__C_specific_handler`, and that handler's scope table is
  searched for the call site; a scope that handles it gets control at its
  landing point with the frame unwound. Only the immediate caller's frame
  is searched (kstack's one scope is there, which tests/tests/driver_image.rs
  pins); no handler there is a bug check, as it would be for kstack.
"""

import struct

import capstone
import pefile
import speakeasy
import unicorn.x86_const as registers
from unicorn import UC_HOOK_CODE, UC_HOOK_MEM_UNMAPPED, UcError
from unicorn.x86_const import (
    UC_X86_REG_R8,
    UC_X86_REG_R9,
    UC_X86_REG_RAX,
    UC_X86_REG_RCX,
    UC_X86_REG_RDX,
    UC_X86_REG_RIP,
    UC_X86_REG_RSP,
)

IMAGE_BASE = 0xFFFFF80012300000
STUB_BASE = 0xFFFFF80070000000
STUB_SIZE = 16
STUB_AREA = 0x10000
DATA_BASE = 0xFFFFF80071000000
DATA_AREA = 0x1000000
RETURN_SENTINEL = 0xFFFFF80072000000
KERNEL_STACK_SIZE = 0x6000
STACKS_BASE = 0xFFFFF80080000000
FRESH_BASE = 0xFFFFA00000000000
ARGUMENT_REGISTERS = (UC_X86_REG_RCX, UC_X86_REG_RDX, UC_X86_REG_R8, UC_X86_REG_R9)
UNW_FLAG_EHANDLER = 1
STATUS_ACCESS_VIOLATION = 0xC0000005
MM_USER_PROBE_ADDRESS = 0x7FFFFFFF0000
NULL_REGION_END = 0x10000
EXCEPTION_EXECUTE_HANDLER = 1


class BugCheck(Exception):
    """The machine stopped as Windows would, with a bug check."""

    def __init__(self, code, text):
        super().__init__(f"bug check 0x{code:X}: {text}")
        self.code = code


class Raise(Exception):
    """A routine raised an exception in its caller's thread."""

    def __init__(self, status):
        super().__init__(f"exception 0x{status:08X}")
        self.status = status


class Callout:
    """A routine's request to run driver code before it returns."""

    def __init__(self, target, args, stack, on_return):
        self.target = target
        self.args = args
        self.stack = stack
        self.on_return = on_return


def u64(data, offset=0):
    return struct.unpack_from("<Q", data, offset)[0]


class Machine:
    """kstack.sys loaded and runnable. `kernel` answers its imports."""

    def __init__(self, image_path):
        raw = open(image_path, "rb").read()
        pe = pefile.PE(data=raw)
        pe.relocate_image(IMAGE_BASE)
        pe.OPTIONAL_HEADER.ImageBase = IMAGE_BASE
        self.pe = pe
        self.speakeasy = speakeasy.Speakeasy()
        module = self.speakeasy.load_module(data=bytes(pe.write()))
        self.emu = self.speakeasy.emu
        self.uc = self.emu.emu_eng.emu
        self.base = module.base
        self.size = module.image_size
        self.entry = module.base + module.ep
        self.pristine = bytes(self.uc.mem_read(self.base, self.size))
        self.image_mapped = True
        self.null_region_freed = False
        self.imports = sorted(module.imports.items())
        self.uc.mem_map(STUB_BASE, STUB_AREA)
        self.uc.mem_write(STUB_BASE, b"\xcc" * STUB_AREA)
        self.uc.mem_map(DATA_BASE, DATA_AREA)
        self.data_next = DATA_BASE
        self.uc.mem_map(RETURN_SENTINEL, 0x1000)
        self.uc.mem_write(RETURN_SENTINEL, b"\xcc" * 0x1000)
        self.stubs = []
        self.kernel = None
        self.functions = self._functions()
        self.cr8_sites = self._cr8_sites()
        self.stacks_next = STACKS_BASE
        self.fresh_next = FRESH_BASE
        self.stack_stack = []
        self.pending_error = None
        self.uc.hook_add(UC_HOOK_CODE, self._on_stub, begin=STUB_BASE, end=STUB_BASE + STUB_AREA - 1)
        for address, (register, writes) in self.cr8_sites.items():
            self.uc.hook_add(UC_HOOK_CODE, self._on_cr8, begin=address, end=address)
        self.live_stacks = []
        self.fault_address = None
        self.uc.hook_add(UC_HOOK_MEM_UNMAPPED, self._on_unmapped)
        # When set: a function of a kernel call's return address that names
        # the path it is on; the stack kstack's frames hold at each call is
        # then kept per (stack, path) in `deepest`.
        self.measure_stack = None
        self.deepest = {}

    # --- the image -------------------------------------------------------

    def _functions(self):
        """(begin, end, unwind info) of every function .pdata lists."""
        directory = self.pe.OPTIONAL_HEADER.DATA_DIRECTORY[3]
        table = self.pristine[directory.VirtualAddress : directory.VirtualAddress + directory.Size]
        return [struct.unpack_from("<III", table, offset) for offset in range(0, len(table) - 11, 12)]

    def function_at(self, address):
        rva = address - self.base
        for begin, end, unwind in self.functions:
            if begin <= rva < end:
                return begin, end, unwind
        return None

    def _cr8_sites(self):
        """Every `mov reg, cr8` / `mov cr8, reg`: address -> (register, writes)."""
        disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        disassembler.detail = True
        sites = {}
        for begin, end, _ in self.functions:
            code = self.pristine[begin:end]
            for instruction in disassembler.disasm(code, self.base + begin):
                if instruction.mnemonic != "mov" or "cr8" not in instruction.op_str:
                    continue
                destination, source = (part.strip() for part in instruction.op_str.split(","))
                writes = destination == "cr8"
                register = source if writes else destination
                sites[instruction.address] = (register, writes, instruction.size)
        return {address: ((register, size), writes) for address, (register, writes, size) in sites.items()}

    def unload_image(self):
        """The image unmapped, as MmUnloadSystemImage leaves it: any later
        fetch or access in it faults."""
        self.uc.mem_unmap(self.base, self.size)
        self.image_mapped = False

    def free_the_null_region(self):
        """Windows never maps the first 64 KiB (the NULL page and the rest
        below MM_LOWEST_USER_ADDRESS), so a NULL pointer plus a small offset
        faults there; speakeasy maps some of it for its own bookkeeping,
        which every Machine's loading writes to (its driver list is shared
        between instances): so this runs at the first load, once every
        Machine exists."""
        if self.null_region_freed:
            return
        for begin, end, _ in list(self.uc.mem_regions()):
            if begin < NULL_REGION_END:
                self.uc.mem_unmap(begin, min(end + 1, NULL_REGION_END) - begin)
        self.null_region_freed = True

    def reload(self):
        """A fresh copy of the image, as a new load maps it, with every
        import bound to the model."""
        self.free_the_null_region()
        if not self.image_mapped:
            self.uc.mem_map(self.base, self.size)
            self.image_mapped = True
        self.uc.mem_write(self.base, self.pristine)
        self.stubs = []
        for slot, (dll, name) in self.imports:
            self.uc.mem_write(slot, struct.pack("<Q", self.bind(dll, name)))

    def bind(self, dll, name):
        """The address the image gets for `dll!name`: a stub for a routine,
        the model's variable for data."""
        variable = self.kernel.data_export(name)
        if variable is not None:
            return variable
        address = STUB_BASE + STUB_SIZE * len(self.stubs)
        self.stubs.append(name)
        return address

    def stub_for(self, name):
        """A stub for a routine the driver finds at run time."""
        if name in self.stubs:
            return STUB_BASE + STUB_SIZE * self.stubs.index(name)
        return self.bind("ntoskrnl", name)

    def data(self, size, align=16):
        """Kernel-owned memory for the model's own objects (never freed)."""
        address = (self.data_next + align - 1) & ~(align - 1)
        self.data_next = address + size
        assert self.data_next <= DATA_BASE + DATA_AREA, "the model's data area is full"
        self.uc.mem_write(address, b"\0" * size)
        return address

    # --- memory ----------------------------------------------------------

    def read(self, address, size):
        return bytes(self.uc.mem_read(address, size))

    def write(self, address, data):
        self.uc.mem_write(address, bytes(data))

    def read_u64(self, address):
        return u64(self.read(address, 8))

    def write_u64(self, address, value):
        self.write(address, struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))

    def read_u32(self, address):
        return struct.unpack("<I", self.read(address, 4))[0]

    def write_u32(self, address, value):
        self.write(address, struct.pack("<I", value & 0xFFFFFFFF))

    def read_unicode_string(self, address):
        length, _maximum = struct.unpack("<HH", self.read(address, 4))
        buffer = self.read_u64(address + 8)
        return self.read(buffer, length).decode("utf-16-le")

    def map_fresh(self, size):
        """Maps `size` bytes (page-rounded) at an address never used before,
        with an unmapped gap after: pool blocks and I/O buffers, whose
        unmapping on free makes any later use fault."""
        pages = (max(size, 1) + 0xFFF) & ~0xFFF
        address = self.fresh_next
        self.fresh_next += pages + 0x10000
        self.uc.mem_map(address, pages)
        return address, pages

    def unmap(self, address, size):
        self.uc.mem_unmap(address, size)

    def new_stack(self, size=KERNEL_STACK_SIZE):
        """A kernel stack: (low, high), with unmapped guard pages around."""
        low = self.stacks_next + 0x1000
        self.uc.mem_map(low, size)
        self.stacks_next = low + size + 0x10000
        return low, low + size

    def free_stack(self, stack):
        low, high = stack
        self.uc.mem_unmap(low, high - low)

    # --- running driver code ----------------------------------------------

    def call(self, target, args, stack, stack_left=None):
        """Runs the driver's `target(*args)` on `stack` (low, high) to its
        return, and gives RAX. `stack_left` starts it that far above the
        stack's low end (what a deep caller left), else at the top."""
        low, high = stack
        top = low + stack_left if stack_left is not None else high
        rsp = (top - 0x40) & ~0xF
        frame = rsp - 8 - 0x20 - 8 * max(0, len(args) - 4)
        rsp = frame - (frame % 16) - 8
        for index, value in enumerate(args):
            if index < 4:
                self.uc.reg_write(ARGUMENT_REGISTERS[index], value)
            else:
                self.write_u64(rsp + 8 + 0x20 + 8 * (index - 4), value)
        self.write_u64(rsp, RETURN_SENTINEL)
        self.uc.reg_write(UC_X86_REG_RSP, rsp)
        self.entry_rsps = [rsp]
        self.deepest = {}
        self.live_stacks = [stack]
        self.stack_stack = []
        self.pending_error = None
        self.fault_address = None
        start = target
        while True:
            try:
                self.uc.emu_start(start, RETURN_SENTINEL)
                break
            except UcError as error:
                if self.pending_error is not None or self.fault_address is None or self.fault_address >= MM_USER_PROBE_ADDRESS:
                    raise self._fault(error) from None
                self._user_access_violation()
                self.fault_address = None
                start = self.uc.reg_read(UC_X86_REG_RIP)
        if self.pending_error is not None:
            raise self.pending_error
        return self.uc.reg_read(UC_X86_REG_RAX)

    def _stop(self, error):
        self.pending_error = error
        self.uc.emu_stop()

    def _on_unmapped(self, uc, access, address, size, value, user_data):
        self.fault_address = address
        return False

    def _user_access_violation(self):
        """A read or write of an unmapped user address from kernel code:
        below DISPATCH_LEVEL Windows raises STATUS_ACCESS_VIOLATION in the
        thread (MmAccessFault), dispatched like a raised exception; at
        DISPATCH_LEVEL or above no fault may be taken, a bug check. The
        faulting frame: a leaf without unwind information is its caller's
        (the return address on top of the stack), as RtlDispatchException
        takes it; otherwise its own."""
        pc = self.uc.reg_read(UC_X86_REG_RIP)
        rsp = self.uc.reg_read(UC_X86_REG_RSP)
        if self.kernel.irql >= 2:
            raise BugCheck(0xA, f"IRQL_NOT_LESS_OR_EQUAL: user address 0x{self.fault_address:X} touched at IRQL {self.kernel.irql} at {self.kernel.name_site(pc)}")
        try:
            if self.function_at(pc) is None:
                self._dispatch_exception(STATUS_ACCESS_VIOLATION, self.read_u64(rsp), rsp + 8)
            else:
                self._dispatch_exception(STATUS_ACCESS_VIOLATION, pc, rsp)
        except BugCheck as error:
            null = ", a NULL pointer plus an offset" if self.fault_address < NULL_REGION_END else ""
            raise BugCheck(error.code, f"{error.args[0].split(': ', 1)[1]} (the access was to 0x{self.fault_address:X}{null})") from None

    def _fault(self, error):
        """The bug check for an access to memory that is not there: a
        kernel stack overflow when it is just below the stack in use
        (its guard page), else PAGE_FAULT_IN_NONPAGED_AREA."""
        where = self.kernel.name_site(self.uc.reg_read(UC_X86_REG_RIP))
        address = self.fault_address
        if address is not None and not self.image_mapped and self.base <= address < self.base + self.size:
            return BugCheck(
                0xCE,
                f"DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS: kstack.sys code ran after its image was unmapped "
                f"({self.kernel.image_unloaded} deletion of its last object), at {self.kernel.name_site(address)}",
            )
        if address is not None:
            low, _ = self.live_stacks[-1]
            if low - 0x10000 <= address < low:
                return BugCheck(0x7F, f"kernel stack overflow: an access {low - address} bytes below the stack's limit at {where}")
            return BugCheck(0x50, f"access to unmapped 0x{address:X} at {where} ({error})")
        return BugCheck(0x50, f"{error} at {where}")

    def _on_cr8(self, uc, address, size, user_data):
        (register, length), writes = self.cr8_sites[address]
        register_id = getattr(registers, "UC_X86_REG_" + register.upper())
        try:
            if writes:
                self.kernel.set_irql(uc.reg_read(register_id) & 0xF, address)
            else:
                uc.reg_write(register_id, self.kernel.irql)
        except Exception as error:
            self._stop(error)
            return
        uc.reg_write(UC_X86_REG_RIP, address + length)

    def args(self, count):
        rsp = self.uc.reg_read(UC_X86_REG_RSP)
        values = [self.uc.reg_read(register) for register in ARGUMENT_REGISTERS[:count]]
        for index in range(4, count):
            values.append(self.read_u64(rsp + 8 + 0x20 + 8 * (index - 4)))
        return values

    def _return(self, value):
        rsp = self.uc.reg_read(UC_X86_REG_RSP)
        self.uc.reg_write(UC_X86_REG_RIP, self.read_u64(rsp))
        self.uc.reg_write(UC_X86_REG_RSP, rsp + 8)
        if value is not None:
            self.uc.reg_write(UC_X86_REG_RAX, value & 0xFFFFFFFFFFFFFFFF)

    def _on_stub(self, uc, address, size, user_data):
        if self.pending_error is not None:
            return
        index = (address - STUB_BASE) // STUB_SIZE
        rsp = uc.reg_read(UC_X86_REG_RSP)
        caller = self.read_u64(rsp)
        # kstack's own frames at this kernel call: from the entry's return
        # address slot down to this call's (on a callout's stack, from the
        # callout's entry).
        if self.measure_stack:
            which = ("caller" if len(self.entry_rsps) == 1 else "callout", self.measure_stack(caller))
            self.deepest[which] = max(self.deepest.get(which, 0), self.entry_rsps[-1] - rsp)
        try:
            if index == len(self.stubs):
                raise AssertionError("no routine at this stub")
            name = self.stubs[index]
            if name == "__callout_return__":
                self._callout_returned()
                return
            result = self.kernel.dispatch(name, caller)
            if isinstance(result, Callout):
                self._start_callout(result)
            else:
                self._return(result)
        except Raise as exception:
            try:
                rsp = uc.reg_read(UC_X86_REG_RSP)
                self._dispatch_exception(exception.status, caller, rsp + 8)
            except BugCheck as error:
                self._stop(error)
        except Exception as error:  # a BugCheck, or the harness's own failure: stop the CPU
            self._stop(error)

    def _start_callout(self, callout):
        rsp = self.uc.reg_read(UC_X86_REG_RSP)
        self.stack_stack.append((rsp, callout))
        low, high = callout.stack
        self.live_stacks.append(callout.stack)
        new = ((high - 0x80) & ~0xF) - 8
        self.write_u64(new, self.stub_for("__callout_return__"))
        for index, value in enumerate(callout.args):
            if index < 4:
                self.uc.reg_write(ARGUMENT_REGISTERS[index], value)
            else:
                self.write_u64(new + 8 + 0x20 + 8 * (index - 4), value)
        self.uc.reg_write(UC_X86_REG_RSP, new)
        self.uc.reg_write(UC_X86_REG_RIP, callout.target)
        self.entry_rsps.append(new)

    def _callout_returned(self):
        rsp, callout = self.stack_stack.pop()
        self.live_stacks.pop()
        self.entry_rsps.pop()
        self.uc.reg_write(UC_X86_REG_RSP, rsp)
        self._return(callout.on_return())

    def language_handler(self, function):
        """A function's exception handler and the address of its handler
        data (for __C_specific_handler, the scope table), or None."""
        _, _, unwind = function
        header = self.read(self.base + unwind, 4)
        if not (header[0] >> 3) & UNW_FLAG_EHANDLER:
            return None
        handler_at = self.base + unwind + 4 + 2 * ((header[2] + 1) & ~1)
        return self.base + self.read_u32(handler_at), handler_at + 4

    def _dispatch_exception(self, status, control_pc, frame_rsp):
        """RtlDispatchException for one frame (see the module docs): the
        frame of `control_pc`, whose body's RSP is `frame_rsp`. A scope of
        its __C_specific_handler over `control_pc` gets control at its
        landing point, on that frame, with the status in RAX."""
        function = self.function_at(control_pc)
        where = self.kernel.name_site(control_pc)
        if function is None:
            raise BugCheck(0x1E, f"exception 0x{status:08X} at {where}, which has no unwind information: not handled")
        handler = self.language_handler(function)
        if handler is None:
            raise BugCheck(0x1E, f"exception 0x{status:08X} at {where}, whose frame has no exception handler: not handled")
        routine, scopes = handler
        if self.kernel.resolve_thunk(routine) != "__C_specific_handler":
            raise BugCheck(0x1E, f"exception 0x{status:08X} at {where}, whose handler is not ntoskrnl's __C_specific_handler")
        self.kernel.dispatch_handler("__C_specific_handler", control_pc)
        rva = control_pc - self.base
        for index in range(self.read_u32(scopes)):
            begin, end, filter_rva, landing = struct.unpack("<IIII", self.read(scopes + 4 + 16 * index, 16))
            if not begin <= rva < end:
                continue
            if filter_rva != EXCEPTION_EXECUTE_HANDLER:
                raise BugCheck(0x1E, f"the scope over {where} has a filter function, which this model does not run")
            self.uc.reg_write(UC_X86_REG_RSP, frame_rsp)
            self.uc.reg_write(UC_X86_REG_RIP, self.base + landing)
            self.uc.reg_write(UC_X86_REG_RAX, status)
            self.kernel.exceptions_handled += 1
            return
        raise BugCheck(0x1E, f"exception 0x{status:08X} at {where}, outside every scope of its handler: not handled")

    def unwind(self, return_address):
        """The return addresses of the stack a routine was called on, from
        `return_address` (its caller's) outwards, by the image's unwind
        information, up to the first frame outside the image."""
        frames = [return_address]
        rsp = self.uc.reg_read(UC_X86_REG_RSP) + 8
        pc = return_address
        while len(frames) < 64:
            function = self.function_at(pc)
            if function is None:
                break
            rsp = self._entry_rsp(function, rsp)
            if rsp is None:
                break
            pc = self.read_u64(rsp)
            rsp += 8
            if not self.base <= pc < self.base + self.size:
                break
            frames.append(pc)
        return frames

    def _entry_rsp(self, function, rsp):
        """RSP at the function's entry (pointing at its return address),
        from RSP in its body: its prolog's unwind codes undone."""
        _, _, unwind = function
        while True:
            header = self.read(self.base + unwind, 4)
            flags, codes = header[0] >> 3, header[2]
            slots = struct.unpack(f"<{codes}H", self.read(self.base + unwind + 4, 2 * codes)) if codes else ()
            index = 0
            while index < codes:
                operation, info = slots[index] >> 8 & 0xF, slots[index] >> 12
                if operation == 0:
                    rsp += 8
                    index += 1
                elif operation == 1:
                    if info == 0:
                        rsp += 8 * slots[index + 1]
                        index += 2
                    else:
                        rsp += slots[index + 1] | slots[index + 2] << 16
                        index += 3
                elif operation == 2:
                    rsp += 8 * info + 8
                    index += 1
                elif operation in (4, 8):
                    index += 2
                elif operation in (5, 9):
                    index += 3
                else:
                    return None
            if not flags & 4:
                return rsp
            chained = self.base + unwind + 4 + 2 * ((codes + 1) & ~1)
            unwind = self.read_u32(chained + 8)

    def thunk_target(self, address):
        """The IAT slot a `jmp [rip+disp32]` thunk at `address` jumps through."""
        code = self.read(address, 6)
        if code[:2] != b"\xff\x25":
            return None
        return address + 6 + struct.unpack("<i", code[2:6])[0]

    def import_at_slot(self, slot):
        for address, (_dll, name) in self.imports:
            if address == slot:
                return name
        return None

    def patch_slot(self, name, address):
        """Points the image's import of `name` elsewhere (deliberate defects)."""
        for slot, (_dll, imported) in self.imports:
            if imported == name:
                self.write_u64(slot, address)
                return
        raise KeyError(name)
