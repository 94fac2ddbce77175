/*
 * Declarations the real WDK has and mingw-w64 10's DDK headers lack.
 * Appended, through the generated km/ntstrsafe.h, to what bindgen reads when
 * wdk-sys generates its bindings on a Linux host. (wdk-sys defines the
 * POOL_FLAG_* values itself, so they are not repeated here.)
 */
#ifndef KSTACK_MINGW_COMPAT_H
#define KSTACK_MINGW_COMPAT_H

typedef ULONG64 POOL_FLAGS;

NTKERNELAPI PVOID NTAPI ExAllocatePool2(POOL_FLAGS Flags, SIZE_T NumberOfBytes, ULONG Tag);

#endif
