//! What the offline tests share: a synthetic capture written as
//! `kstack save` writes one, the real `kstack` binary, and golden files.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kstack_abi::{
    ModuleEvent, ModuleFlags, ModuleHeader, RecordFlags, RecordHeader, SourceFacts,
    source_facts::{HandleOperation, Lifecycle, ObjectKind},
    stack_id,
};
use kstack_client::{
    capture::{trace::TraceRecord, writer::CaptureWriter},
    naming::{
        identity::{DebugIdentity, ImageIdentity},
        modules::{Module, ModuleMap},
        process_modules::{ModuleChange, ProcessModules},
    },
};

const NT: u64 = 0xFFFF_F806_2A00_0000;
const KSTACK: u64 = 0xFFFF_F806_3110_0000;
const FLTMGR: u64 = 0xFFFF_F806_2C40_0000;

/// The kernel's modules; kstack.sys and ntoskrnl.exe with their image
/// identities as a saved capture holds them (FLTMGR.SYS's could not be
/// read).
fn modules() -> ModuleMap {
    let mut map = ModuleMap::new([
        Module {
            base: NT,
            size: 0x104_6000,
            name: "ntoskrnl.exe".to_owned(),
        },
        Module {
            base: KSTACK,
            size: 0x2_4000,
            name: "kstack.sys".to_owned(),
        },
        Module {
            base: FLTMGR,
            size: 0x8_2000,
            name: "FLTMGR.SYS".to_owned(),
        },
    ]);
    map.set_identity(
        NT,
        ImageIdentity {
            timestamp: 0x4A3B_2C1D,
            size_of_image: 0x104_6000,
            debug: Some(DebugIdentity {
                pdb_name: "ntkrnlmp.pdb".to_owned(),
                guid: [
                    0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x01, 0x23, 0x45, 0x67, 0x89,
                    0xAB, 0xCD, 0xEF,
                ],
                age: 1,
            }),
        },
    );
    map.set_identity(
        KSTACK,
        ImageIdentity {
            timestamp: 0x6745_2301,
            size_of_image: 0x2_4000,
            debug: Some(DebugIdentity {
                pdb_name: "kstack.pdb".to_owned(),
                guid: *b"kstack-pdb-guid!",
                age: 1,
            }),
        },
    );
    map
}

const TIMER: &[u64] = &[
    KSTACK + 0x1A10,
    NT + 0x4_2F30,
    NT + 0x4_1B02,
    NT + 0x41_7C44,
];
const PROCESS: &[u64] = &[
    KSTACK + 0x2230,
    NT + 0x6E_1050,
    NT + 0x6E_0F11,
    NT + 0x42_A2B5,
];
const IMAGE: &[u64] = &[
    KSTACK + 0x2480,
    NT + 0x70_11A0,
    FLTMGR + 0x5_3D10,
    NT + 0x42_A2B5,
];
/// Two kernel frames, then the user part: one frame in its process's
/// `app.exe`, one in no module known.
const REGISTRY: &[u64] = &[
    KSTACK + 0x2610,
    NT + 0x69_B7C0,
    0x7FF6_1234_5678,
    0x7FF6_1230_1A00,
];
const OBJECT: &[u64] = &[KSTACK + 0x2890, NT + 0x6A_0010, NT + 0x6A_1F33];
const ONDEMAND: &[u64] = &[
    KSTACK + 0x3010,
    KSTACK + 0x2F40,
    NT + 0x3_A1C5,
    NT + 0x66_70B1,
];
const THREAD: &[u64] = &[KSTACK + 0x2350, NT + 0x6F_4410];
/// A thread's stack as a special kernel APC captured it (`kstack threads`,
/// `kstack sample`): no frame of kstack's, waiting in the kernel, then its
/// user part (one frame in `app.exe`).
const THREAD_STACK: &[u64] = &[
    NT + 0x3_3E12,
    NT + 0x3_2A70,
    NT + 0x6A_9C30,
    0x7FF6_1234_5678,
];
/// The same thread caught running elsewhere in the kernel.
const THREAD_STACK_RUNNING: &[u64] = &[NT + 0x4_0A18, NT + 0x6A_9C30, 0x7FF6_1234_5678];

/// What the synthetic capture's records hold, in order: facts, frames,
/// IRQL and flags.
type Event = (SourceFacts, &'static [u64], u8, RecordFlags);

/// A capture with every source, repeated stacks, a truncated record, a
/// capture-now record, a sample's thread stacks and records with a user part
/// (its frames, the ones below the kernel's half of the address space,
/// outside every module).
fn records() -> Vec<TraceRecord> {
    let mut records = Vec::new();
    // Captured on two processors in turn, each with its own ring shard and
    // sequence numbers.
    let mut spent = [0_u64; 2];
    for (facts, frames, irql, flags) in events() {
        let index = records.len() as u64 + 1;
        let shard = u16::try_from(index % 2).unwrap();
        spent[usize::from(shard)] += 1;
        let user_frames = frames
            .iter()
            .rev()
            .take_while(|&&frame| frame < 0xFFFF_8000_0000_0000)
            .count();
        records.push(TraceRecord {
            header: RecordHeader {
                sequence: spent[usize::from(shard)],
                // 2025-11-23T06:00:00Z plus 1 ms per record.
                timestamp: 134_083_512_000_000_000 + index * 10_000,
                process_id: if irql == 2 { 0 } else { 4312 },
                thread_id: 5000 + u32::try_from(index % 3).unwrap(),
                processor: shard,
                shard,
                irql,
                flags,
                user_frame_count: u8::try_from(user_frames).unwrap(),
                user_part: if user_frames == 0 {
                    kstack_abi::UserPart::Off
                } else {
                    kstack_abi::UserPart::Captured
                },
                os_hash: u32::try_from(stack_id(frames) & 0xFFFF_FFFF).unwrap(),
                stack_id: stack_id(frames),
                facts,
            },
            frames: frames.into(),
            sample: None,
        });
    }
    records
}

/// The events of [`records`].
fn events() -> Vec<Event> {
    let none = RecordFlags::NONE;
    let mut events: Vec<Event> = vec![(SourceFacts::Timer, TIMER, 2, none); 5];
    events.push((
        SourceFacts::Process {
            event: Lifecycle::Create,
            process_id: 4312,
            parent_process_id: 1024,
        },
        PROCESS,
        0,
        none,
    ));
    events.push((
        SourceFacts::Thread {
            event: Lifecycle::Exit,
            process_id: 4312,
            thread_id: 5001,
        },
        THREAD,
        0,
        none,
    ));
    let image = SourceFacts::ImageLoad {
        image_base: 0x7FF6_1230_0000,
        image_size: 0x5_0000,
        process_id: 4312,
    };
    events.extend([(image, IMAGE, 0, none), (image, IMAGE, 0, none)]);
    events.push((SourceFacts::Registry { notify_class: 1 }, REGISTRY, 0, none));
    events.push((
        SourceFacts::ObjectHandle {
            operation: HandleOperation::Create,
            object: ObjectKind::Process,
            desired_access: 0x1F_FFFF,
            target_process_id: 4,
        },
        OBJECT,
        0,
        RecordFlags::TRUNCATED,
    ));
    events.push((SourceFacts::OnDemand { tag: 4312 }, ONDEMAND, 0, none));
    events.push((SourceFacts::Timer, TIMER, 2, none));
    // A sample's tick: three threads of process 4312 (records 14 to 16 run
    // in threads 5002, 5000 and 5001), the last one late.
    for (thread_id, frames, late) in [
        (5002, THREAD_STACK, false),
        (5000, THREAD_STACK, false),
        (5001, THREAD_STACK_RUNNING, true),
    ] {
        let facts = SourceFacts::ThreadStack {
            target_process_id: 4312,
            target_thread_id: thread_id,
            tag: 0x6B73_7470_0000_0007,
            delay: if late { 12_000_000 } else { 2_500 },
            late,
        };
        events.push((facts, frames, 1, none));
    }
    events
}

/// The user-mode modules listed when the capture began: the registry
/// record's process has one image, holding one of its two user frames.
fn processes() -> ProcessModules {
    let mut processes = ProcessModules::default();
    processes.add(
        4312,
        [Module {
            base: 0x7FF6_1230_0000,
            size: 0x1_0000,
            name: "app.exe".to_owned(),
        }],
    );
    processes.set_listed_at(134_083_512_000_000_000);
    processes
}

/// A module record of the driver's, on shard 0.
fn module_record(
    event: ModuleEvent,
    timestamp: u64,
    sequence: u64,
    image: (u64, u32),
    path: &str,
) -> ModuleChange {
    ModuleChange {
        header: ModuleHeader {
            sequence,
            timestamp,
            process_id: 4312,
            thread_id: 5000,
            processor: 0,
            shard: 0,
            event,
            flags: ModuleFlags::NONE,
            image_base: image.0,
            image_size: image.1,
            process_key: 134_083_511_000_000_000,
        },
        path: path.encode_utf16().collect(),
    }
}

/// The records, and two module records among them: `helper.dll` loaded
/// into 4312 just before the registry record (naming its other user
/// frame), and 4312's exit at the end.
pub fn write_capture(path: &Path) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = CaptureWriter::with_processes(file, &modules(), &processes()).unwrap();
    for record in records() {
        if matches!(record.header.facts, SourceFacts::Registry { .. }) {
            let helper = module_record(
                ModuleEvent::ImageLoad,
                record.header.timestamp - 5_000,
                100,
                (0x7FF6_1234_0000, 0x1_0000),
                r"\Device\HarddiskVolume3\Program Files\App\helper.dll",
            );
            writer.append_module(&helper).unwrap();
        }
        writer.append(&record).unwrap();
    }
    let last = records().last().unwrap().header.timestamp;
    let exit = module_record(ModuleEvent::ProcessExit, last + 5_000, 101, (0, 0), "");
    writer.append_module(&exit).unwrap();
    writer.finish().unwrap();
}

pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn kstack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(args)
        .output()
        .expect("running kstack")
}

/// Compares `actual` with `tests/golden/<name>`, or rewrites that file
/// when `KSTACK_UPDATE_GOLDEN` is set.
pub fn check_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("KSTACK_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error} (set KSTACK_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{name} differs from its golden file {}\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

pub fn stdout_of(args: &[&str]) -> String {
    let output = kstack(args);
    assert!(
        output.status.success(),
        "kstack {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
