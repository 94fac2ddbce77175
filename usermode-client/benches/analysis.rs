//! Offline analysis of a large saved capture (criterion): parsing the file,
//! decoding every record and grouping them by stack (what `kstack top
//! --input` does before printing), and turning the table into folded
//! stacks (what `folded` and `flamegraph` start from).
//!
//! The second group does the whole of an offline `folded` (parse, decode,
//! group, name every frame), once without symbols and once with the
//! package's kstack.pdb found by identity in a local folder (a warm symbol
//! cache): every frame of that capture is in kstack.sys's code, so each is
//! named from the PDB. It needs the package (`cargo xtask build`, or
//! `KSTACK_PACKAGE_DIR`).
//!
//! Run with `cargo bench -p kstack-client --bench analysis`; results are in
//! `docs/performance.md`. One record counts as one element, so criterion
//! reports records per second.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput};
use kstack_client::naming::{identity, pdb_files::PdbFiles};
use kstack_client::{
    capture::{
        reader::{CaptureReader, Item},
        stack_table::StackTable,
        synthetic::{self, FRAMES, KERNEL_BASE, MODULES},
        writer::CaptureWriter,
    },
    naming::{
        modules::{Module, ModuleMap},
        symbolizer::Symbolizer,
    },
};

/// Records in the benchmarked capture: about 65 MiB, a minute of a busy
/// timer source on a many-core machine.
const RECORDS: u64 = 200_000;

fn capture() -> Vec<u8> {
    capture_of(&synthetic::modules(), synthetic::frames)
}

/// A capture of [`RECORDS`] records over [`synthetic::UNIQUE_STACKS`]
/// stacks whose frames `frames` gives, with `modules` as its module list.
fn capture_of(modules: &ModuleMap, frames: impl Fn(u64) -> Vec<u64>) -> Vec<u8> {
    let mut writer = CaptureWriter::new(Vec::new(), modules).expect("writing to memory");
    synthetic::write_records(&mut writer, RECORDS, frames).expect("writing to memory");
    writer.finish().expect("writing to memory").out
}

fn table(bytes: &[u8]) -> (StackTable, ModuleMap) {
    let mut capture = CaptureReader::open(bytes).expect("a valid capture");
    let mut table = StackTable::default();
    while let Some(item) = capture.next_item() {
        if let Item::Record(record) = item.expect("a valid record") {
            table.add(&record);
        }
    }
    assert!(capture.health().is_whole());
    (table, capture.modules)
}

/// The package folder: `$KSTACK_PACKAGE_DIR`, else `target/kstack-package`.
fn package_dir() -> PathBuf {
    std::env::var_os("KSTACK_PACKAGE_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kstack-package"),
            PathBuf::from,
        )
}

/// A capture whose every frame is in kstack.sys's code (the package's
/// image, with its identity), and the folder holding its PDB.
fn named_capture() -> (Vec<u8>, PathBuf) {
    let dir = package_dir();
    let image = dir.join("kstack.sys");
    let identity = identity::of_file(&image)
        .unwrap_or_else(|error| panic!("{error}: build the package first (cargo xtask build)"));
    let bytes = std::fs::read(&image).expect("kstack.sys");
    let pe = object::read::pe::PeFile64::parse(&*bytes).expect("a PE32+ image");
    let text = pe
        .section_table()
        .iter()
        .find(|section| &section.name[..5] == b".text")
        .expect("a .text section");
    let start = u64::from(text.virtual_address.get(object::LittleEndian));
    let length = u64::from(text.virtual_size.get(object::LittleEndian));
    let mut modules = ModuleMap::new([Module {
        base: KERNEL_BASE,
        size: identity.size_of_image,
        name: "kstack.sys".to_owned(),
    }]);
    modules.set_identity(KERNEL_BASE, identity);
    let frames = move |stack: u64| {
        (0..FRAMES)
            .map(|depth| KERNEL_BASE + start + (stack * 97 + depth * 7919) % length)
            .collect()
    };
    (capture_of(&modules, frames), dir)
}

/// `folded` of a saved capture, start to end: parse, decode, group, name.
fn folded(bytes: &[u8], symbols: Option<&Path>) -> Vec<String> {
    let (table, modules) = table(bytes);
    let symbolizer = Symbolizer::new(modules).showing_tracer_frames();
    let symbolizer = match symbols {
        Some(dir) => symbolizer.with_functions(Box::new(PdbFiles::new(&dir.display().to_string()))),
        None => symbolizer,
    };
    table.folded(&symbolizer)
}

/// The whole of an offline `folded`, without symbols and with them.
fn named_folded(criterion: &mut Criterion) {
    let (named, pdb_dir) = named_capture();
    let with_symbols = folded(&named, Some(&pdb_dir));
    assert!(
        with_symbols.iter().all(|line| line.contains("kstack.sys!")),
        "every stack named from kstack.pdb"
    );
    let mut group = criterion.benchmark_group("saved_capture_200k_records_folded");
    group.throughput(Throughput::Elements(RECORDS));
    group.sample_size(10);
    group.bench_function("without_symbols", |bench| {
        bench.iter(|| black_box(folded(black_box(&named), None)));
    });
    group.bench_function("with_symbols_warm_cache", |bench| {
        bench.iter(|| black_box(folded(black_box(&named), Some(&pdb_dir))));
    });
    group.finish();
}

fn main() {
    let bytes = capture();
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("saved_capture_200k_records");
    group.throughput(Throughput::Elements(RECORDS));
    group.sample_size(20);
    group.bench_function("decode_and_aggregate", |bench| {
        bench.iter(|| black_box(table(black_box(&bytes))));
    });
    let (table, modules) = table(&bytes);
    let symbolizer = Symbolizer::new(modules);
    assert_eq!((table.records(), table.len()), (RECORDS, 2_000));
    group.bench_function("folded_from_table", |bench| {
        bench.iter(|| black_box(table.folded(black_box(&symbolizer))));
    });
    group.finish();
    named_folded(&mut criterion);
    criterion.final_summary();
    println!(
        "capture: {} bytes, {RECORDS} records, {} unique stacks, {MODULES} modules",
        bytes.len(),
        table.len()
    );
}
