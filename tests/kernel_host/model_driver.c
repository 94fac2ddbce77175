/*
 * model-driver.sys: a small test driver, not kstack, that the second kernel
 * host runs to pin its modelled kernel to the reference kernel's behaviour
 * (ReactOS ntoskrnl/ke/apc.c, ntoskrnl/ob/obref.c, ntoskrnl/io/iomgr/;
 * tests/kernel_host/README.md lists what each case pins and where it is
 * written). The host calls its exported probes directly and reads what they
 * saw from `ModelSeen`. Built with mingw-w64 by `cargo xtask kernel-host`;
 * never packaged, never loaded on Windows.
 */
#include <ddk/wdm.h>

/* ntddk.h's and ntifs.h's, which need more of the DDK than wdm.h. */
NTKERNELAPI HANDLE NTAPI PsGetCurrentThreadId(VOID);
NTKERNELAPI NTSTATUS NTAPI PsLookupThreadByThreadId(HANDLE, PETHREAD *);

/* Not in the DDK headers (undocumented, exported by every x64 ntoskrnl):
 * prototypes as ReactOS declares them. */
typedef VOID(NTAPI *KERNEL_ROUTINE)(PKAPC, PVOID *, PVOID *, PVOID *, PVOID *);
typedef VOID(NTAPI *RUNDOWN_ROUTINE)(PKAPC);
typedef VOID(NTAPI *INITIALIZE_APC)(PKAPC, PKTHREAD, ULONG, KERNEL_ROUTINE, RUNDOWN_ROUTINE, PVOID, KPROCESSOR_MODE, PVOID);
typedef BOOLEAN(NTAPI *INSERT_QUEUE_APC)(PKAPC, PVOID, PVOID, KPRIORITY);
typedef BOOLEAN(NTAPI *REMOVE_QUEUE_APC)(PKAPC);
typedef BOOLEAN(NTAPI *ARE_APCS_DISABLED)(VOID);

/* What the probes saw, read by the host at this export. */
struct model_seen {
    ULONG64 delivered;
    ULONG64 run_down;
    ULONG64 apc;
    ULONG64 normal_context;
    ULONG64 argument1;
    ULONG64 argument2;
    ULONG64 context_cell;
    ULONG64 argument1_cell;
    ULONG64 irql;
    ULONG64 apcs_disabled;
    ULONG64 thread_id;
    ULONG64 mode;
    ULONG64 inserted;
};
__declspec(dllexport) volatile struct model_seen ModelSeen;
__declspec(dllexport) KAPC ModelApc;

static INITIALIZE_APC initialize_apc;
static INSERT_QUEUE_APC insert_queue_apc;
static REMOVE_QUEUE_APC remove_queue_apc;
static ARE_APCS_DISABLED are_apcs_disabled;
static PDEVICE_OBJECT device;

static PVOID look_up(PCWSTR name)
{
    UNICODE_STRING text;
    USHORT length = 0;
    while (name[length])
        length++;
    text.Length = length * sizeof(WCHAR);
    text.MaximumLength = text.Length + sizeof(WCHAR);
    text.Buffer = (PWSTR)name;
    return MmGetSystemRoutineAddress(&text);
}

static ULONG64 current_irql(void)
{
    ULONG64 irql;
    __asm__ volatile("mov %%cr8, %0" : "=r"(irql));
    return irql;
}

static VOID NTAPI kernel_routine(PKAPC apc, PVOID *normal_routine, PVOID *normal_context, PVOID *argument1, PVOID *argument2)
{
    (void)normal_routine;
    ModelSeen.delivered += 1;
    ModelSeen.apc = (ULONG64)apc;
    ModelSeen.normal_context = (ULONG64)*normal_context;
    ModelSeen.argument1 = (ULONG64)*argument1;
    ModelSeen.argument2 = (ULONG64)*argument2;
    ModelSeen.context_cell = (ULONG64)normal_context;
    ModelSeen.argument1_cell = (ULONG64)argument1;
    ModelSeen.irql = current_irql();
    ModelSeen.apcs_disabled = are_apcs_disabled();
    ModelSeen.thread_id = (ULONG64)PsGetCurrentThreadId();
    ModelSeen.mode = (ULONG64)apc->ApcMode;
    ModelSeen.inserted = (ULONG64)apc->Inserted;
}

static VOID NTAPI rundown_routine(PKAPC apc)
{
    (void)apc;
    ModelSeen.run_down += 1;
}

/* Initializes ModelApc as a special kernel APC (no normal routine) to
 * `thread`, asking for user mode and passing `context` (which the kernel
 * drops), then queues it with the two system arguments: KeInsertQueueApc's
 * result. */
__declspec(dllexport) ULONG64 ProbeQueueSpecialApc(PKTHREAD thread, PVOID context, PVOID argument1, PVOID argument2)
{
    initialize_apc(&ModelApc, thread, 0, kernel_routine, rundown_routine, NULL, UserMode, context);
    ModelSeen.mode = ModelApc.ApcMode;
    ModelSeen.normal_context = (ULONG64)ModelApc.NormalContext;
    return insert_queue_apc(&ModelApc, argument1, argument2, 0);
}

/* Queues ModelApc again, as it is: KeInsertQueueApc's result. */
__declspec(dllexport) ULONG64 ProbeQueueAgain(void)
{
    return insert_queue_apc(&ModelApc, NULL, NULL, 0);
}

/* Takes ModelApc off its queue: KeRemoveQueueApc's result. */
__declspec(dllexport) ULONG64 ProbeRemove(void)
{
    return remove_queue_apc(&ModelApc);
}

/* Looks `id` up and drops the reference again: the status. */
__declspec(dllexport) ULONG64 ProbeLookUpThread(ULONG64 id)
{
    PETHREAD thread;
    NTSTATUS status = PsLookupThreadByThreadId((HANDLE)id, &thread);
    if (NT_SUCCESS(status))
        ObfDereferenceObject(thread);
    return (ULONG64)(ULONG)status;
}

/* The driver's own device, referenced once more (the reference an APC
 * would hold): its address. */
__declspec(dllexport) ULONG64 ProbeReferenceDevice(void)
{
    ObfReferenceObject(device);
    return (ULONG64)device;
}

/* Drops `object`'s reference with a call, then runs on in this driver. */
__declspec(dllexport) ULONG64 ProbeDropAndReturn(PVOID object)
{
    ObfDereferenceObject(object);
    return 1;
}

/* Drops `object`'s reference by a tail jump: ObfDereferenceObject returns
 * to this probe's caller. */
__asm__(".text\n"
        ".globl ProbeDropByTailJump\n"
        "ProbeDropByTailJump:\n"
        "    jmp *__imp_ObfDereferenceObject(%rip)\n"
        ".section .drectve\n"
        ".ascii \" -export:ProbeDropByTailJump\"\n"
        ".text\n");

static VOID NTAPI model_unload(PDRIVER_OBJECT driver)
{
    (void)driver;
    IoDeleteDevice(device);
}

NTSTATUS NTAPI DriverEntry(PDRIVER_OBJECT driver, PUNICODE_STRING registry_path)
{
    (void)registry_path;
    initialize_apc = (INITIALIZE_APC)look_up(L"KeInitializeApc");
    insert_queue_apc = (INSERT_QUEUE_APC)look_up(L"KeInsertQueueApc");
    remove_queue_apc = (REMOVE_QUEUE_APC)look_up(L"KeRemoveQueueApc");
    are_apcs_disabled = (ARE_APCS_DISABLED)look_up(L"KeAreApcsDisabled");
    if (!initialize_apc || !insert_queue_apc || !remove_queue_apc || !are_apcs_disabled)
        return STATUS_PROCEDURE_NOT_FOUND;
    NTSTATUS status = IoCreateDevice(driver, 0, NULL, FILE_DEVICE_UNKNOWN, 0, FALSE, &device);
    if (!NT_SUCCESS(status))
        return status;
    driver->DriverUnload = model_unload;
    return STATUS_SUCCESS;
}
