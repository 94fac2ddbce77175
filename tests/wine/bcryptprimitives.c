/*
 * bcryptprimitives.dll for Wine 8, which lacks it: Rust's standard library
 * (x86_64-pc-windows-gnu) imports ProcessPrng from it, so the kstack client
 * cannot start under Wine 8 without this. Windows has the real DLL; this one
 * is only ever placed beside kstack.exe in a Wine prefix by the test harness.
 * It forwards to advapi32's SystemFunction036 (RtlGenRandom).
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
