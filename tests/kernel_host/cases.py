"""The cases: each loads kstack.sys on a fresh modelled machine, does what
Windows would do, checks what the driver did against the ABI docs, and
unloads it (Verifier's unload checks: nothing left behind).

A case returns its evidence (one line) or raises: an AssertionError for a
wrong result, a BugCheck for what would stop a Windows machine.
"""

from host import SERVICE_KEY, STATUS_IMAGE_ALREADY_LOADED
from ntoskrnl import APC, DISPATCH, NON_PAGED_POOL_NX, PASSIVE, STATUS_SUCCESS, THREAD_RUNNING

CASES = []


def case(function):
    CASES.append(function)
    return function


def test_build_case(function):
    """A case that needs the test-injection build of kstack.sys."""
    function.test_build = True
    return case(function)


def status_code(w, name):
    return w.bridge.facts["statuses"][name]


def check(condition, text):
    if not condition:
        raise AssertionError(text)


def started(w, configure=None, before_load=None):
    """Loaded, a client handle open, and the configuration applied."""
    if before_load:
        before_load(w)
    status = w.load()
    check(status == STATUS_SUCCESS, f"DriverEntry returned 0x{status:08X}")
    client = w.user_thread()
    handle = w.open(client)
    if configure is not None:
        result = w.configure(handle, client, **configure)
        check(result == STATUS_SUCCESS, f"configure {configure} returned 0x{result:08X}")
    return handle, client


def finished(w, handle, client):
    w.close(handle, client)
    w.unload()


def traces(w, handle, client):
    """The trace records of one read, each with its frames: a record whose
    stack this reader already received names it by id
    (`RecordFlags::STACK_BY_ID`) and gets the frames received with it, as a
    client resolves them."""
    known = w.received_stacks.setdefault(handle, {})
    records = []
    for entry in w.read(handle, client)["entries"]:
        if entry["kind"] != "trace":
            continue
        if entry["frames"]:
            known[entry["stack_id"]] = (entry["frames"], entry["kernel_frames"])
        elif "stack_by_id" in entry["flags"]:
            check(entry["stack_id"] in known, f"record {entry['sequence']} names stack {entry['stack_id']:X}, which this reader never received")
            entry["frames"], entry["kernel_frames"] = known[entry["stack_id"]]
        records.append(entry)
    return records


def only_trace(w, handle, client, source):
    records = traces(w, handle, client)
    check(len(records) == 1, f"{len(records)} records read, expected one {source} record")
    record = records[0]
    check(record["source"] == source, f"the record's source is {record['source']}, not {source}")
    return record


def registry_record(w, thread, **fire):
    """A registry operation in `thread` with only the registry source on:
    the open handle, its client, and the one record it made."""
    handle, client = started(w, {"sources": ["registry"]})
    w.fire_registry(thread, **fire)
    return handle, client, only_trace(w, handle, client, "registry")


def kernel_names(w, record):
    return [w.kernel.name_site(frame) for frame in record["frames"][: record["kernel_frames"]]]


def frame_zero_is_the_capture_call(w, record, callback):
    names = kernel_names(w, record)
    check(names and names[0].startswith("kstack::kernel::impl$2::walk_stack+"), f"frame 0 is {names[:1]}, not the RtlCaptureStackBackTrace call in walk_stack")
    check(any(callback in name for name in names), f"no frame in {callback}: {names}")
    return names


@case
def load_and_unload(w):
    status = w.load()
    check(status == STATUS_SUCCESS, f"DriverEntry returned 0x{status:08X}")
    ledger = w.kernel.ledger
    kinds = sorted(entry["kind"] for entry in ledger.registrations)
    expected = sorted(["registry callback", "object callbacks", "process notify", "thread notify", "image notify", "device", "symbolic link", "handle"])
    check(kinds == expected, f"registrations {kinds}, expected {expected}")
    check(all(block["type"] == "POOL_FLAG_NON_PAGED" for block in ledger.pool.values()), "pool not non-paged")
    check(w.kernel.links == {r"\DosDevices\kstack": r"\Device\kstack"} or len(w.kernel.links) == 1, f"links {w.kernel.links}")
    pool = sum(block["size"] for block in ledger.pool.values())
    w.unload()
    return f"DriverEntry 0x0 at PASSIVE_LEVEL; {len(kinds)} registrations; {ledger.allocations} allocations ({pool} bytes, non-paged); unload undid and freed all"


@case
def status_reports_the_load(w):
    handle, client = started(w)
    status = w.status(handle, client)
    check(status["paging_executive"]["in_effect"] == "not_configured", f"paging executive {status['paging_executive']}")
    check(status["process_key"] == "available", f"process key {status['process_key']}")
    check(all(source["registration"] == 0 and source["available"] for source in status["sources"].values()), "a source reports a failed registration")
    check(status["driver_image"]["base"] == w.machine.base, "driver_image.base is not where the image was loaded")
    check(status["outstanding_allocations"] == len(w.kernel.ledger.pool), f"outstanding_allocations {status['outstanding_allocations']}, the kernel has {len(w.kernel.ledger.pool)} blocks")
    finished(w, handle, client)
    return f"every source registered; paging executive not configured; driver_image.base = the load address; outstanding_allocations {status['outstanding_allocations']} = live pool blocks"


@case
def process_notify(w):
    handle, client = started(w, {"sources": ["process"]})
    creator = w.user_thread()
    child = w.process()
    w.fire_process(creator, child)
    record = only_trace(w, handle, client, "process")
    check(record["facts"] == {"event": "create", "parent_process_id": creator.process.id, "process_id": child.id}, f"facts {record['facts']}")
    check(record["process_id"] == creator.process.id and record["thread_id"] == creator.id, "the record is not the creating thread's")
    check(record["user_part"] == "off", f"user part {record['user_part']} (process notify walks no user frames by default)")
    names = frame_zero_is_the_capture_call(w, record, "process::on_process")
    finished(w, handle, client)
    return f"create of {child.id} in the creating thread at PASSIVE_LEVEL: one record, user part off, kernel frames {names[0]} .. {names[3]}"


@case
def thread_notify(w):
    handle, client = started(w, {"sources": ["thread"]})
    creator = w.user_thread()
    target = w.user_thread(creator.process)
    w.fire_thread(creator, target)
    w.fire_thread(target, target, create=False)
    records = traces(w, handle, client)
    check([record["facts"]["event"] for record in records] == ["create", "exit"], f"events {[record['facts'] for record in records]}")
    check(records[1]["thread_id"] == target.id, "the exit record is not the exiting thread's")
    finished(w, handle, client)
    return "create (in the creator) and exit (in the exiting thread) at PASSIVE_LEVEL: two records in order"


@case
def image_load_with_user_frames(w):
    handle, client = started(w, {"sources": ["image_load"], "user_frames": {"image_load": 5}})
    loader = w.user_thread()
    w.fire_image(loader, base=0x7FFA_0000_0000, size=0x1F0000)
    record = only_trace(w, handle, client, "image_load")
    check(record["facts"]["image_base"] == 0x7FFA_0000_0000 and record["facts"]["image_size"] == 0x1F0000, f"facts {record['facts']}")
    check(record["user_part"] in ("captured", "truncated") and record["user_frame_count"] == 5, f"user part {record['user_part']} with {record['user_frame_count']} frames, expected 5")
    check(record["frames"][record["kernel_frames"] :] == loader.user_frames[:5], "the user frames are not the thread's")
    finished(w, handle, client)
    return f"opt-in user_frames image_load=5: 5 user frames walked on their own stack ({record['user_part']})"


@case
def registry_pre_and_post_with_the_user_stack(w):
    handle, client = started(w, {"sources": ["registry"]})
    caller = w.user_thread()
    # RegNtPreSetValueKey (1), then RegNtPostSetValueKey (16), in the
    # thread that set the value, at PASSIVE_LEVEL.
    statuses = w.fire_registry(caller, notify_class=1) + w.fire_registry(caller, notify_class=16)
    check(statuses == [STATUS_SUCCESS, STATUS_SUCCESS], f"the callback returned {statuses}: it must let the operation go on")
    records = traces(w, handle, client)
    check([record["facts"] for record in records] == [{"notify_class": 1}, {"notify_class": 16}], f"facts {[record['facts'] for record in records]}")
    for record in records:
        check(record["user_part"] == "captured", f"user part {record['user_part']}")
        check(record["frames"][record["kernel_frames"] :] == caller.user_frames, "the user frames are not the thread's")
    names = frame_zero_is_the_capture_call(w, records[0], "registry_operations::on_registry")
    finished(w, handle, client)
    return f"pre and post set-value: {records[0]['user_frame_count']} user frames each through KeExpandKernelStackAndCalloutEx and the exception scope; both returned STATUS_SUCCESS; kernel frames from {names[0]}"


@case
def module_records_carry_the_process_key(w):
    handle, client = started(w)
    process = w.process()
    loader = w.user_thread(process)
    w.fire_image(loader, name=r"\Device\HarddiskVolume3\Windows\System32\kernel32.dll", base=0x7FFB_1000_0000, size=0xC0000)
    w.fire_process(loader, process, create=False)
    entries = [entry for entry in w.read(handle, client)["entries"] if entry["kind"] == "module"]
    check([entry["event"] for entry in entries] == ["image_load", "process_exit"], f"module records {[entry['event'] for entry in entries]}")
    load, exit_ = entries
    check(load["path"].endswith("kernel32.dll") and load["image_base"] == 0x7FFB_1000_0000 and load["image_size"] == 0xC0000, f"load {load}")
    check(load["process_key"] == exit_["process_key"] == process.create_time, f"process keys {load['process_key']}, {exit_['process_key']}, not the creation time {process.create_time}")
    check(not any(w.kernel.ledger.references.values()), "a process reference is still held")
    finished(w, handle, client)
    return "with every source off: an image load and a process exit as module records, keyed by the process's creation time (PsLookupProcessByProcessId, dereferenced again)"


@case
def older_windows_without_the_looked_up_routines(w):
    """Windows before 2004 (no ExAllocatePool2, no precise time) with no
    RtlWalkFrameChain or PsGetProcessCreateTimeQuadPart: the driver loads,
    allocates through ExAllocatePoolWithTag, and says what it lacks."""
    absent = {"ExAllocatePool2", "KeQuerySystemTimePrecise", "RtlWalkFrameChain", "PsGetProcessCreateTimeQuadPart"}
    w.kernel.absent_routines = absent
    handle, client = started(w, {"sources": ["registry"]})
    check(w.kernel.ledger.pool and all(block["type"] == NON_PAGED_POOL_NX for block in w.kernel.ledger.pool.values()), "the pool is not NonPagedPoolNx from ExAllocatePoolWithTag")
    status = w.status(handle, client)
    check(status["user_walk"] == "not_exported" and status["process_key"] == "not_exported", f"user_walk {status['user_walk']}, process_key {status['process_key']}")
    w.fire_registry(w.user_thread())
    record = only_trace(w, handle, client, "registry")
    check(record["user_part"] == "unavailable", f"user part {record['user_part']}")
    finished(w, handle, client)
    return "without ExAllocatePool2, KeQuerySystemTimePrecise, RtlWalkFrameChain, PsGetProcessCreateTimeQuadPart: pool from ExAllocatePoolWithTag (NonPagedPoolNx), status says not_exported, the record's user part unavailable"


@case
def registry_deep_user_stack(w):
    caller = w.user_thread(user_frames=[0x7FF7_0000_0000 + 0x20 * n for n in range(200)])
    handle, client, record = registry_record(w, caller)
    limit = w.bridge.facts["default_user_frames"]["registry"]
    check(record["user_frame_count"] <= limit, f"{record['user_frame_count']} user frames, above user_frames {limit}")
    check(record["frames"][record["kernel_frames"] :] == caller.user_frames[: record["user_frame_count"]], "the user frames are not the innermost of the thread's")
    finished(w, handle, client)
    return f"a 200-frame user stack: {record['user_frame_count']} innermost frames kept ({record['user_part']})"


@case
def registry_unmapped_user_stack(w):
    handle, client, record = registry_record(w, w.user_thread(user_fault=True))
    check(record["user_part"] == "faulted", f"user part {record['user_part']}, expected faulted")
    check(w.kernel.exceptions_handled == 1, f"{w.kernel.exceptions_handled} exceptions handled")
    status = w.status(handle, client)
    check(status["sources"]["registry"]["user_parts"]["faulted"] == 1, "the fault is not counted")
    finished(w, handle, client)
    return "STATUS_ACCESS_VIOLATION raised in RtlWalkFrameChain, dispatched to kstack_guarded_walk's __C_specific_handler scope; record kept, user part faulted, counted"


@case
def registry_system_thread(w):
    handle, client, record = registry_record(w, w.system_thread())
    check(record["user_part"] == "system_thread", f"user part {record['user_part']}")
    finished(w, handle, client)
    return "a registry operation in a system thread: no user walk, user part system_thread"


@case
def registry_attached_thread(w):
    handle, client, record = registry_record(w, w.user_thread(attached=True))
    check(record["user_part"] == "attached", f"user part {record['user_part']}")
    finished(w, handle, client)
    return "a thread attached to another process: no user walk, user part attached"


@case
def registry_32_bit_process(w):
    handle, client, record = registry_record(w, w.user_thread(w.process(wow64=True)))
    check("wow64" in record["flags"], f"flags {record['flags']}, no wow64")
    finished(w, handle, client)
    return f"a WoW64 process: flags {record['flags']}, user part {record['user_part']}"


@case
def registry_no_stack_for_the_walk(w):
    handle, client = started(w, {"sources": ["registry"]})
    w.kernel.expansion_fails = True
    w.fire_registry(w.user_thread())
    w.kernel.expansion_fails = False
    record = only_trace(w, handle, client, "registry")
    check(record["user_part"] == "no_stack", f"user part {record['user_part']}")
    check("wow64" not in record["flags"], "a 64-bit thread's record says wow64")
    status = w.status(handle, client)
    check(status["sources"]["registry"]["user_parts"]["no_stack"] == 1, "no_stack not counted")
    finished(w, handle, client)
    return "KeExpandKernelStackAndCalloutEx without a stack: the callout never ran, record kept with user part no_stack, counted"


@case
def registry_little_kernel_stack_left(w):
    handle, client = started(w, {"sources": ["registry"]})
    left = w.bridge.facts["min_remaining_stack"] - 0x400
    w.fire_registry(w.user_thread(), stack_left=left)
    records = traces(w, handle, client)
    status = w.status(handle, client)
    check(not records, f"{len(records)} records from a callback with {left} bytes of stack left")
    check(status["sources"]["registry"]["skipped_stack"] == 1, f"skipped_stack {status['sources']['registry']['skipped_stack']}")
    finished(w, handle, client)
    return f"{left} bytes of kernel stack left: no walk, no write below the stack's limit, counted as skipped_stack"


@case
def object_callbacks_at_passive_and_apc(w):
    handle, client = started(w, {"sources": ["object_handle"]})
    opener = w.user_thread()
    target = w.process()
    results = w.fire_object(opener, target, PASSIVE) + w.fire_object(opener, target, APC)
    check(results and all(result == 0 for result in results), f"pre-operation returned {results}, not OB_PREOP_SUCCESS")
    records = traces(w, handle, client)
    check(len(records) == 2 and all(record["source"] == "object_handle" for record in records), f"{[record['source'] for record in records]}")
    check(records[1]["irql"] == APC, f"the APC_LEVEL record says IRQL {records[1]['irql']}")
    finished(w, handle, client)
    return f"process-handle opens at PASSIVE_LEVEL and APC_LEVEL: pre returned OB_PREOP_SUCCESS, {len(records)} records, IRQL recorded"


@case
def timer_refused_without_paging_executive(w):
    handle, client = started(w)
    result = w.configure(handle, client, sources=["timer"])
    check(result == status_code(w, "KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED"), f"configure returned 0x{result:08X}")
    check(not any(timer["set"] for timer in w.kernel.timers.values()), "the timer was set anyway")
    finished(w, handle, client)
    return "DisablePagingExecutive not set: the timer source refused with KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED, no timer set"


@case
def timer_dpc_at_dispatch(w):
    handle, client = started(w, {"sources": ["timer"], "timer_period_ms": 5}, before_load=lambda w: w.set_paging_executive(1))
    status = w.status(handle, client)
    check(status["paging_executive"]["allows_elevated_walks"], f"paging executive {status['paging_executive']}")
    check(any(timer["set"] and timer["period"] == 5 for timer in w.kernel.timers.values()), "no 5 ms periodic timer set")
    fired = w.fire_timer(w.user_thread()) + w.fire_timer(w.system_thread())
    records = traces(w, handle, client)
    check(len(records) == fired == 2, f"{fired} DPCs fired, {len(records)} records")
    check(all(record["irql"] == DISPATCH and record["user_part"] == "off" for record in records), "a timer record is not at DISPATCH_LEVEL or walked user frames")
    finished(w, handle, client)
    return "DisablePagingExecutive=1 since boot: 5 ms timer set; its DPC at DISPATCH_LEVEL sampled 2 stacks; unload cancelled the timer and flushed DPCs"


@case
def paging_key_written_after_boot(w):
    handle, client = started(w, before_load=lambda w: w.set_paging_executive(1, written_after_boot=True))
    status = w.status(handle, client)
    check(status["paging_executive"]["in_effect"] != "in_effect" and not status["paging_executive"]["allows_elevated_walks"], f"{status['paging_executive']}")
    result = w.configure(handle, client, sources=["timer"])
    check(result == status_code(w, "KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED"), f"configure returned 0x{result:08X}")
    finished(w, handle, client)
    return f"DisablePagingExecutive=1 written after boot: {status['paging_executive']['in_effect']}, timer refused"


@case
def paging_override(w):
    def before(w):
        w.set_paging_executive(1, written_after_boot=True)
        w.set_parameter("AssumePagingExecutiveInEffect", 1)

    handle, client = started(w, {"sources": ["timer"]}, before_load=before)
    status = w.status(handle, client)
    check(status["paging_executive"]["override_set"] and status["paging_executive"]["allows_elevated_walks"], f"{status['paging_executive']}")
    finished(w, handle, client)
    return f"DisablePagingExecutive=1 written after boot, with the service's override: {status['paging_executive']['in_effect']}, timer accepted"


@case
def capture_now(w):
    handle, client = started(w, {"sources": ["on_demand"]})
    status, reply = w.capture_now(handle, client, tag=77)
    check(status == STATUS_SUCCESS, f"capture-now returned 0x{status:08X}")
    record = w.bridge.ask(op="decode_record", reply=reply.hex())
    check(record["source"] == "on_demand" and record["facts"] == {"tag": 77}, f"{record['source']} {record['facts']}")
    check(record["frames"][record["kernel_frames"] :] == client.user_frames[: record["user_frame_count"]] and record["user_frame_count"] > 0, "the caller's user frames are missing")
    names = kernel_names(w, record)
    check(any("dispatch" in name for name in names), f"no dispatch frame in {names}")
    kept = only_trace(w, handle, client, "on_demand")
    check(kept["facts"] == {"tag": 77}, "the ring's copy differs")
    finished(w, handle, client)
    return f"IRP at PASSIVE_LEVEL in the caller's thread: reply of {len(reply)} bytes, {record['kernel_frames']} kernel + {record['user_frame_count']} user frames, kept in the ring"


@case
def capture_now_with_little_stack(w):
    handle, client = started(w, {"sources": ["on_demand"]})
    left = w.bridge.facts["min_remaining_stack"] - 0x400
    status, reply = w.capture_now(handle, client, stack_left=left)
    check(status == status_code(w, "KSTACK_STATUS_STACK_TOO_LOW"), f"capture-now returned 0x{status:08X}")
    check(not reply, "a reply came with the failure")
    counters = w.status(handle, client)["sources"]["on_demand"]
    check(counters["skipped_stack"] == 1, f"skipped_stack {counters['skipped_stack']}")
    finished(w, handle, client)
    return f"{left} bytes of stack left: KSTACK_STATUS_STACK_TOO_LOW, counted as skipped_stack"


@case
def kstack_own_stack_use_within_its_bounds(w):
    """What kstack's frames hold at their deepest kernel call, measured on
    the emulated stack, against the bounds docs/kernel-stack.md gives and
    tests/tests/driver_image.rs checks from the image's unwind codes: a
    capture (walk and publish) from each callback and from capture-now, and
    the user walk's own stack. A module record (no walk, no guard) is
    measured apart."""
    handle, client = started(
        w,
        {"sources": ["process", "thread", "image_load", "registry", "object_handle", "on_demand", "timer", "thread_stack"], "user_frames": {"process": 5, "thread": 5, "image_load": 5, "object_handle": 5}},
        before_load=lambda w: w.set_paging_executive(1),
    )

    def path(return_address):
        names = [w.kernel.name_site(frame) for frame in w.machine.unwind(return_address)]
        return "module record" if any("record_module" in name for name in names) else "capture"

    actor = w.user_thread()
    target = w.user_thread()
    w.capture_threads(handle, client, [target.id])
    w.machine.measure_stack = path
    w.kernel.stack_use.clear()
    w.fire_process(actor, w.process())
    w.fire_thread(actor, actor)
    w.fire_image(actor)
    w.fire_registry(actor)
    w.fire_object(actor, w.process())
    w.fire_timer(actor)
    w.kernel.deliver_apcs(target)
    callbacks = dict(w.kernel.stack_use)
    w.kernel.stack_use.clear()
    status, _ = w.capture_now(handle, client)
    capture_now = dict(w.kernel.stack_use)
    w.machine.measure_stack = None
    check(status == STATUS_SUCCESS, f"capture-now returned 0x{status:08X}")
    finished(w, handle, client)
    bounds = w.bridge.facts["stack_bounds"]

    def deepest(measured, stack, kind):
        found = [(depth, entry) for (entry, which, path), depth in measured.items() if which == stack and path == kind]
        check(found, f"nothing measured on the {stack} stack for {kind}")
        return max(found)

    captured = sorted(entry.rsplit("::", 1)[-1] for entry, which, kind in callbacks if which == "caller" and kind == "capture")
    check(captured == ["kstack_apc_kernel_routine", "on_handle", "on_image", "on_process", "on_registry", "on_thread", "on_tick"], f"callbacks measured: {captured}")
    callback, callback_entry = deepest(callbacks, "caller", "capture")
    request, _ = deepest(capture_now, "caller", "capture")
    callout = max(deepest(callbacks, "callout", "capture")[0], deepest(capture_now, "callout", "capture")[0])
    module, module_entry = deepest(callbacks, "caller", "module record")
    check(callback <= bounds["callback_path"], f"a capture from a callback held {callback} bytes of kstack frames ({callback_entry}), above {bounds['callback_path']}")
    check(request <= bounds["capture_now_path"], f"capture-now held {request} bytes, above {bounds['capture_now_path']}")
    check(callout <= bounds["user_walk_own"], f"the user walk's own frames held {callout} bytes of its stack, bound {bounds['user_walk_own']}")
    return (
        f"deepest kernel call of a capture: {callback} bytes of kstack frames from a callback ({callback_entry.rsplit('::', 1)[-1]}; bound {bounds['callback_path']}), "
        f"{request} from capture-now (bound {bounds['capture_now_path']}), {callout} on the user walk's own stack (bound {bounds['user_walk_own']}); "
        f"a module record, unguarded: {module} ({module_entry.rsplit('::', 1)[-1]})"
    )


@case
def read_is_in_time_order_and_clear_empties(w):
    handle, client = started(w, {"sources": ["process", "thread", "registry"]})
    actor = w.user_thread()
    w.fire_process(actor, w.process())
    w.fire_thread(actor, actor)
    w.fire_registry(actor)
    records = traces(w, handle, client)
    stamps = [record["timestamp"] for record in records]
    check([record["source"] for record in records] == ["process", "thread", "registry"], f"sources {[record['source'] for record in records]}")
    check(stamps == sorted(stamps), f"timestamps out of order {stamps}")
    check(not traces(w, handle, client), "a second read returned records again")
    w.fire_registry(actor)
    status, _ = w.control(handle, client, "clear")
    check(status == STATUS_SUCCESS, f"clear returned 0x{status:08X}")
    check(not traces(w, handle, client), "records remain after clear")
    counters = w.status(handle, client)
    check(counters["cleared"] == 1, f"cleared {counters['cleared']}")
    finished(w, handle, client)
    return "three sources read oldest first; a second read empty; clear discarded one record, counted"


@case
def registry_altitude_taken(w):
    taken = {}

    def before(w):
        taken["altitude"] = w.kernel.take_registry_altitude("385290")

    handle, client = started(w, before_load=before)
    status = w.status(handle, client)
    altitude = status["registry_altitude"]
    check(altitude != {"whole": 385290, "fraction": 0}, f"registered at the taken altitude {altitude}")
    check(status["sources"]["registry"]["registration"] == 0, "the registry source did not register")
    finished(w, handle, client)
    return f"altitude 385290 held by another driver: registered at {altitude['whole']}.{altitude['fraction']}"


def thread_stacks(w, before_load=None):
    """Loaded with the thread-stack source on."""
    return started(w, {"sources": ["thread_stack"]}, before_load=before_load)


def thread_captures(w, handle, client):
    return w.status(handle, client)["thread_captures"]


@case
def thread_stack_in_the_thread_at_apc_level(w):
    handle, client = thread_stacks(w)
    target = w.user_thread()
    status, outcomes = w.capture_threads(handle, client, [target.id], tag=41)
    check(status == STATUS_SUCCESS and outcomes == ["queued"], f"0x{status:08X} {outcomes}")
    counted = thread_captures(w, handle, client)
    check((counted["queued"], counted["in_flight"]) == (1, 1), f"{counted}")
    check(w.kernel.ledger.references.get(target.object) == 1, "the queued APC holds no reference on its thread")
    w.kernel.deliver_apcs(target)
    record = only_trace(w, handle, client, "thread_stack")
    facts = record["facts"]
    check((facts["target_process_id"], facts["target_thread_id"], facts["tag"], facts["late"]) == (target.process.id, target.id, 41, False), f"facts {facts}")
    check((record["process_id"], record["thread_id"], record["irql"]) == (target.process.id, target.id, APC), "the record is not the target thread's at APC_LEVEL")
    kernel = record["frames"][: record["kernel_frames"]]
    check(kernel == target.kernel_frames, f"kernel frames {[w.kernel.name_site(frame) for frame in kernel]}, not the thread's own {[hex(frame) for frame in target.kernel_frames]}")
    check(record["frames"][record["kernel_frames"] :] == target.user_frames, "the user frames are not the thread's")
    counted = thread_captures(w, handle, client)
    check((counted["delivered"], counted["in_flight"], counted["late"]) == (1, 0, 0), f"{counted}")
    check(not any(w.kernel.ledger.references.values()), "a reference is still held after the APC ran")
    finished(w, handle, client)
    return (
        f"a special kernel APC ran in thread {target.id} at APC_LEVEL: its {len(kernel)} kernel frames without kstack's and KiDeliverApc, "
        f"its {record['user_frame_count']} user frames; thread and device references dropped"
    )


@case
def thread_stack_in_a_critical_region_walks_no_user_frames(w):
    """A special kernel APC is delivered inside a critical region, where the
    thread may hold a lock a page-in of its user stack needs: the record
    keeps its kernel frames and says critical_region, counted; the same
    thread outside one is walked."""
    handle, client = thread_stacks(w)
    target = w.user_thread()
    target.critical_region = True
    w.capture_threads(handle, client, [target.id])
    w.kernel.deliver_apcs(target)
    inside = only_trace(w, handle, client, "thread_stack")
    target.critical_region = False
    w.capture_threads(handle, client, [target.id])
    w.kernel.deliver_apcs(target)
    outside = only_trace(w, handle, client, "thread_stack")
    check((inside["user_part"], inside["user_frame_count"]) == ("critical_region", 0), f"inside: {inside['user_part']}, {inside['user_frame_count']} user frames")
    check(inside["kernel_frames"] == len(target.kernel_frames), f"inside: {inside['kernel_frames']} kernel frames")
    check(outside["user_part"] == "captured" and outside["user_frame_count"] == len(target.user_frames), f"outside: {outside['user_part']}")
    parts = w.status(handle, client)["sources"]["thread_stack"]["user_parts"]
    check((parts["critical_region"], parts["captured"]) == (1, 1), f"user parts counted {parts}")
    finished(w, handle, client)
    return "delivered inside a critical region: kernel frames only, user part critical_region, counted; outside one the user stack walked"


@case
def thread_stack_delivered_in_the_exit_path(w):
    """A thread that exits with the APC queued takes it in its exit path
    (PspExitThread delivers pending kernel APCs; rundown routines are for
    the user-mode queue): a capture in the exiting thread, not a rundown."""
    handle, client = thread_stacks(w)
    target = w.user_thread()
    w.capture_threads(handle, client, [target.id])
    w.kernel.thread_exit(target)
    record = only_trace(w, handle, client, "thread_stack")
    check((record["thread_id"], record["irql"]) == (target.id, APC), f"the exit path's record is thread {record['thread_id']} at IRQL {record['irql']}")
    counted = thread_captures(w, handle, client)
    check((counted["queued"], counted["run_down"], counted["delivered"], counted["in_flight"]) == (1, 0, 1, 0), f"{counted}")
    check(not any(w.kernel.ledger.references.values()), "a reference is still held after the exit path's delivery")
    finished(w, handle, client)
    return "the thread exited with the APC queued: its kernel routine ran in the exit path at APC_LEVEL (delivered, not run down), references dropped, slot free"


@case
def thread_stack_outcomes_of_each_id(w):
    handle, client = thread_stacks(w)
    exiting = w.user_thread()
    exiting.exiting = True
    ids = [w.user_thread().id, 999_999, w.system_thread().id, client.id, exiting.id]
    status, outcomes = w.capture_threads(handle, client, ids)
    expected = ["queued", "no_such_thread", "system_thread", "own", "not_queued"]
    check(status == STATUS_SUCCESS and outcomes == expected, f"0x{status:08X} {outcomes}")
    counted = thread_captures(w, handle, client)
    parts = ("queued", "no_such_thread", "no_slot", "not_queued", "refused_system_thread", "own")
    check(counted["requested"] == len(ids) == sum(counted[part] for part in parts), f"{counted}")
    check(counted["in_flight"] == 1, f"in flight {counted['in_flight']}")
    finished_with_apcs_delivered(w, handle, client)
    return f"one request, five ids: {', '.join(outcomes)}; requested = the sum of the outcomes; refused ids hold no slot or reference"


def finished_with_apcs_delivered(w, handle, client):
    """Every thread takes its queued APCs, then the usual end."""
    for thread in list(w.kernel.apc_threads()):
        w.kernel.deliver_apcs(thread)
    finished(w, handle, client)


@case
def thread_stack_late_and_no_slot(w):
    handle, client = thread_stacks(w)
    slots = thread_captures(w, handle, client)["slots"]
    threads = [w.user_thread(w.process()) for _ in range(slots)]
    for start in range(0, slots, 64):
        status, outcomes = w.capture_threads(handle, client, [thread.id for thread in threads[start : start + 64]], timeout_ms=1)
        check(status == STATUS_SUCCESS and set(outcomes) == {"queued"}, f"0x{status:08X} {set(outcomes)}")
    extra = w.user_thread()
    status, outcomes = w.capture_threads(handle, client, [extra.id])
    check(outcomes == ["no_slot"], f"{outcomes} with every slot in use")
    w.kernel.advance(20)
    w.kernel.deliver_apcs(threads[0])
    record = only_trace(w, handle, client, "thread_stack")
    check(record["facts"]["late"] and record["facts"]["delay"] >= 20 * 10_000, f"facts {record['facts']}")
    counted = thread_captures(w, handle, client)
    check((counted["late"], counted["no_slot"], counted["in_flight"]) == (1, 1, slots - 1), f"{counted}")
    finished_with_apcs_delivered(w, handle, client)
    return f"{slots} APCs in flight fill every slot: the next id is no_slot; one delivered 20 ms after a 1 ms timeout is recorded late and counted"


class Sampling:
    """`kstack sample`'s sampler (the client's own, in the bridge) driving the
    real driver: each tick lists `threads`, sends the tick's requests and
    takes the replies; `read` drains the ring through the sampler."""

    def __init__(self, w, handle, client, **settings):
        self.w, self.handle, self.client = w, handle, client
        w.bridge.ask(op="sample_start", **settings)
        self.asked = []
        self.trace_bytes = 0

    def tick(self, now_ms, threads, facts=False):
        """One tick over `threads`, listed as Toolhelp does (ids only) or,
        with `facts`, as SystemProcessInformation does (state, wait reason,
        switches, CPU time); returns the ids whose sample was repeated."""
        w = self.w
        if facts:
            listing = [[thread.process.id, thread.id, thread.state, thread.wait_reason, thread.context_switches, thread.cpu_100ns] for thread in threads]
        else:
            listing = [[thread.process.id, thread.id] for thread in threads]
        plan = w.bridge.ask(op="sample_tick", now_ms=now_ms, threads=listing)
        replies = []
        for request in plan["inputs"]:
            status, reply = w.control(self.handle, self.client, "capture_threads", request, w.bridge.facts["capture_threads_reply_size"])
            check(status == STATUS_SUCCESS, f"a tick's request returned 0x{status:08X}")
            replies.append(reply.hex())
        w.bridge.ask(op="sample_answered", now_ms=now_ms, replies=replies)
        self.asked.append(plan["thread_ids"])
        return plan["repeated"]

    def read(self):
        w = self.w
        while True:
            status, output = w.control(self.handle, self.client, "read", output_length=4 * w.bridge.facts["min_read_buffer"])
            check(status == STATUS_SUCCESS, f"a read returned 0x{status:08X}")
            read = w.bridge.ask(op="sample_read", reply=output.hex())
            self.trace_bytes += read["trace_bytes"]
            if not read["more_pending"]:
                return

    def counts(self):
        return self.w.bridge.ask(op="sample_counts")


@case
def sampling_follows_threads_within_its_bounds(w):
    """Thirty ticks at 100 Hz of one process's threads, at most four a tick,
    with a thread whose APC never runs, one that starts and one that exits:
    the sampler's counts agree with the driver's, request by request."""
    handle, client = thread_stacks(w)
    process = w.process()
    threads = [w.user_thread(process) for _ in range(8)]
    stranger = w.user_thread()
    stuck, leaving = threads[0], threads[3]
    sampling = Sampling(w, handle, client, hz=100, threads_per_tick=4, timeout_ms=30, pids=[process.id])
    newcomer = None
    for tick in range(30):
        if tick == 10:
            newcomer = w.user_thread(process)
            threads.append(newcomer)
        if tick == 15:
            w.kernel.thread_exit(leaving)
            threads.remove(leaving)
        sampling.tick(10 * tick, threads + [stranger])
        # The leaving thread stops running three ticks before it exits: an
        # APC queued then is delivered in its exit path.
        for thread in threads:
            if thread is not stuck and not (thread is leaving and tick >= 12):
                w.kernel.deliver_apcs(thread)
        w.kernel.advance(10)
        sampling.read()
    counts = sampling.counts()
    driver = thread_captures(w, handle, client)
    asked = sampling.asked
    check(all(len(ids) <= 4 for ids in asked), f"a tick asked for more than 4: {asked}")
    check(not any(stranger.id in ids for ids in asked), "a thread of another process was asked for")
    check(not any(leaving.id in ids for ids in asked[15:]), "the exited thread was asked for after it left")
    check(any(newcomer.id in ids for ids in asked[10:]), "the new thread was never asked for")
    stuck_ticks = [tick for tick, ids in enumerate(asked) if stuck.id in ids]
    check(len(stuck_ticks) >= 2 and all(b - a >= 3 for a, b in zip(stuck_ticks, stuck_ticks[1:])), f"the stuck thread was asked for at ticks {stuck_ticks} (30 ms hold)")
    pairs = [("requested", "requested"), ("queued", "queued"), ("no_such_thread", "no_such_thread"), ("not_queued", "not_queued"), ("no_slot", "no_slot"), ("captured", "delivered")]
    for ours, theirs in pairs:
        check(counts[ours] == driver[theirs], f"the sampler's {ours} {counts[ours]} against the driver's {theirs} {driver[theirs]}")
    check(counts["awaited"] == driver["in_flight"] + driver["run_down"], f"awaited {counts['awaited']}, driver {driver}")
    check(driver["run_down"] == 0 and counts["awaited"] == len(stuck_ticks), f"awaited: the stuck thread's {len(stuck_ticks)} requests only (the leaving thread's APC is delivered in its exit path): {counts}, {driver}")
    check((counts["threads_seen"], counts["threads_gone"], counts["ticks"], counts["missed_ticks"]) == (9, 1, 30, 0), f"{counts}")
    check(counts["skipped_pending"] > 0 and counts["skipped_over_bound"] > 0, f"{counts}")
    check(counts["other_records"] == 0, f"{counts}")
    finished_with_apcs_delivered(w, handle, client)
    return (
        f"30 ticks: {counts['requested']} requests (at most 4 a tick), {counts['captured']} captured, {counts['awaited']} awaited "
        f"(the stuck thread's, asked for again only after the 30 ms hold; the leaving thread's last APC delivered in its exit path), "
        f"{counts['skipped_pending']} skipped while pending, {counts['skipped_over_bound']} left by the bound; the driver's counters agree"
    )


@case
def sampling_leaves_threads_that_did_not_run_alone(w):
    """Twenty ticks over six threads listed with their states: four wait
    throughout, two run (switched to and charged CPU time every tick). Each
    waiting thread takes two APCs, at ticks 0 and 1 (the model counts the
    switch-in for each, as KiSwapContextResume does): the same stack twice,
    each taken in its wait; after that its samples repeat that stack and no
    APC wakes it. One of them is woken before tick 10's listing and asked
    for again at ticks 10 and 11, then left alone once more."""
    handle, client = thread_stacks(w)
    process = w.process()
    threads = [w.user_thread(process) for _ in range(6)]
    waiting, running = threads[:4], threads[4:]
    for thread in running:
        thread.state = THREAD_RUNNING
    sampling = Sampling(w, handle, client, hz=100, threads_per_tick=8, timeout_ms=30, pids=[process.id])
    woken = waiting[0]
    for tick in range(20):
        for thread in running:
            thread.context_switches += 1
            thread.cpu_100ns += 100_000
        if tick == 10:
            woken.context_switches += 1
        repeated = sampling.tick(10 * tick, threads, facts=True)
        for thread in threads:
            w.kernel.deliver_apcs(thread)
        w.kernel.advance(10)
        sampling.read()
        if tick == 0:
            check(repeated == [], f"tick 0 repeated {repeated}: nothing was captured yet")
    asked = sampling.asked
    for thread in waiting:
        ticks = [tick for tick, ids in enumerate(asked) if thread.id in ids]
        expected = [0, 1, 10, 11] if thread is woken else [0, 1]
        check(ticks == expected, f"waiting thread {thread.id} asked for at ticks {ticks}, not {expected}")
    for thread in running:
        check(all(thread.id in ids for ids in asked), f"running thread {thread.id} not asked for at every tick")
    counts = sampling.counts()
    driver = thread_captures(w, handle, client)
    check(counts["queued"] == driver["queued"] == 4 * 2 + 2 + 2 * 20, f"{counts}, driver {driver}")
    check(counts["repeated"] == 20 * 6 - counts["requested"] and counts["without_state"] == 0, f"{counts}")
    finished_with_apcs_delivered(w, handle, client)
    return (
        f"{counts['queued']} APCs over 20 ticks of 6 threads: the 2 running ones every tick, each waiting one twice "
        f"(the woken one twice more); {counts['repeated']} samples repeated a stack without an APC; the driver's counters agree"
    )


@case
def unload_waits_for_apcs_in_flight(w):
    """The target runs on another processor, where KiDeliverApc has already
    taken the APC off its queue when unload starts: KeRemoveQueueApc cannot
    take it back, so unload waits until its routine has run."""
    handle, client = thread_stacks(w)
    target = w.user_thread()
    w.capture_threads(handle, client, [target.id])
    w.close(handle, client)
    w.kernel.start_running(target)
    w.unload()
    check(not target.apcs and not target.delivering, "the APC was neither delivered nor taken back by unload")
    return "unload with an APC being delivered (off its queue, so not taken back): it waited until the APC's kernel routine ran (no capture past the closed gate), then freed everything"


@case
def unload_takes_back_queued_apcs(w):
    """A thread that does not run keeps its APC queued: unload takes it back
    (KeRemoveQueueApc), so no routine of kstack's runs after unload, frees
    everything, and the image goes at once."""
    handle, client = thread_stacks(w)
    target = w.user_thread()
    w.capture_threads(handle, client, [target.id])
    w.close(handle, client)
    w.unload()
    check(not target.apcs, "the APC is still queued after unload")
    check(w.kernel.image_unloaded == "inline", f"the image was not unmapped when DriverUnload returned ({w.kernel.image_unloaded})")
    w.kernel.thread_exit(target)
    return "unload took back the APC queued to a thread that does not run: pool freed, thread and device references dropped, the image unmapped as DriverUnload returned"


def apc_left_queued_by_unload(w):
    """A kernel without KeRemoveQueueApc: unload cannot take the APC back,
    gives up after its bound and leaves the APCs' block, saying so in
    LastUnloadPoolAllocations; the APC's device reference keeps the image
    mapped. Returns the target thread."""
    w.kernel.absent_routines = {"KeRemoveQueueApc"}
    handle, client = thread_stacks(w)
    take_back = w.status(handle, client)["apc_take_back"]
    check(take_back == "not_exported", f"status apc_take_back {take_back} without KeRemoveQueueApc")
    target = w.user_thread()
    w.capture_threads(handle, client, [target.id])
    w.close(handle, client)
    w.unload(leaves={"KsAp"})
    parameters = w.kernel.registry.get((SERVICE_KEY + r"\Parameters").lower(), {})
    written = parameters.get("lastunloadpoolallocations")
    check(written is not None and int.from_bytes(written[1], "little") == 1, f"LastUnloadPoolAllocations {written}")
    check(w.machine.image_mapped, "the image was unmapped while an APC still referenced the device")
    return target


@case
def apc_delivered_after_unload_returns_to_the_kernel(w):
    """The APC left queued by unload is delivered in its thread's exit path:
    its routine (no capture: the gate is closed) frees the abandoned block,
    then drops the device's last reference by a tail jump, at APC_LEVEL: the
    deletion (a worker's, which may run at once) unmaps the image, and
    ObfDereferenceObject returns into KiDeliverApc, not into kstack."""
    target = apc_left_queued_by_unload(w)
    refused = w.load()
    check(refused == STATUS_IMAGE_ALREADY_LOADED, f"a new load while the image is still mapped returned 0x{refused:08X}")
    w.kernel.thread_exit(target)
    check(w.kernel.image_unloaded == "deferred", f"the image was not unmapped by the APC's last reference ({w.kernel.image_unloaded})")
    check(not w.kernel.ledger.pool, "the abandoned block is still allocated after its last APC ran")
    check(not any(w.kernel.ledger.references.values()), "the APC left a reference")
    return (
        "unload without KeRemoveQueueApc left the APC queued and its block (a new load meanwhile: STATUS_IMAGE_ALREADY_LOADED); the exit path delivered it: "
        "block freed, thread dereferenced, the device's last reference dropped by a tail jump (image unmapped by the deferred deletion, nothing of kstack ran after)"
    )


@case
def apc_run_down_after_unload_returns_to_the_kernel(w):
    """kstack's rundown routine, a defence no known kernel needs (rundown
    routines are the user-mode queue's at thread exit), run as that exit
    path would run it: at PASSIVE_LEVEL, where the last device reference
    deletes inline, unmapping the image before ObfDereferenceObject
    returns; the tail jump returns it to the kernel."""
    target = apc_left_queued_by_unload(w)
    w.kernel.run_down_apcs(target)
    check(w.kernel.image_unloaded == "inline", f"the image was not unmapped by the rundown's last reference ({w.kernel.image_unloaded})")
    check(not w.kernel.ledger.pool, "the abandoned block is still allocated after its rundown")
    check(not any(w.kernel.ledger.references.values()), "the rundown left a reference")
    return "the APC left queued by unload run down at PASSIVE_LEVEL: block freed, the device's last reference dropped by a tail jump (inline deletion unmapped the image first; nothing of kstack ran after)"


@case
def thread_stacks_refused_without_apcs_or_with_the_source_off(w):
    """Source off: SOURCE_DISABLED. A kernel without KeInitializeApc: the
    threadstack source is unavailable (registered as NO_APC), enabling it is
    refused, and every request gets NO_APC first."""
    handle, client = started(w)
    status = w.status(handle, client)
    check((status["apc"], status["apc_take_back"]) == ("available", "available"), f"apc {status['apc']}, take back {status['apc_take_back']}")
    result, _ = w.capture_threads(handle, client, [w.user_thread().id])
    check(result == status_code(w, "KSTACK_STATUS_SOURCE_DISABLED"), f"0x{result:08X} with the source off")
    finished(w, handle, client)
    w.kernel.absent_routines = {"KeInitializeApc"}
    handle, client = started(w)
    status = w.status(handle, client)
    source = status["sources"]["thread_stack"]
    no_apc = status_code(w, "KSTACK_STATUS_NO_APC")
    check((status["apc"], status["apc_take_back"]) == ("not_exported", "not_exported"), f"apc {status['apc']}, take back {status['apc_take_back']}")
    check(not source["available"] and source["registration"] & 0xFFFFFFFF == no_apc, f"threadstack available {source['available']}, registration 0x{source['registration'] & 0xFFFFFFFF:08X}")
    enabling = w.configure(handle, client, sources=["thread_stack"])
    check(enabling == status_code(w, "STATUS_NOT_SUPPORTED"), f"enabling threadstack returned 0x{enabling:08X}")
    result, _ = w.capture_threads(handle, client, [w.user_thread().id])
    check(result == no_apc, f"0x{result:08X} without KeInitializeApc")
    check(w.status(handle, client)["thread_captures"]["requested"] == 0, "a refused request was counted")
    finished(w, handle, client)
    return (
        "source off: KSTACK_STATUS_SOURCE_DISABLED; a kernel without KeInitializeApc: apc and apc_take_back not_exported, "
        "threadstack unavailable (registration KSTACK_STATUS_NO_APC), enabling it STATUS_NOT_SUPPORTED, requests KSTACK_STATUS_NO_APC; nothing queued or counted"
    )


@test_build_case
def fault_probe_in_the_test_build(w):
    """The test build's probe reads through a pointer inside the same
    exception scope, on the same own stack, as the user walk: a real CPU
    access to unmapped user address 8, not a raise by a modelled routine."""
    handle, client = started(w)
    replies = {}
    for target in ("mapped", "unmapped"):
        request = w.bridge.ask(op="fault_probe", target=target)
        status, reply = w.control(handle, client, "fault_probe", request["input"], w.bridge.facts["fault_probe_reply_size"])
        check(status == STATUS_SUCCESS, f"the {target} probe returned 0x{status:08X}")
        replies[target] = int.from_bytes(reply, "little")
    check(replies["mapped"] == w.bridge.facts["fault_probe_mapped_value"], f"the mapped read gave 0x{replies['mapped']:X}")
    check(replies["unmapped"] == 0xFFFFFFFFFFFFFFFF, f"the unmapped read gave 0x{replies['unmapped']:X}, not FAULTED")
    check(w.kernel.exceptions_handled == 1, f"{w.kernel.exceptions_handled} exceptions handled")
    finished(w, handle, client)
    return "the CPU's access violation at user address 8 in kstack_fault_probe (a leaf) dispatched to kstack_guarded_walk's scope: FAULTED; the mapped word read back"
