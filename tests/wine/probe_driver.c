/*
 * kstack-probe.sys: a kernel driver that does nothing, for the Wine tests
 * only. Started in the same winedevice.exe host as kstack.sys, its load is
 * a real image load that Wine's loader reports to kstack's load-image
 * routine, so the test can see a module record the kernel (Wine) made,
 * not an injected one. It imports nothing; it is never packaged.
 */
#include <ddk/wdm.h>

static void NTAPI probe_unload(PDRIVER_OBJECT driver)
{
    (void)driver;
}

NTSTATUS NTAPI DriverEntry(PDRIVER_OBJECT driver, PUNICODE_STRING registry_path)
{
    (void)registry_path;
    driver->DriverUnload = probe_unload;
    return STATUS_SUCCESS;
}
