//! Frame addresses named for people, the one way every output names them
//! (records, CallTrace lines, `top`, folded stacks, flamegraphs):
//! `module!function+0xoffset` when symbols name the function,
//! `module+0xoffset` when only the module list names the module, and the
//! bare address when no module holds it.

use std::{cell::RefCell, collections::HashMap};

use kstack_abi::{DRIVER_FILE_NAME, RecordHeader};

use crate::naming::{
    identity::ImageIdentity,
    modules::{Module, ModuleMap},
    process_modules::{ModuleChange, ProcessModules},
};

/// The process id of the module records of driver images.
const DRIVER_LOADS: u32 = 0;

/// The function holding an address, as symbols name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The function's name, undecorated (e.g. `kstack::dispatch::dispatch`).
    pub name: String,
    /// How far into the function the address is, in bytes.
    pub offset: u64,
    /// Where in the source the address is, when the symbols have lines:
    /// the calls inlined there, innermost first, then the function's own
    /// line last. Empty without line information.
    pub source: Vec<SourceFrame>,
}

/// One frame of source: a function (inlined, or the one holding the
/// address) and the file and line the address is at in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFrame {
    /// The function's name, when the symbols give it.
    pub function: Option<String>,
    /// The source file, as the symbols name it.
    pub file: Option<String>,
    /// The line in it.
    pub line: Option<u32>,
}

/// How text shows where a frame is in the source (`source`, innermost
/// first, see [`Function::source`]): ` at file:line` to follow the frame's
/// name, and a line `inlined function at file:line` for each call inlined
/// there, from the one the function makes to the innermost.
#[must_use]
pub fn source_text(source: &[SourceFrame]) -> (String, Vec<String>) {
    let at = |frame: &SourceFrame| {
        frame
            .place()
            .map_or_else(String::new, |place| format!(" at {place}"))
    };
    let own = source.last().map(at).unwrap_or_default();
    let inlined = source
        .iter()
        .rev()
        .skip(1)
        .map(|frame| {
            format!(
                "inlined {}{}",
                frame.function.as_deref().unwrap_or("(unnamed)"),
                at(frame)
            )
        })
        .collect();
    (own, inlined)
}

impl SourceFrame {
    /// `file:line`, `file`, or `None`.
    #[must_use]
    pub fn place(&self) -> Option<String> {
        let file = self.file.as_deref()?;
        Some(match self.line {
            Some(line) => format!("{file}:{line}"),
            None => file.to_owned(),
        })
    }
}

/// Where function names come from: PDB symbols through dbghelp on Windows
/// (`pdb_symbols`), PDB files read in Rust elsewhere (`pdb_files`), a table
/// in tests.
pub trait FunctionSource {
    /// The function holding `address` inside `module`, if its symbols name
    /// one; `image` is where the module's image is, when known (a user
    /// image, or a driver a module record reported), and `identity` the
    /// image's, when a saved capture carries it.
    fn function(
        &mut self,
        module: &Module,
        image: Option<&str>,
        identity: Option<&ImageIdentity>,
        address: u64,
    ) -> Option<Function>;
}

/// What is known of one frame's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedFrame<'a> {
    /// The module holding it.
    pub module: &'a Module,
    /// How far into the module it is, in bytes.
    pub offset: u64,
    /// The function holding it, when symbols name one.
    pub function: Option<Function>,
}

impl ResolvedFrame<'_> {
    /// `module!function`, when symbols name the function.
    #[must_use]
    pub fn function_name(&self) -> Option<String> {
        self.function
            .as_ref()
            .map(|function| format!("{}!{}", self.module.name, function.name))
    }

    /// `module!function+0xoffset`, or `module+0xoffset` when no function is
    /// known.
    #[must_use]
    pub fn name(&self) -> String {
        match self.function.as_ref().zip(self.function_name()) {
            Some((function, function_name)) => format!("{function_name}+{:#x}", function.offset),
            None => format!("{}+{:#x}", self.module.name, self.offset),
        }
    }
}

/// Names frames after a module list and, when it has one, a function
/// source, whose answers it keeps: a stack's frames repeat in every record.
/// It also says which frames a stack shows: not, by default, the ones at
/// its top inside kstack.sys (the capture path: the tracer, not the
/// traced).
pub struct Symbolizer {
    modules: ModuleMap,
    functions: Option<RefCell<CachedFunctions>>,
    /// Per-process user-mode modules, for the user part of stacks.
    processes: ProcessModules,
    /// kstack.sys's address range, as the module list has it.
    tracer: Option<(u64, u64)>,
    /// `--tracer-frames`: stacks show kstack.sys's frames at their top.
    tracer_frames: bool,
}

struct CachedFunctions {
    source: Box<dyn FunctionSource>,
    /// By address, then by the module asked about it: a user address is
    /// in other modules in other processes.
    found: HashMap<u64, Vec<(Module, Option<Function>)>>,
}

impl Symbolizer {
    /// Names frames after `modules` only.
    #[must_use]
    pub fn new(modules: ModuleMap) -> Self {
        let tracer = modules
            .modules()
            .iter()
            .find(|module| module.name.eq_ignore_ascii_case(DRIVER_FILE_NAME))
            .map(|module| (module.base, module.end()));
        Self {
            modules,
            functions: None,
            processes: ProcessModules::EMPTY,
            tracer,
            tracer_frames: false,
        }
    }

    /// Stacks show kstack.sys's own frames at their top too
    /// (`--tracer-frames`).
    #[must_use]
    pub fn showing_tracer_frames(self) -> Self {
        Self {
            tracer_frames: true,
            ..self
        }
    }

    /// How many of a stack's first kernel frames it does not show: the run
    /// of them inside kstack.sys (its capture path, and for a capture-now
    /// request its dispatch), unless `--tracer-frames` shows them; 0 when
    /// the module list does not hold kstack.sys. Stack ids, counts and the
    /// frames kept are unchanged: this is only what is shown.
    #[must_use]
    pub fn hidden_tracer_frames(&self, kernel_frames: &[u64]) -> usize {
        match self.tracer {
            Some((base, end)) if !self.tracer_frames => kernel_frames
                .iter()
                .take_while(|&&frame| (base..end).contains(&frame))
                .count(),
            _ => 0,
        }
    }

    /// Also names user frames after each process's modules.
    #[must_use]
    pub fn with_processes(self, processes: ProcessModules) -> Self {
        Self { processes, ..self }
    }

    /// The per-process modules user frames are named after.
    #[must_use]
    pub const fn processes(&self) -> &ProcessModules {
        &self.processes
    }

    /// Notes module records: later user frames of their processes are
    /// named after them (see [`ProcessModules::find`]).
    pub fn note_modules(&mut self, changes: &[ModuleChange]) {
        for change in changes {
            self.processes.note(change.clone());
        }
    }

    /// Notes the identity of an image a module record loaded (a saved
    /// capture's): its PDB is then found by it.
    pub fn note_loaded_identity(&mut self, module: &Module, identity: ImageIdentity) {
        self.processes.set_loaded_identity(module, identity);
    }

    /// A user frame of `record`'s process named `module!function+0xoffset`
    /// or `module+0xoffset` after that process's modules at the record's
    /// time, else as [`Self::name`] names any frame; `None` when nothing
    /// holds it.
    #[must_use]
    pub fn user_name(&self, record: &RecordHeader, address: u64) -> Option<String> {
        self.user_name_at(record.process_id, record.timestamp, address)
    }

    /// The user frame `address` of `process_id` at `timestamp`: in the
    /// module of that process holding it then, with the function symbols
    /// name there; else as [`Self::resolve`] finds any frame.
    #[must_use]
    pub fn resolve_user(
        &self,
        process_id: u32,
        timestamp: u64,
        address: u64,
    ) -> Option<ResolvedFrame<'_>> {
        match self.processes.find(process_id, timestamp, address) {
            Some((module, offset)) => Some(self.in_module(module, offset, address)),
            None => self.resolve(address),
        }
    }

    /// [`Self::user_name`] for a frame of `process_id` at `timestamp`.
    #[must_use]
    pub fn user_name_at(&self, process_id: u32, timestamp: u64, address: u64) -> Option<String> {
        self.resolve_user(process_id, timestamp, address)
            .map(|frame| frame.name())
    }

    /// [`Self::user_name`], or the bare address.
    #[must_use]
    pub fn user_location(&self, record: &RecordHeader, address: u64) -> String {
        self.user_name(record, address)
            .unwrap_or_else(|| format!("{address:#x}"))
    }

    /// [`Self::user_location`] of each frame.
    #[must_use]
    pub fn user_locations(&self, record: &RecordHeader, frames: &[u64]) -> Vec<String> {
        frames
            .iter()
            .map(|&frame| self.user_location(record, frame))
            .collect()
    }

    /// Also names the functions `source` knows.
    #[must_use]
    pub fn with_functions(self, source: Box<dyn FunctionSource>) -> Self {
        Self {
            functions: Some(RefCell::new(CachedFunctions {
                source,
                found: HashMap::new(),
            })),
            ..self
        }
    }

    /// The module list frames are named after.
    #[must_use]
    pub const fn modules(&self) -> &ModuleMap {
        &self.modules
    }

    /// The module holding `address` and, when symbols name it, the
    /// function; `None` when no module holds `address`. The kernel's module
    /// list comes first; an address it does not hold may be in a driver
    /// loaded after the list was taken, which the driver's module records
    /// (process id 0) report: the latest such load holding it names it.
    #[must_use]
    pub fn resolve(&self, address: u64) -> Option<ResolvedFrame<'_>> {
        let (module, offset) = self
            .modules
            .find(address)
            .or_else(|| self.processes.find(DRIVER_LOADS, u64::MAX, address))?;
        Some(self.in_module(module, offset, address))
    }

    /// `address`, `offset` into `module`, with the function symbols name
    /// there (asked once per address and module).
    fn in_module<'a>(&self, module: &'a Module, offset: u64, address: u64) -> ResolvedFrame<'a> {
        let function = self.functions.as_ref().and_then(|functions| {
            let CachedFunctions { source, found } = &mut *functions.borrow_mut();
            let asked = found.entry(address).or_default();
            if let Some((_, function)) = asked.iter().find(|(kept, _)| kept == module) {
                return function.clone();
            }
            let identity = self
                .modules
                .identity(module)
                .or_else(|| self.processes.identity(module));
            let function =
                source.function(module, self.processes.image_path(module), identity, address);
            asked.push((module.clone(), function.clone()));
            function
        });
        ResolvedFrame {
            module,
            offset,
            function,
        }
    }

    /// `module!function+0xoffset`, or `module+0xoffset` when no function is
    /// known there; `None` when no module holds `address`.
    #[must_use]
    pub fn name(&self, address: u64) -> Option<String> {
        self.resolve(address).map(|frame| frame.name())
    }

    /// [`Self::name`], or the bare address when no module holds it.
    #[must_use]
    pub fn location(&self, address: u64) -> String {
        self.name(address)
            .unwrap_or_else(|| format!("{address:#x}"))
    }

    /// [`Self::location`] of each frame.
    #[must_use]
    pub fn locations(&self, frames: &[u64]) -> Vec<String> {
        frames.iter().map(|&frame| self.location(frame)).collect()
    }

    /// A frame of `process` (its id and the record's time) as
    /// [`Self::resolve_user`] finds it, or a kernel frame (`None`) as
    /// [`Self::resolve`] does.
    #[must_use]
    pub fn resolve_at(
        &self,
        process: Option<(u32, u64)>,
        address: u64,
    ) -> Option<ResolvedFrame<'_>> {
        match process {
            Some((process_id, timestamp)) => self.resolve_user(process_id, timestamp, address),
            None => self.resolve(address),
        }
    }

    /// Where in the source `address` is (see [`Function::source`]); empty
    /// without line information. `process` says whose user frame it is
    /// (its id and the record's time), `None` for a kernel frame.
    #[must_use]
    pub fn source(&self, process: Option<(u32, u64)>, address: u64) -> Vec<SourceFrame> {
        self.resolve_at(process, address)
            .and_then(|frame| frame.function)
            .map(|function| function.source)
            .unwrap_or_default()
    }

    /// The frames' [`Self::source`] as JSON: per frame, its source frames
    /// (`function`, `file`, `line`, innermost first).
    #[must_use]
    pub fn sources_json(&self, process: Option<(u32, u64)>, frames: &[u64]) -> serde_json::Value {
        frames
            .iter()
            .map(|&frame| {
                self.source(process, frame)
                    .into_iter()
                    .map(|source| {
                        serde_json::json!({
                            "function": source.function,
                            "file": source.file,
                            "line": source.line,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The frames as JSON shows addresses: hex strings.
    #[must_use]
    pub fn hex(frames: &[u64]) -> Vec<String> {
        frames.iter().map(|frame| format!("{frame:#x}")).collect()
    }

    /// The frames as Sysmon prints a CallTrace: locations joined by `|`,
    /// most recent call first.
    #[must_use]
    pub fn call_trace(&self, frames: &[u64]) -> String {
        self.locations(frames).join("|")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::naming::modules::tests::sample_map;

    /// Functions by start address, counting the questions asked.
    pub struct TableSource {
        pub functions: Vec<(u64, &'static str)>,
        pub asked: Rc<RefCell<Vec<u64>>>,
    }

    impl FunctionSource for TableSource {
        fn function(
            &mut self,
            _module: &Module,
            _image: Option<&str>,
            _identity: Option<&ImageIdentity>,
            address: u64,
        ) -> Option<Function> {
            self.asked.borrow_mut().push(address);
            self.functions
                .iter()
                .rev()
                .find(|(start, _)| *start <= address)
                .map(|&(start, name)| Function {
                    name: name.to_owned(),
                    offset: address - start,
                    source: Vec::new(),
                })
        }
    }

    pub const DISPATCH: u64 = 0xFFFF_F801_2340_1000;

    /// The sample modules, with one function known in kstack.sys.
    pub fn with_dispatch() -> (Symbolizer, Rc<RefCell<Vec<u64>>>) {
        let asked = Rc::default();
        let source = TableSource {
            functions: vec![(DISPATCH, "kstack::dispatch::dispatch")],
            asked: Rc::clone(&asked),
        };
        (
            Symbolizer::new(sample_map())
                .showing_tracer_frames()
                .with_functions(Box::new(source)),
            asked,
        )
    }

    #[test]
    fn addresses_resolve_to_the_module_holding_them() {
        let symbolizer = Symbolizer::new(sample_map());
        let location = |address| symbolizer.location(address);
        assert_eq!(location(0xFFFF_F800_0012_3456), "ntoskrnl.exe+0x123456");
        assert_eq!(location(0xFFFF_F801_2340_0000), "kstack.sys+0x0");
        assert_eq!(location(0xFFFF_F801_2341_FFFF), "kstack.sys+0x1ffff");
        // One past the end, before the first, and in a gap: no module.
        assert_eq!(location(0xFFFF_F801_2342_0000), "0xfffff80123420000");
        assert_eq!(location(0x1000), "0x1000");
        assert_eq!(location(0xFFFF_F800_0100_0000), "0xfffff80001000000");
        assert_eq!(symbolizer.name(0x1000), None);
    }

    #[test]
    fn known_functions_are_named_and_the_rest_falls_back() {
        let (symbolizer, _) = with_dispatch();
        assert_eq!(
            symbolizer.location(DISPATCH + 0x4F),
            "kstack.sys!kstack::dispatch::dispatch+0x4f"
        );
        assert_eq!(
            symbolizer.location(DISPATCH),
            "kstack.sys!kstack::dispatch::dispatch+0x0"
        );
        // Before the only known function: the module still names it.
        assert_eq!(symbolizer.location(DISPATCH - 1), "kstack.sys+0xfff");
        // No module: the bare address, and the source is not asked.
        assert_eq!(symbolizer.location(0x42), "0x42");
    }

    #[test]
    fn resolved_frames_name_the_function_without_its_offset() {
        let (symbolizer, _) = with_dispatch();
        let frame = symbolizer.resolve(DISPATCH + 0x4F).unwrap();
        assert_eq!(frame.module.name, "kstack.sys");
        assert_eq!(frame.offset, 0x104F);
        assert_eq!(
            frame.function_name().as_deref(),
            Some("kstack.sys!kstack::dispatch::dispatch")
        );
        let unnamed = symbolizer.resolve(DISPATCH - 1).unwrap();
        assert_eq!(unnamed.function_name(), None);
        assert_eq!(unnamed.name(), "kstack.sys+0xfff");
        assert!(symbolizer.resolve(0x42).is_none());
    }

    #[test]
    fn each_address_is_looked_up_once() {
        let (symbolizer, asked) = with_dispatch();
        for _ in 0..3 {
            assert_eq!(
                symbolizer.location(DISPATCH + 0x10),
                "kstack.sys!kstack::dispatch::dispatch+0x10"
            );
            assert_eq!(symbolizer.location(DISPATCH - 1), "kstack.sys+0xfff");
            assert_eq!(symbolizer.location(0x42), "0x42");
        }
        assert_eq!(*asked.borrow(), [DISPATCH + 0x10, DISPATCH - 1]);
    }

    #[test]
    fn user_frames_get_function_names_asked_once_per_module() {
        const MAIN: u64 = 0x7FF6_0000_1000;
        let asked = Rc::default();
        let source = TableSource {
            functions: vec![(MAIN, "main")],
            asked: Rc::clone(&asked),
        };
        let mut processes = ProcessModules::default();
        for (process_id, name) in [(100, "app.exe"), (200, "other.exe")] {
            processes.add(
                process_id,
                [Module {
                    base: 0x7FF6_0000_0000,
                    size: 0x2000,
                    name: name.to_owned(),
                }],
            );
        }
        let symbolizer = Symbolizer::new(sample_map())
            .with_functions(Box::new(source))
            .with_processes(processes);
        for _ in 0..2 {
            assert_eq!(
                symbolizer.user_name_at(100, 0, MAIN + 4).as_deref(),
                Some("app.exe!main+0x4")
            );
            assert_eq!(
                symbolizer.user_name_at(200, 0, MAIN + 4).as_deref(),
                Some("other.exe!main+0x4")
            );
        }
        // One question per module holding the address, then remembered.
        assert_eq!(*asked.borrow(), [MAIN + 4, MAIN + 4]);
        let frame = symbolizer.resolve_user(100, 0, MAIN + 4).unwrap();
        assert_eq!(frame.function_name().as_deref(), Some("app.exe!main"));
        assert_eq!(symbolizer.user_name_at(300, 0, MAIN), None, "no module");
    }

    /// A module's name and the image path the source was given for it.
    type ImageAsked = (String, Option<String>);

    /// Notes the image path it is given for each module.
    struct ImagesAsked(Rc<RefCell<Vec<ImageAsked>>>);

    impl FunctionSource for ImagesAsked {
        fn function(
            &mut self,
            module: &Module,
            image: Option<&str>,
            _: Option<&ImageIdentity>,
            _: u64,
        ) -> Option<Function> {
            self.0
                .borrow_mut()
                .push((module.name.clone(), image.map(str::to_owned)));
            None
        }
    }

    #[test]
    fn the_function_source_gets_the_images_path_when_known() {
        let asked = Rc::default();
        let app = Module {
            base: 0x7FF6_0000_0000,
            size: 0x2000,
            name: "app.exe".to_owned(),
        };
        let mut processes = ProcessModules::default();
        processes.add(100, [app.clone()]);
        processes.add_image_path(&app, r"C:\app\app.exe".to_owned());
        let symbolizer = Symbolizer::new(sample_map())
            .with_functions(Box::new(ImagesAsked(Rc::clone(&asked))))
            .with_processes(processes);
        assert_eq!(
            symbolizer.user_name_at(100, 0, 0x7FF6_0000_0010).as_deref(),
            Some("app.exe+0x10")
        );
        assert_eq!(
            symbolizer.location(0xFFFF_F800_0000_0020),
            "ntoskrnl.exe+0x20"
        );
        assert_eq!(
            *asked.borrow(),
            [
                ("app.exe".to_owned(), Some(r"C:\app\app.exe".to_owned())),
                ("ntoskrnl.exe".to_owned(), None),
            ]
        );
    }

    #[test]
    fn noted_module_records_name_later_user_frames() {
        let mut symbolizer = Symbolizer::new(sample_map());
        let header = kstack_abi::ModuleHeader {
            sequence: 1,
            timestamp: 10,
            process_id: 100,
            thread_id: 4,
            processor: 0,
            shard: 0,
            event: kstack_abi::ModuleEvent::ImageLoad,
            flags: kstack_abi::ModuleFlags::NONE,
            image_base: 0x7FF6_0000_0000,
            image_size: 0x1000,
            process_key: 0,
        };
        assert_eq!(symbolizer.user_name_at(100, 20, 0x7FF6_0000_0010), None);
        symbolizer.note_modules(&[ModuleChange {
            header,
            path: r"C:\app\app.exe".encode_utf16().collect(),
        }]);
        assert_eq!(
            symbolizer
                .user_name_at(100, 20, 0x7FF6_0000_0010)
                .as_deref(),
            Some("app.exe+0x10")
        );
        assert_eq!(symbolizer.processes().changes().len(), 1);
    }

    #[test]
    fn drivers_loaded_after_the_module_list_are_named_by_their_module_records() {
        let late = 0xFFFF_F802_0000_0000;
        let mut processes = ProcessModules::default();
        processes.note(ModuleChange {
            header: kstack_abi::ModuleHeader {
                sequence: 1,
                timestamp: 5,
                process_id: 0,
                thread_id: 4,
                processor: 0,
                shard: 0,
                event: kstack_abi::ModuleEvent::ImageLoad,
                flags: kstack_abi::ModuleFlags::NONE,
                image_base: late,
                image_size: 0x1000,
                process_key: 0,
            },
            path: r"\SystemRoot\System32\drivers\late.sys"
                .encode_utf16()
                .collect(),
        });
        let symbolizer = Symbolizer::new(sample_map()).with_processes(processes);
        assert_eq!(symbolizer.location(late + 0x10), "late.sys+0x10");
        assert_eq!(symbolizer.location(late + 0x1000), "0xfffff80200001000");
        // The list still names what it holds.
        assert_eq!(
            symbolizer.location(0xFFFF_F800_0012_3456),
            "ntoskrnl.exe+0x123456"
        );
    }

    #[test]
    fn call_trace_joins_locations_with_bars() {
        let symbolizer = Symbolizer::new(sample_map());
        assert_eq!(
            symbolizer.call_trace(&[0xFFFF_F801_2340_0010, 0xFFFF_F800_0000_0020, 0x42]),
            "kstack.sys+0x10|ntoskrnl.exe+0x20|0x42"
        );
        assert_eq!(symbolizer.call_trace(&[]), "");
        let (symbolizer, _) = with_dispatch();
        assert_eq!(
            symbolizer.call_trace(&[DISPATCH + 8, 0xFFFF_F800_0000_0020]),
            "kstack.sys!kstack::dispatch::dispatch+0x8|ntoskrnl.exe+0x20"
        );
    }
}
