/*
 * Declarations the real WDK has and mingw-w64 10's DDK headers lack.
 * Appended, through the generated km/ntstrsafe.h, to what bindgen reads when
 * wdk-sys generates its bindings on a Linux host. Values are the WDK's (wdm.h).
 */
#ifndef KSTACK_MINGW_COMPAT_H
#define KSTACK_MINGW_COMPAT_H

typedef ULONG64 POOL_FLAGS;

#define POOL_FLAG_USE_QUOTA 0x0000000000000001ULL
#define POOL_FLAG_UNINITIALIZED 0x0000000000000002ULL
#define POOL_FLAG_CACHE_ALIGNED 0x0000000000000008ULL
#define POOL_FLAG_RAISE_ON_FAILURE 0x0000000000000020ULL
#define POOL_FLAG_NON_PAGED 0x0000000000000040ULL
#define POOL_FLAG_NON_PAGED_EXECUTE 0x0000000000000080ULL
#define POOL_FLAG_PAGED 0x0000000000000100ULL

NTKERNELAPI PVOID NTAPI ExAllocatePool2(POOL_FLAGS Flags, SIZE_T NumberOfBytes, ULONG Tag);

#endif
