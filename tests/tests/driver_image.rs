//! Checks the built driver image, `kstack.sys`, for the properties a Windows
//! kernel insists on before it loads a driver.
//!
//! The image is cross-built on Linux with rust-lld, so nothing in that build
//! guarantees what MSVC's `link.exe /DRIVER` would: a wrong subsystem, entry
//! point or import is only found when the driver fails to load on a test
//! machine (or bugchecks it). These tests catch that on Linux instead:
//!
//! - the image is a native-subsystem (`IMAGE_SUBSYSTEM_NATIVE`) PE32+ image for
//!   AMD64; the kernel's loader rejects anything else;
//! - its entry point is `DriverEntry`, as recorded in the PDB;
//! - every import comes from `ntoskrnl.exe` or `HAL.dll`: a driver cannot
//!   import from user-mode DLLs, and the loader fails on an unresolved import;
//! - the PE checksum is valid: the loader checks it for boot drivers, and
//!   signing tools check it too;
//! - `IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY` is set, so the kernel enforces
//!   the signature check on the image; `NX_COMPAT` is set, and the extended
//!   DLL characteristics debug entry says `CET_COMPAT` (`/CETCOMPAT`: the
//!   image runs under kernel-mode CET shadow stacks);
//! - the release image holds no test-injection code: no procedure of the
//!   `injection` module is in its PDB, while the test build's PDB has them
//!   (so the check can tell the two apart).
//!
//! The image is read from `$KSTACK_PACKAGE_DIR` (set by `cargo xtask test`),
//! or from `target/kstack-package` in the workspace when that is unset; the
//! test build from `$KSTACK_WINE_SUPPORT_DIR/injection` (default
//! `target/kstack-wine/injection`). A missing image fails the tests: run
//! `cargo xtask test`, which builds both.

use std::{
    env, fs,
    mem::{offset_of, size_of},
    path::Path,
};

use kstack_tests::{
    folders::{PACKAGE_DIR_ENV, injection_build_dir, package_dir},
    stack_bounds::{CALLBACK_PATH_BOUND, CAPTURE_NOW_PATH_BOUND, USER_WALK_OWN_BOUND},
};
use object::{
    LittleEndian as LE,
    pe::{
        IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY, IMAGE_DLLCHARACTERISTICS_NX_COMPAT,
        IMAGE_FILE_MACHINE_AMD64, IMAGE_NT_OPTIONAL_HDR64_MAGIC, IMAGE_SUBSYSTEM_NATIVE,
        ImageFileHeader, ImageNtHeaders64, ImageOptionalHeader64,
    },
    read::pe::{ImageNtHeaders, ImageOptionalHeader, PeFile64},
};
use pdb::FallibleIterator;

/// The DLLs a kernel driver may import from (compared case-insensitively).
const KERNEL_DLLS: [&str; 2] = ["ntoskrnl.exe", "HAL.dll"];

/// Reads a file from the package folder, failing the test if it is missing.
fn read_package_file(name: &str) -> Vec<u8> {
    let path = package_dir().join(name);
    fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "cannot read {} ({error}); run `cargo xtask test`, which builds the driver \
             image before running the tests (or set {PACKAGE_DIR_ENV} to a folder holding \
             kstack.sys and kstack.pdb)",
            path.display()
        )
    })
}

/// The bytes of `kstack.sys`.
fn image_bytes() -> Vec<u8> {
    read_package_file("kstack.sys")
}

/// Parses `image` as a PE32+ image.
fn parse(image: &[u8]) -> PeFile64<'_> {
    PeFile64::parse(image)
        .unwrap_or_else(|error| panic!("kstack.sys is not a PE32+ image: {error}"))
}

/// Whether `name` is one of [`KERNEL_DLLS`].
fn is_kernel_dll(name: &[u8]) -> bool {
    KERNEL_DLLS
        .iter()
        .any(|dll| name.eq_ignore_ascii_case(dll.as_bytes()))
}

/// The standard PE image checksum of `image` (as `CheckSumMappedFile`
/// computes it), with the 4-byte `CheckSum` field at `checksum_offset`
/// treated as zero.
///
/// The file is summed as 16-bit little-endian words (an odd last byte is a
/// word whose high byte is zero), folding each carry back into the low 16
/// bits; the file length is then added to the 16-bit sum.
fn pe_checksum(image: &[u8], checksum_offset: usize) -> u32 {
    let checksum_field = checksum_offset..checksum_offset + 4;
    let byte = |index: usize| {
        if checksum_field.contains(&index) {
            0
        } else {
            image.get(index).copied().map_or(0, u32::from)
        }
    };
    let mut sum: u32 = 0;
    for word_start in (0..image.len()).step_by(2) {
        sum += byte(word_start) | (byte(word_start + 1) << 8);
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    let length = u32::try_from(image.len()).expect("a PE image is smaller than 4 GiB");
    sum.wrapping_add(length)
}

/// The file offset of `OptionalHeader.CheckSum` in a PE32+ image.
fn checksum_offset(pe: &PeFile64<'_>) -> usize {
    let nt_headers = usize::try_from(pe.dos_header().e_lfanew.get(LE)).expect("u32 fits usize");
    // IMAGE_NT_HEADERS64: the "PE\0\0" signature, the file header, then the
    // optional header.
    nt_headers
        + size_of::<u32>()
        + size_of::<ImageFileHeader>()
        + offset_of!(ImageOptionalHeader64, check_sum)
}

/// Checks the stored PE checksum of `image` against the computed one,
/// returning the checksum or a description of what is wrong.
fn verify_checksum(image: &[u8]) -> Result<u32, String> {
    let pe = PeFile64::parse(image).map_err(|error| format!("not a PE32+ image: {error}"))?;
    let stored = pe.nt_headers().optional_header().check_sum();
    let offset = checksum_offset(&pe);
    // Cross-check the computed offset against the parsed header.
    let at_offset = image
        .get(offset..offset + 4)
        .and_then(|field| field.try_into().ok())
        .map(u32::from_le_bytes);
    if at_offset != Some(stored) {
        return Err(format!(
            "the CheckSum field offset {offset:#x} is wrong: it holds {at_offset:#x?}, \
             the header says {stored:#010x}"
        ));
    }
    if stored == 0 {
        return Err("the stored PE checksum is 0 (the linker did not set it)".to_owned());
    }
    let computed = pe_checksum(image, offset);
    if stored == computed {
        Ok(stored)
    } else {
        Err(format!(
            "the stored PE checksum {stored:#010x} does not match the computed {computed:#010x}"
        ))
    }
}

/// Opens `dir`'s kstack.pdb.
fn open_pdb(dir: &Path) -> pdb::PDB<'static, fs::File> {
    let path = dir.join("kstack.pdb");
    let file = fs::File::open(&path).unwrap_or_else(|error| {
        panic!(
            "cannot open {} ({error}); run `cargo xtask test`, which builds the driver \
             images and their PDBs before running the tests",
            path.display()
        )
    });
    pdb::PDB::open(file).expect("kstack.pdb is a readable PDB")
}

/// The names of every procedure in `dir`'s kstack.pdb (module streams).
fn pdb_procedure_names(dir: &Path) -> Vec<String> {
    pdb_procedures(dir)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The RVA of the public symbol `name` in `kstack.pdb`, if it has one.
fn pdb_public_symbol_rva(name: &str) -> Option<u32> {
    let mut pdb = open_pdb(&package_dir());
    let address_map = pdb.address_map().expect("kstack.pdb has an address map");
    let symbols = pdb.global_symbols().expect("kstack.pdb has global symbols");
    let mut iter = symbols.iter();
    while let Some(symbol) = iter.next().expect("kstack.pdb's global symbols parse") {
        // Symbol kinds the pdb crate does not know are skipped, not errors.
        if let Ok(pdb::SymbolData::Public(public)) = symbol.parse()
            && public.name.as_bytes() == name.as_bytes()
        {
            let rva = public.offset.to_rva(&address_map).unwrap_or_else(|| {
                panic!(
                    "the public symbol {name} at {:?} has no RVA in kstack.pdb's address map",
                    public.offset
                )
            });
            return Some(rva.0);
        }
    }
    None
}

#[test]
fn is_a_native_amd64_pe32_plus_image() {
    let image = image_bytes();
    let pe = parse(&image);
    let headers = pe.nt_headers();

    let machine = headers.file_header().machine.get(LE);
    assert_eq!(
        machine, IMAGE_FILE_MACHINE_AMD64,
        "machine is {machine:#06x}, expected IMAGE_FILE_MACHINE_AMD64 ({IMAGE_FILE_MACHINE_AMD64:#06x})"
    );
    let optional = headers.optional_header();
    let magic = optional.magic();
    assert_eq!(
        magic, IMAGE_NT_OPTIONAL_HDR64_MAGIC,
        "optional header magic is {magic:#06x}, expected PE32+ ({IMAGE_NT_OPTIONAL_HDR64_MAGIC:#06x})"
    );
    let subsystem = optional.subsystem();
    assert_eq!(
        subsystem, IMAGE_SUBSYSTEM_NATIVE,
        "subsystem is {subsystem}, expected IMAGE_SUBSYSTEM_NATIVE ({IMAGE_SUBSYSTEM_NATIVE})"
    );
}

#[test]
fn entry_point_is_driver_entry() {
    let image = image_bytes();
    let pe = parse(&image);
    let entry = pe.nt_headers().optional_header().address_of_entry_point();
    let driver_entry = pdb_public_symbol_rva("DriverEntry")
        .expect("kstack.pdb has no public symbol DriverEntry (is it exported unmangled?)");
    assert_eq!(
        entry, driver_entry,
        "AddressOfEntryPoint is {entry:#x}, but DriverEntry is at RVA {driver_entry:#x}"
    );
}

/// Windows releases, oldest first, as far as kstack's imports need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Windows {
    W2000,
    Xp,
    VistaSp1,
    Seven,
    /// Windows 10 version 1903: primitive-driver INFs (kstack.inx) need it.
    Ten1903,
}

/// The oldest Windows kstack supports (docs/project-state.md, inf/kstack.inx): Windows 10
/// version 1903, x64. The imports alone would load on Windows 7.
const MINIMUM_WINDOWS: Windows = Windows::Ten1903;
/// How docs/project-state.md and kstack.inx name it.
const MINIMUM_WINDOWS_TEXT: &str = "Windows 10 version 1903 (x64)";

/// Every routine kstack.sys imports statically from ntoskrnl.exe, with the
/// first Windows that exports it (the "minimum supported client" of its
/// Microsoft documentation page). A new import must be added here, and the
/// check below keeps it within [`MINIMUM_WINDOWS`]. Routines newer than
/// that are looked up at run time instead (driver/src/routines.rs:
/// `ExAllocatePool2`, Windows 10 2004; `KeQuerySystemTimePrecise`,
/// Windows 8; `CmRegisterCallbackEx`; `KeQueryPerformanceCounter`, HAL's
/// before Windows 8; `ZwQuerySystemInformation`, declared only in user-mode
/// headers). Data exports are imported, as the WDK declares them.
const KERNEL_IMPORTS: [(&str, Windows); 57] = [
    ("ExAllocatePoolWithTag", Windows::W2000),
    ("ExFreePoolWithTag", Windows::W2000),
    ("IoCreateDevice", Windows::W2000),
    ("IoCreateSymbolicLink", Windows::W2000),
    ("IoDeleteDevice", Windows::W2000),
    ("IoDeleteSymbolicLink", Windows::W2000),
    ("IoGetStackLimits", Windows::W2000),
    ("IoIs32bitProcess", Windows::Xp),
    ("IofCompleteRequest", Windows::W2000),
    ("KeBugCheckEx", Windows::W2000),
    ("KeCancelTimer", Windows::W2000),
    ("KeDelayExecutionThread", Windows::W2000),
    ("KeExpandKernelStackAndCalloutEx", Windows::Seven),
    ("KeFlushQueuedDpcs", Windows::Xp),
    ("KeGetCurrentProcessorNumberEx", Windows::Seven),
    ("KeInitializeDpc", Windows::W2000),
    ("KeInitializeTimerEx", Windows::W2000),
    ("KeIsAttachedProcess", Windows::VistaSp1),
    ("KeQueryActiveProcessorCountEx", Windows::Seven),
    ("KeSetTimerEx", Windows::W2000),
    ("MmGetSystemRoutineAddress", Windows::W2000),
    ("ObOpenObjectByPointer", Windows::W2000),
    ("ObfDereferenceObject", Windows::W2000),
    ("ObfReferenceObject", Windows::W2000),
    ("ObRegisterCallbacks", Windows::VistaSp1),
    ("ObUnRegisterCallbacks", Windows::VistaSp1),
    ("PsGetCurrentProcessId", Windows::W2000),
    ("PsGetCurrentThread", Windows::W2000),
    ("PsGetCurrentThreadId", Windows::W2000),
    ("PsGetProcessId", Windows::Xp),
    ("PsGetThreadProcessId", Windows::VistaSp1),
    ("PsIsSystemThread", Windows::Xp),
    ("PsLookupProcessByProcessId", Windows::W2000),
    ("PsLookupThreadByThreadId", Windows::W2000),
    ("PsProcessType", Windows::W2000),
    ("PsRemoveCreateThreadNotifyRoutine", Windows::Xp),
    ("PsRemoveLoadImageNotifyRoutine", Windows::Xp),
    ("PsSetCreateProcessNotifyRoutineEx", Windows::VistaSp1),
    ("PsSetCreateThreadNotifyRoutine", Windows::W2000),
    ("PsSetLoadImageNotifyRoutine", Windows::W2000),
    ("PsThreadType", Windows::W2000),
    ("RtlAddAccessAllowedAce", Windows::W2000),
    ("RtlCaptureStackBackTrace", Windows::Xp),
    ("RtlCreateAcl", Windows::W2000),
    ("RtlCreateSecurityDescriptor", Windows::W2000),
    ("RtlSetDaclSecurityDescriptor", Windows::W2000),
    ("ZwClose", Windows::W2000),
    ("ZwCreateKey", Windows::W2000),
    ("ZwOpenKey", Windows::W2000),
    ("ZwQueryKey", Windows::W2000),
    ("ZwQueryValueKey", Windows::W2000),
    ("ZwSetSecurityObject", Windows::Xp),
    ("ZwSetValueKey", Windows::W2000),
    ("__C_specific_handler", Windows::Xp),
    ("memcpy", Windows::W2000),
    ("memmove", Windows::W2000),
    ("memset", Windows::W2000),
];

/// Every DLL kstack.sys imports from, with the names it imports (an
/// import by ordinal has none).
fn imports(pe: &PeFile64<'_>) -> Vec<(String, Vec<Option<String>>)> {
    import_tables(pe)
        .into_iter()
        .map(|(dll, _, names)| (dll, names))
        .collect()
}

/// [`imports`], with the RVA of each DLL's import address table (the
/// slot of its n-th name is 8 n bytes further).
fn import_tables(pe: &PeFile64<'_>) -> Vec<(String, u32, Vec<Option<String>>)> {
    let mut dlls = Vec::new();
    let Some(table) = pe.import_table().expect("the import table parses") else {
        return dlls;
    };
    let mut descriptors = table.descriptors().expect("the import descriptors parse");
    while let Some(descriptor) = descriptors.next().expect("an import descriptor parses") {
        let dll = table
            .name(descriptor.name.get(LE))
            .expect("an imported DLL's name parses");
        // The lookup table if there is one, else the address table.
        let lookup = match descriptor.original_first_thunk.get(LE) {
            0 => descriptor.first_thunk.get(LE),
            rva => rva,
        };
        let mut thunks = table.thunks(lookup).expect("an import thunk list parses");
        let mut names = Vec::new();
        while let Some(thunk) = thunks
            .next::<ImageNtHeaders64>()
            .expect("an import thunk parses")
        {
            let import = table
                .import::<ImageNtHeaders64>(thunk)
                .expect("an imported name parses");
            names.push(match import {
                object::read::pe::Import::Name(_, name) => {
                    Some(String::from_utf8_lossy(name).into_owned())
                }
                object::read::pe::Import::Ordinal(_) => None,
            });
        }
        dlls.push((
            String::from_utf8_lossy(dll).into_owned(),
            descriptor.first_thunk.get(LE),
            names,
        ));
    }
    dlls
}

#[test]
fn every_import_exists_on_the_minimum_windows() {
    let image = image_bytes();
    let kernel = imports(&parse(&image))
        .into_iter()
        .find(|(dll, _)| dll.eq_ignore_ascii_case("ntoskrnl.exe"))
        .expect("kstack.sys imports from ntoskrnl.exe");
    // The object types are data exports: imported (the documented way), not
    // found with MmGetSystemRoutineAddress, which is documented for routines.
    for data in ["PsProcessType", "PsThreadType"] {
        assert!(
            kernel.1.iter().any(|name| name.as_deref() == Some(data)),
            "kstack.sys must import {data}"
        );
    }
    for name in kernel.1 {
        let name = name.expect("kstack.sys imports by name");
        let Some(&(_, since)) = KERNEL_IMPORTS.iter().find(|(known, _)| *known == name) else {
            panic!(
                "kstack.sys imports {name}, which the table of imports does not list: add it with the \
                 first Windows that exports it, or look it up at run time (driver/src/routines.rs)"
            );
        };
        assert!(
            since <= MINIMUM_WINDOWS,
            "{name} needs {since:?}, newer than the minimum {MINIMUM_WINDOWS:?}"
        );
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    for document in ["docs/project-state.md", "inf/kstack.inx"] {
        let text = fs::read_to_string(workspace.join(document)).expect("the document reads");
        assert!(
            text.contains(MINIMUM_WINDOWS_TEXT),
            "{document} must name the minimum, {MINIMUM_WINDOWS_TEXT}"
        );
    }
}

/// One function's structured-exception scope, as its unwind information
/// names it for `__C_specific_handler`.
#[derive(Debug)]
struct Scope {
    begin: u32,
    end: u32,
    filter: u32,
    landing: u32,
}

/// The functions of the image whose unwind information names an exception
/// handler: (function start, handler RVA, the scope table after it).
fn functions_with_handlers(pe: &PeFile64<'_>) -> Vec<(u32, u32, Vec<Scope>)> {
    const UNW_FLAG_EHANDLER: u8 = 1;
    let at = |rva: u32, len: usize| -> &[u8] {
        let bytes = pe
            .section_table()
            .pe_data_at(pe.data(), rva)
            .expect("an RVA inside a section");
        &bytes[..len]
    };
    let word = |rva: u32| u32::from_le_bytes(at(rva, 4).try_into().unwrap());
    let (table, size) = pe
        .data_directories()
        .get(object::pe::IMAGE_DIRECTORY_ENTRY_EXCEPTION)
        .expect("an exception directory")
        .address_range();
    let mut found = Vec::new();
    for entry in (table..table + size).step_by(12) {
        let (start, unwind) = (word(entry), word(entry + 8));
        let header = at(unwind, 4);
        if header[0] >> 3 & UNW_FLAG_EHANDLER == 0 {
            continue;
        }
        // The unwind codes (2 bytes each, an even number of slots), then
        // the handler's RVA, then its data.
        let codes = u32::from(header[2]).next_multiple_of(2);
        let handler_at = unwind + 4 + 2 * codes;
        let scopes_at = handler_at + 4;
        let scopes = (0..word(scopes_at))
            .map(|index| {
                let entry = scopes_at + 4 + 16 * index;
                Scope {
                    begin: word(entry),
                    end: word(entry + 4),
                    filter: word(entry + 8),
                    landing: word(entry + 12),
                }
            })
            .collect();
        found.push((start, word(handler_at), scopes));
    }
    found
}

/// The RVA of the import address table slot of ntoskrnl's `routine`.
fn ntoskrnl_import_slot(pe: &PeFile64<'_>, routine: &str) -> u32 {
    let (_, table, names) = import_tables(pe)
        .into_iter()
        .find(|(dll, _, _)| dll.eq_ignore_ascii_case("ntoskrnl.exe"))
        .expect("kstack.sys imports from ntoskrnl.exe");
    let index = names
        .iter()
        .position(|name| name.as_deref() == Some(routine))
        .unwrap_or_else(|| panic!("kstack.sys imports {routine}"));
    table + 8 * u32::try_from(index).expect("a small index")
}

/// The fault scope the user walk runs in (`driver/src/fault_scope.rs`) is in
/// the release image: one function names `__C_specific_handler` (through
/// the linker's jump to its import slot) with one catch-all scope over a
/// call, landing inside the function.
#[test]
fn the_release_image_carries_the_fault_scope() {
    let image = image_bytes();
    let pe = parse(&image);
    let slot = ntoskrnl_import_slot(&pe, "__C_specific_handler");
    let handlers = functions_with_handlers(&pe);
    let [(start, handler, scopes)] = &handlers[..] else {
        panic!("one function with an exception handler expected: {handlers:?}");
    };
    let jump = pe
        .section_table()
        .pe_data_at(pe.data(), *handler)
        .expect("the handler's code");
    // jmp qword ptr [rip + disp32]
    assert_eq!(
        &jump[..2],
        &[0xFF, 0x25],
        "the handler is a jump through an import slot"
    );
    let target = handler
        .wrapping_add(6)
        .wrapping_add_signed(i32::from_le_bytes(jump[2..6].try_into().unwrap()));
    assert_eq!(
        target, slot,
        "the handler jumps through __C_specific_handler's slot"
    );
    let [scope] = &scopes[..] else {
        panic!("one scope expected: {scopes:?}");
    };
    assert_eq!(
        scope.filter, 1,
        "EXCEPTION_EXECUTE_HANDLER: every exception is caught"
    );
    assert!(*start < scope.begin && scope.begin < scope.end && scope.end <= scope.landing);
    let covered = pe
        .section_table()
        .pe_data_at(pe.data(), scope.begin)
        .expect("the scope's code");
    // call rax, then the nop that keeps the return address inside.
    assert_eq!(
        &covered[..3],
        &[0xFF, 0xD0, 0x90],
        "the scope covers the call"
    );
    assert_eq!(scope.end - scope.begin, 3);
}

#[test]
fn imports_only_from_the_kernel() {
    let image = image_bytes();
    let pe = parse(&image);

    let mut ntoskrnl_imports = 0_usize;
    let mut foreign_dlls = Vec::new();
    for (dll, names) in imports(&pe) {
        if !is_kernel_dll(dll.as_bytes()) {
            foreign_dlls.push(dll.clone());
        }
        if dll.eq_ignore_ascii_case("ntoskrnl.exe") {
            ntoskrnl_imports += names.len();
        }
    }
    // Delay-loaded imports are imports too (and a kernel cannot delay-load).
    if let Some(table) = pe
        .data_directories()
        .delay_load_import_table(pe.data(), &pe.section_table())
        .expect("the delay-load import table parses")
    {
        let mut descriptors = table
            .descriptors()
            .expect("the delay-load descriptors parse");
        while let Some(descriptor) = descriptors.next().expect("a delay-load descriptor parses") {
            let dll = table
                .name(descriptor.dll_name_rva.get(LE))
                .expect("a delay-loaded DLL's name parses");
            foreign_dlls.push(format!("{} (delay-loaded)", String::from_utf8_lossy(dll)));
        }
    }

    assert!(
        foreign_dlls.is_empty(),
        "kstack.sys imports from {foreign_dlls:?}; a driver may only import from {KERNEL_DLLS:?}"
    );
    assert!(
        ntoskrnl_imports > 0,
        "kstack.sys imports {ntoskrnl_imports} functions from ntoskrnl.exe, expected at least one"
    );
}

#[test]
fn pe_checksum_of_a_synthetic_buffer() {
    // 9 bytes (odd length), with a stand-in "CheckSum field" at offset 4..8:
    //   words: 0x0201, 0xffff, [0xbbaa, 0xddcc: the field, summed as 0, 0],
    //          0x0003 (the odd last byte, high byte 0)
    //   0x0201 + 0xffff = 0x1_0200 -> fold the carry: 0x0200 + 0x1 = 0x0201
    //   0x0201 + 0x0003 = 0x0204
    //   + the length 9   = 0x020d
    let buffer = [0x01, 0x02, 0xff, 0xff, 0xaa, 0xbb, 0xcc, 0xdd, 0x03];
    let checksum = pe_checksum(&buffer, 4);
    assert_eq!(
        checksum, 0x020d,
        "checksum is {checksum:#06x}, expected 0x020d"
    );

    // The field's contents do not matter.
    let mut zeroed = buffer;
    zeroed[4..8].fill(0);
    let checksum = pe_checksum(&zeroed, 4);
    assert_eq!(
        checksum, 0x020d,
        "checksum with a zeroed field is {checksum:#06x}, expected 0x020d"
    );

    // The empty file sums to its length, 0.
    let checksum = pe_checksum(&[], 0);
    assert_eq!(
        checksum, 0,
        "checksum of an empty buffer is {checksum:#x}, expected 0"
    );
}

#[test]
fn pe_checksum_is_valid() {
    let image = image_bytes();
    if let Err(problem) = verify_checksum(&image) {
        panic!("kstack.sys: {problem}");
    }
}

#[test]
fn pe_checksum_detects_a_flipped_byte() {
    let mut image = image_bytes();
    let before = verify_checksum(&image);
    assert!(
        before.is_ok(),
        "the unmodified image must pass first: {before:?}"
    );
    // Flip a byte well away from the headers (and so from the CheckSum field).
    let index = image.len() - 1;
    image[index] ^= 0xff;
    let after = verify_checksum(&image);
    assert!(
        after.is_err(),
        "flipping byte {index:#x} still passed the checksum check: {after:?}"
    );
}

#[test]
fn force_integrity_is_set() {
    let image = image_bytes();
    let pe = parse(&image);
    let characteristics = pe.nt_headers().optional_header().dll_characteristics();
    assert!(
        characteristics & IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY != 0,
        "DllCharacteristics is {characteristics:#06x}, without \
         IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY ({IMAGE_DLLCHARACTERISTICS_FORCE_INTEGRITY:#06x})"
    );
}

#[test]
fn nx_compatible_and_cet_shadow_stack_compatible() {
    let image = image_bytes();
    let pe = parse(&image);
    let characteristics = pe.nt_headers().optional_header().dll_characteristics();
    assert!(
        characteristics & IMAGE_DLLCHARACTERISTICS_NX_COMPAT != 0,
        "DllCharacteristics is {characteristics:#06x}, without IMAGE_DLLCHARACTERISTICS_NX_COMPAT"
    );
    // /CETCOMPAT writes a debug directory entry of type 20
    // (IMAGE_DEBUG_TYPE_EX_DLLCHARACTERISTICS) whose data has bit 0
    // (IMAGE_DLLCHARACTERISTICS_EX_CET_COMPAT); llvm-readobj shows it.
    let image_path = package_dir().join("kstack.sys");
    let output = std::process::Command::new("llvm-readobj")
        .arg("--coff-debug-directory")
        .arg(&image_path)
        .output()
        .expect("llvm-readobj runs (Debian's llvm, which cargo xtask installs)");
    assert!(output.status.success(), "llvm-readobj failed: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let entry = text
        .split("DebugEntry {")
        .find(|entry| entry.contains("ExtendedDLLCharacteristics (0x14)"))
        .unwrap_or_else(|| panic!("no extended DLL characteristics entry:\n{text}"));
    assert!(
        entry.contains("IMAGE_DLL_CHARACTERISTICS_EX_CET_COMPAT"),
        "the extended DLL characteristics lack CET_COMPAT:\n{entry}"
    );
}

/// Procedures of the driver's `injection` module, as the PDB names them.
fn injection_procedures(procedures: &[String]) -> Vec<&str> {
    procedures
        .iter()
        .map(String::as_str)
        .filter(|name| name.contains("injection::"))
        .collect()
}

#[test]
fn the_release_image_has_no_test_injection_code() {
    let release = pdb_procedure_names(&package_dir());
    assert!(
        release.iter().any(|name| name.contains("dispatch::")),
        "the release PDB should name the driver's procedures: {} found",
        release.len()
    );
    assert_eq!(injection_procedures(&release), Vec::<&str>::new());
    let test_build = pdb_procedure_names(&injection_build_dir());
    let test_build = injection_procedures(&test_build);
    assert!(
        test_build
            .iter()
            .any(|name| name.ends_with("injection::serve")),
        "the test-injection build's PDB should have injection::serve: {test_build:?}"
    );
}

/// Each procedure of `dir`'s kstack.pdb: its name and its RVA.
fn pdb_procedures(dir: &Path) -> Vec<(String, u32)> {
    let mut pdb = open_pdb(dir);
    let address_map = pdb.address_map().expect("kstack.pdb has an address map");
    let info = pdb
        .debug_information()
        .expect("kstack.pdb has debug information");
    let mut modules = info.modules().expect("kstack.pdb lists its modules");
    let mut procedures = Vec::new();
    while let Some(module) = modules.next().expect("a module entry parses") {
        let Some(module_info) = pdb.module_info(&module).expect("a module stream reads") else {
            continue;
        };
        let mut symbols = module_info.symbols().expect("a module's symbols read");
        while let Some(symbol) = symbols.next().expect("a module symbol parses") {
            if let Ok(pdb::SymbolData::Procedure(procedure)) = symbol.parse()
                && let Some(rva) = procedure.offset.to_rva(&address_map)
            {
                procedures.push((procedure.name.to_string().into_owned(), rva.0));
            }
        }
    }
    procedures
}

/// The bytes of `image` at `rva`, to the end of its section.
fn at_rva<'i>(pe: &PeFile64<'i>, rva: u32) -> &'i [u8] {
    pe.section_table()
        .pe_data_at(pe.data(), rva)
        .unwrap_or_else(|| panic!("RVA {rva:#x} is in no section of kstack.sys"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// `UNWIND_INFO`'s flag for an entry that continues another's frame.
const UNW_FLAG_CHAININFO: u8 = 4;

/// The stack a function's prologue takes, from its x64 unwind codes (what
/// `RtlVirtualUnwind` reads): pushed registers and allocations, plus the
/// return address its caller pushed. Chained unwind info is followed.
fn frame_size(pe: &PeFile64<'_>, unwind_rva: u32) -> usize {
    let info = at_rva(pe, unwind_rva);
    let (flags, codes) = (info[0] >> 3, usize::from(info[2]));
    let slot = |index: usize| u16::from_le_bytes([info[4 + 2 * index], info[5 + 2 * index]]);
    let mut size = 0;
    let mut index = 0;
    while index < codes {
        let code = slot(index);
        let (operation, operation_info) = ((code >> 8) & 0xF, code >> 12);
        index += 1;
        match operation {
            0 => size += 8, // UWOP_PUSH_NONVOL
            1 if operation_info == 0 => {
                size += usize::from(slot(index)) * 8; // UWOP_ALLOC_LARGE, 16-bit
                index += 1;
            }
            1 => {
                size += usize::from(slot(index)) | usize::from(slot(index + 1)) << 16;
                index += 2;
            }
            2 => size += usize::from(operation_info) * 8 + 8, // UWOP_ALLOC_SMALL
            3 => {}                                           // UWOP_SET_FPREG
            4 | 8 => index += 1, // SAVE_NONVOL, SAVE_XMM128: into allocated space
            5 | 9 => index += 2, // their _FAR forms
            other => {
                panic!("unwind code {other} at RVA {unwind_rva:#x} is not expected in kstack.sys")
            }
        }
    }
    if flags & UNW_FLAG_CHAININFO != 0 {
        let chained = 4 + 2 * (codes + codes % 2);
        // A chained entry continues the same frame: its allocations add up.
        size += frame_size(pe, u32_at(info, chained + 8)) - 8;
    }
    size + 8
}

/// The frame of every kstack procedure that has unwind info, by name.
fn frame_sizes() -> Vec<(String, usize)> {
    let image = image_bytes();
    let pe = parse(&image);
    let directory = pe
        .data_directories()
        .get(object::pe::IMAGE_DIRECTORY_ENTRY_EXCEPTION)
        .expect("kstack.sys has an exception directory");
    let table = at_rva(&pe, directory.virtual_address.get(LE));
    let entries = &table[..directory.size.get(LE) as usize];
    let unwind_of = |rva: u32| {
        entries
            .chunks_exact(12)
            .find(|entry| u32_at(entry, 0) == rva)
            .map(|entry| u32_at(entry, 8))
    };
    pdb_procedures(&package_dir())
        .into_iter()
        .filter_map(|(name, rva)| Some((name, frame_size(&pe, unwind_of(rva)?))))
        .collect()
}

/// `kstack_guarded_walk`'s frame: `sub rsp, 40` and its return address.
const FAULT_SCOPE_THUNK_FRAME: usize = 48;
/// `kstack_apc_kernel_routine`'s frame, above `thread_stack::delivered`:
/// likewise.
const APC_ROUTINE_THUNK_FRAME: usize = 48;

/// The thread-stack APC's routines drop the device's last reference by a
/// tail jump into `ObfDereferenceObject`: that call can unmap kstack.sys
/// (`driver/src/sources/thread_stack.rs`), so nothing of kstack may run after
/// it. Each is exactly `sub rsp, 40; call <its Rust part>; add rsp, 40;
/// mov rcx, rax; jmp [rip + <ObfDereferenceObject's import slot>]; int3`.
#[test]
fn the_apc_routines_drop_the_device_reference_by_a_tail_jump() {
    let image = image_bytes();
    let pe = parse(&image);
    let slot = ntoskrnl_import_slot(&pe, "ObfDereferenceObject");
    for routine in ["kstack_apc_kernel_routine", "kstack_apc_rundown_routine"] {
        let rva = pdb_public_symbol_rva(routine)
            .unwrap_or_else(|| panic!("kstack.pdb has no public symbol {routine}"));
        let code = at_rva(&pe, rva);
        assert_eq!(
            code[..4],
            [0x48, 0x83, 0xEC, 0x28],
            "{routine}: sub rsp, 40 first"
        );
        assert_eq!(code[4], 0xE8, "{routine}: then a direct call");
        assert_eq!(
            code[9..13],
            [0x48, 0x83, 0xC4, 0x28],
            "{routine}: then add rsp, 40"
        );
        assert!(
            code[13..16] == [0x48, 0x89, 0xC1] || code[13..16] == [0x48, 0x8B, 0xC8],
            "{routine}: then mov rcx, rax"
        );
        assert_eq!(
            code[16..18],
            [0xFF, 0x25],
            "{routine}: then jmp [rip + disp32]"
        );
        let next = rva + 22;
        let target = next.wrapping_add_signed(i32::from_le_bytes(
            code[18..22].try_into().expect("4 bytes"),
        ));
        assert_eq!(
            target, slot,
            "{routine}: the jump goes through RVA {target:#x}, not ObfDereferenceObject's import slot {slot:#x}"
        );
        assert_eq!(code[22], 0xCC, "{routine}: the int3 after the jump");
    }
}

#[test]
fn the_capture_path_fits_the_kernel_stack_guard() {
    let frames = frame_sizes();
    let largest = |pattern: &str| {
        frames
            .iter()
            .filter(|(name, _)| name.contains(pattern))
            .map(|&(_, size)| size)
            .max()
            .unwrap_or(0)
    };
    for (name, size) in &frames {
        eprintln!("{size:6}  {name}");
    }
    let callbacks = [
        "on_tick",
        "on_process",
        "on_thread",
        "on_image",
        "on_registry",
        "on_handle",
    ]
    .map(largest)
    .into_iter()
    .chain([largest("thread_stack::delivered") + APC_ROUTINE_THUNK_FRAME])
    .max()
    .unwrap_or(0);
    let capture = largest("DriverCore::capture<");
    // The deepest of the walk (then RtlCaptureStackBackTrace's own frames)
    // and the publish section. A procedure the optimizer inlined has no
    // frame of its own (its frame is its caller's).
    // The kernel walk, then (after it returned) the user walk's call into
    // KeExpandKernelStackAndCalloutEx. The user walk itself runs on the
    // stack that routine gives it (`USER_WALK_STACK`, 24 KiB), not on
    // this one: the callout, the fault scope's thunk (whose 40 bytes and
    // return address the PDB does not list, driver/src/fault_scope.rs),
    // then RtlWalkFrameChain's own frames.
    let walk = largest("DriverCore::walk<") + largest("walk_stack").max(largest("walk_user_stack"));
    let user_walk_own_stack = largest("stack_expansion::run_call") + FAULT_SCOPE_THUNK_FRAME;
    assert!(
        user_walk_own_stack > FAULT_SCOPE_THUNK_FRAME && user_walk_own_stack <= USER_WALK_OWN_BOUND,
        "the user walk's callout must be in kstack.pdb and small: {user_walk_own_stack} bytes \
         of its own stack before RtlWalkFrameChain (bound {USER_WALK_OWN_BOUND})"
    );
    // The stack table's lookup runs in the section before the ring's
    // publish: its procedures, when not inlined, are one chain deep.
    let table = largest("StackTable::enter")
        + largest("StackTable::find_or_insert")
        + largest("StackTable::insert").max(largest("StackTable::pin"));
    let section = largest("at_dispatch<")
        + largest("::publish::closure")
        + table.max(largest("Stack::encode").max(largest("Stack::header")));
    assert!(
        callbacks > 0 && capture > 0 && walk > 0,
        "the capture path's procedures must be found in kstack.pdb"
    );
    let callback_path = callbacks + capture + walk.max(section);
    let capture_now_path =
        largest("dispatch::dispatch") + largest("::capture_now<") + walk.max(section);
    eprintln!(
        "callback path {callback_path} bytes (callback {callbacks}, capture {capture}, walk {walk}, section {section}); capture-now path {capture_now_path} bytes; the user walk's own stack {user_walk_own_stack} bytes before RtlWalkFrameChain"
    );
    assert!(
        callback_path <= CALLBACK_PATH_BOUND && capture_now_path <= CAPTURE_NOW_PATH_BOUND,
        "kstack's capture path grew: {callback_path} bytes from a callback (bound {CALLBACK_PATH_BOUND}), \
         {capture_now_path} from capture-now (bound {CAPTURE_NOW_PATH_BOUND}); see docs/kernel-stack.md"
    );
}

/// The client reads the image's identity (what a symbol server files it
/// and its PDB under) as the PDB itself states it: the same GUID and age,
/// from the file and from its bytes alike.
#[test]
fn the_clients_image_identity_is_the_pdbs() {
    let image = image_bytes();
    let identity = kstack_client::naming::identity::of_image(&image[..]).expect("a PE32+ image");
    let from_file = kstack_client::naming::identity::of_file(&package_dir().join("kstack.sys"))
        .expect("the package's kstack.sys");
    assert_eq!(identity, from_file);
    let pe = parse(&image);
    assert_eq!(
        identity.size_of_image,
        pe.nt_headers().optional_header.size_of_image.get(LE)
    );
    let debug = identity.debug.expect("kstack.sys has a CodeView record");
    assert_eq!(debug.pdb_name, "kstack.pdb");
    let information = open_pdb(&package_dir())
        .pdb_information()
        .expect("the PDB's information stream");
    let guid = information.guid.to_string().replace('-', "").to_uppercase();
    assert_eq!(debug.guid_text(), guid);
    assert_eq!(debug.age, information.age, "the image's age is the PDB's");
    assert_eq!(
        debug.symbol_server_key(),
        format!("{guid}{:X}", information.age)
    );
}
