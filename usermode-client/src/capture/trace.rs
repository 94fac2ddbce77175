//! Trace records as the client keeps them (owned, decoded by kstack-abi),
//! and their two renderings: a readable block, and one JSON line.

use std::{collections::HashMap, fmt::Write as _, sync::Arc};

use kstack_abi::{
    DecodeError, RecordFlags, RecordHeader, RecordView, Source, SourceFacts, UserPart,
    source_facts::{HandleOperation, Lifecycle, ObjectKind},
};
use serde_json::{Value, json};

use crate::{
    clock::{cpu_time_text, system_time_text},
    naming::symbolizer::{Symbolizer, source_text},
    thread_list::{ThreadState, WaitReason, state_text},
};

/// Version of the JSON line schema (docs/client.md, "JSON output").
pub const JSON_SCHEMA_VERSION: u32 = 5;

/// What a sample says of its thread beside its stack: the thread's facts
/// at the tick's listing, and whether its stack was captured or repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleFacts {
    /// The scheduler's state when listed (`None`: the system did not say).
    pub state: Option<ThreadState>,
    /// What it waited for (meaningful when waiting).
    pub wait_reason: WaitReason,
    /// Kernel and user time since the thread's previous sample, 100 ns
    /// units (0 for its first).
    pub cpu_time: u64,
    /// Written without an APC: the thread had not run since its stack was
    /// last captured, and the sample repeats that stack.
    pub repeated: bool,
}

impl SampleFacts {
    /// The state, and for a waiting thread what it waited for:
    /// `running`, `waiting (UserRequest)`, `state unknown`.
    #[must_use]
    pub fn state_text(&self) -> String {
        state_text(self.state, self.wait_reason)
    }
}

/// One trace record: the protocol's header, and its frames owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// Everything but the frames.
    pub header: RecordHeader,
    /// Return addresses, most recent call first; shared by the records of
    /// one stack that a reader resolved through the stack table.
    pub frames: Arc<[u64]>,
    /// A sample's facts (`kstack sample`): the thread's state and CPU time
    /// when listed, and whether the stack was captured or repeated.
    pub sample: Option<SampleFacts>,
}

/// How a stack whose frames were lost is shown, in place of its frames.
pub const LOST_STACK: &str = "[stack lost: stored only in damaged bytes of the capture]";

impl TraceRecord {
    /// Whether this record's stack was stored only in damaged bytes of its
    /// capture (see `capture::reader`): it names its stack by id and has
    /// no frames; it is shown as [`LOST_STACK`].
    #[must_use]
    pub fn stack_lost(&self) -> bool {
        self.frames.is_empty() && self.header.flags.contains(RecordFlags::STACK_BY_ID)
    }
}

impl From<&RecordView<'_>> for TraceRecord {
    fn from(view: &RecordView<'_>) -> Self {
        Self {
            header: view.header,
            frames: view.frames().collect(),
            sample: None,
        }
    }
}

/// The stacks one reader (a device handle, or a capture file read from
/// its start) was sent, by stack id, to give frames to records that name
/// their stack instead of carrying it (see `RecordFlags::STACK_BY_ID`).
#[derive(Debug, Default)]
pub struct StackMemory {
    stacks: HashMap<u64, Arc<[u64]>>,
}

impl StackMemory {
    /// `view` as a record with its frames: its own, or the ones remembered
    /// for its stack id. A flagged record with frames is remembered. The
    /// flag is dropped: a [`TraceRecord`] always holds its frames.
    ///
    /// # Errors
    /// [`DecodeError::UnknownStack`] for a record naming a stack never sent.
    pub fn resolve(&mut self, view: &RecordView<'_>) -> Result<TraceRecord, DecodeError> {
        let mut header = view.header;
        if !header.flags.contains(RecordFlags::STACK_BY_ID) {
            return Ok(TraceRecord::from(view));
        }
        header.flags = header.flags.without(RecordFlags::STACK_BY_ID);
        let stack_id = header.stack_id;
        let frames = if view.frame_count() == 0 {
            // The common case: shared, not copied.
            Arc::clone(
                self.stacks
                    .get(&stack_id)
                    .ok_or(DecodeError::UnknownStack { stack_id })?,
            )
        } else {
            let frames: Arc<[u64]> = view.frames().collect();
            self.stacks.insert(stack_id, Arc::clone(&frames));
            frames
        };
        if usize::from(header.user_frame_count) > frames.len() {
            return Err(DecodeError::UserFrames {
                user_frame_count: header.user_frame_count,
                frame_count: u16::try_from(frames.len()).unwrap_or(u16::MAX),
            });
        }
        Ok(TraceRecord {
            header,
            frames,
            sample: None,
        })
    }
}

impl TraceRecord {
    /// The source that captured it.
    #[must_use]
    pub const fn source(&self) -> Source {
        self.header.facts.source()
    }

    /// The kernel frames, most recent call first.
    #[must_use]
    pub fn kernel_frames(&self) -> &[u64] {
        &self.frames[..self.frames.len() - self.user_frame_count()]
    }

    /// The user frames (the user part of the stack, below its system
    /// call), most recent call first.
    #[must_use]
    pub fn user_frames(&self) -> &[u64] {
        &self.frames[self.frames.len() - self.user_frame_count()..]
    }

    /// How many of the frames are user frames (never more than there are:
    /// decoding and [`StackMemory::resolve`] check it).
    fn user_frame_count(&self) -> usize {
        usize::from(self.header.user_frame_count).min(self.frames.len())
    }

    /// What the source knew, in words.
    #[must_use]
    pub fn facts_text(&self) -> String {
        match self.header.facts {
            SourceFacts::Process {
                event,
                process_id,
                parent_process_id,
            } => match event {
                Lifecycle::Create => format!("process {process_id} created by {parent_process_id}"),
                Lifecycle::Exit => format!("process {process_id} exited"),
            },
            SourceFacts::Thread {
                event,
                process_id,
                thread_id,
            } => {
                format!(
                    "thread {thread_id} of process {process_id} {}",
                    lifecycle_word(event)
                )
            }
            SourceFacts::ImageLoad {
                image_base,
                image_size,
                process_id,
            } => {
                format!(
                    "image at {image_base:#x} ({image_size:#x} bytes) into process {process_id}"
                )
            }
            SourceFacts::Registry { notify_class } => {
                format!("registry operation class {notify_class}")
            }
            SourceFacts::ObjectHandle {
                operation,
                object,
                desired_access,
                target_process_id,
            } => format!(
                "{} {} handle, access {desired_access:#x}, target process {target_process_id}",
                handle_operation_word(operation),
                object_word(object)
            ),
            SourceFacts::Timer => "timer sample".to_owned(),
            SourceFacts::OnDemand { tag } => format!("capture-now, tag {tag}"),
            SourceFacts::ThreadStack {
                target_process_id,
                target_thread_id,
                tag,
                delay,
                late,
            } => format!(
                "thread {target_thread_id} of process {target_process_id} on request, tag \
                 {tag}, {}{}",
                delay_text(delay),
                if late {
                    " (late: after the request's timeout)"
                } else {
                    ""
                }
            ),
        }
    }

    /// The readable block: two header lines (where and when; then the
    /// stack's ids and the source's facts), then one line per frame with its
    /// address and its name (see [`Symbolizer::name`]), or (`call_trace`) a
    /// single Sysmon style `CallTrace: a+0x1|b+0x2` line.
    #[must_use]
    pub fn to_text(&self, symbolizer: &Symbolizer, call_trace: bool) -> String {
        let mut out = String::new();
        let time =
            system_time_text(self.header.timestamp).unwrap_or_else(|| "time unknown".to_owned());
        let _ = write!(
            out,
            "#{} shard {} {} {time} pid {} tid {} cpu {} irql {}\n    stack {:016x} os-hash {:08x}: {}",
            self.header.sequence,
            self.header.shard,
            self.source().name(),
            self.header.process_id,
            self.header.thread_id,
            self.header.processor,
            self.header.irql,
            self.header.stack_id,
            self.header.os_hash,
            self.facts_text()
        );
        if self.header.flags.contains(RecordFlags::TRUNCATED) {
            out.push_str(" [truncated]");
        }
        if self.header.flags.contains(RecordFlags::NOT_IN_RING) {
            out.push_str(" [not kept in the ring]");
        }
        if self.header.user_part != UserPart::Off {
            let _ = write!(
                out,
                "; user part: {}",
                self.header.user_part.name().replace('_', " ")
            );
        }
        if self.header.flags.contains(RecordFlags::WOW64) {
            out.push_str(" [wow64]");
        }
        if let Some(facts) = self.sample {
            let _ = write!(
                out,
                "; sampled {}, {} CPU since its previous sample{}",
                facts.state_text(),
                cpu_time_text(facts.cpu_time),
                if facts.repeated {
                    " [repeated: not run since this stack was captured]"
                } else {
                    ""
                }
            );
        }
        out.push('\n');
        if call_trace {
            let _ = writeln!(out, "  CallTrace: {}", self.locations(symbolizer).join("|"));
            return out;
        }
        if self.stack_lost() {
            let _ = writeln!(out, "  {LOST_STACK}");
            return out;
        }
        let hidden = symbolizer.hidden_tracer_frames(self.kernel_frames());
        out.push_str(&tracer_frames_note(hidden));
        let kernel = self.kernel_frames().len() - hidden;
        let user_32_bit = self.shows_user_frames_as_32_bit();
        for (index, &frame) in self.frames[hidden..].iter().enumerate() {
            if index == kernel {
                out.push_str("  -- user mode --\n");
            }
            let address = if index >= kernel && user_32_bit {
                format!("{frame:#010x}        ")
            } else {
                format!("{frame:#018x}")
            };
            let process =
                (index >= kernel).then_some((self.header.process_id, self.header.timestamp));
            let name = match process {
                Some(_) => symbolizer.user_name(&self.header, frame),
                None => symbolizer.name(frame),
            };
            let Some(name) = name else {
                let _ = writeln!(out, "  {index:>2}  {}", address.trim_end());
                continue;
            };
            let (at, inlined) = source_text(&symbolizer.source(process, frame));
            let _ = writeln!(out, "  {index:>2}  {address}  {name}{at}");
            for call in inlined {
                let _ = writeln!(out, "          {call}");
            }
        }
        out
    }

    /// The kernel frames shown: without kstack.sys's at the top, unless
    /// `symbolizer` shows them (see [`Symbolizer::hidden_tracer_frames`]).
    #[must_use]
    pub fn shown_kernel_frames(&self, symbolizer: &Symbolizer) -> &[u64] {
        let kernel = self.kernel_frames();
        &kernel[symbolizer.hidden_tracer_frames(kernel)..]
    }

    /// Every frame shown, named: the kernel part after the kernel's
    /// modules, the user part after its process's (see
    /// [`Symbolizer::user_location`]).
    #[must_use]
    pub fn locations(&self, symbolizer: &Symbolizer) -> Vec<String> {
        if self.stack_lost() {
            return vec![LOST_STACK.to_owned()];
        }
        let mut locations = symbolizer.locations(self.shown_kernel_frames(symbolizer));
        locations.extend(symbolizer.user_locations(&self.header, self.user_frames()));
        locations
    }

    /// Whether the user part is a WoW64 process's 32-bit frames: every
    /// one below 4 GiB, so it fits `EVENT_EXTENDED_ITEM_STACK_TRACE32`'s
    /// `ULONG Address[]`.
    #[must_use]
    pub fn shows_user_frames_as_32_bit(&self) -> bool {
        self.header.flags.contains(RecordFlags::WOW64)
            && self
                .user_frames()
                .iter()
                .all(|&frame| u32::try_from(frame).is_ok())
    }

    /// One JSON line (schema version [`JSON_SCHEMA_VERSION`]).
    #[must_use]
    pub fn to_json(&self, symbolizer: &Symbolizer) -> Value {
        let mut flags = Vec::new();
        if self.header.flags.contains(RecordFlags::TRUNCATED) {
            flags.push("truncated");
        }
        if self.header.flags.contains(RecordFlags::NOT_IN_RING) {
            flags.push("not_in_ring");
        }
        if self.header.flags.contains(RecordFlags::WOW64) {
            flags.push("wow64");
        }
        if self.stack_lost() {
            flags.push("stack_lost");
        }
        json!({
            "schema": JSON_SCHEMA_VERSION,
            "sequence": self.header.sequence,
            "shard": self.header.shard,
            "source": self.source().name(),
            "time": system_time_text(self.header.timestamp),
            "system_time_100ns": self.header.timestamp,
            "process_id": self.header.process_id,
            "thread_id": self.header.thread_id,
            "processor": self.header.processor,
            "irql": self.header.irql,
            "flags": flags,
            "os_hash": format!("{:#010x}", self.header.os_hash),
            "stack_id": format!("{:#018x}", self.header.stack_id),
            "facts": facts_json(&self.header.facts),
            "tracer_frames": symbolizer.hidden_tracer_frames(self.kernel_frames()),
            "frames": Symbolizer::hex(self.shown_kernel_frames(symbolizer)),
            "locations": symbolizer.locations(self.shown_kernel_frames(symbolizer)),
            "source_lines": symbolizer.sources_json(None, self.shown_kernel_frames(symbolizer)),
            "user_part": self.header.user_part.name(),
            "user_frames": Symbolizer::hex(self.user_frames()),
            "user_locations": symbolizer.user_locations(&self.header, self.user_frames()),
            "user_source_lines": symbolizer.sources_json(
                Some((self.header.process_id, self.header.timestamp)),
                self.user_frames()
            ),
            "user_frames_32_bit": self.shows_user_frames_as_32_bit(),
            "sample": self.sample.map(|facts| json!({
                "state": facts.state.map(ThreadState::name),
                "wait_reason": (facts.state == Some(ThreadState::WAITING))
                    .then(|| facts.wait_reason.name()),
                "cpu_time_100ns": facts.cpu_time,
                "repeated": facts.repeated,
            })),
        })
    }
}

/// The line saying that `hidden` frames of kstack.sys's own were left out
/// at the top of a stack (none when none were).
#[must_use]
pub fn tracer_frames_note(hidden: usize) -> String {
    if hidden == 0 {
        return String::new();
    }
    if hidden == 1 {
        "  (1 kstack.sys frame hidden; --tracer-frames shows it)\n".to_owned()
    } else {
        format!("  ({hidden} kstack.sys frames hidden; --tracer-frames shows them)\n")
    }
}

const fn lifecycle_word(event: Lifecycle) -> &'static str {
    match event {
        Lifecycle::Create => "created",
        Lifecycle::Exit => "exited",
    }
}

const fn handle_operation_word(operation: HandleOperation) -> &'static str {
    match operation {
        HandleOperation::Create => "open",
        HandleOperation::Duplicate => "duplicate",
    }
}

const fn object_word(object: ObjectKind) -> &'static str {
    match object {
        ObjectKind::Process => "process",
        ObjectKind::Thread => "thread",
    }
}

/// A record's source facts as its JSON form shows them.
#[must_use]
pub fn facts_json(facts: &SourceFacts) -> Value {
    match *facts {
        SourceFacts::Process {
            event,
            process_id,
            parent_process_id,
        } => json!({
            "event": lifecycle_word(event), "process_id": process_id, "parent_process_id": parent_process_id
        }),
        SourceFacts::Thread {
            event,
            process_id,
            thread_id,
        } => json!({
            "event": lifecycle_word(event), "process_id": process_id, "thread_id": thread_id
        }),
        SourceFacts::ImageLoad {
            image_base,
            image_size,
            process_id,
        } => json!({
            "image_base": format!("{image_base:#x}"), "image_size": image_size, "process_id": process_id
        }),
        SourceFacts::Registry { notify_class } => json!({ "notify_class": notify_class }),
        SourceFacts::ObjectHandle {
            operation,
            object,
            desired_access,
            target_process_id,
        } => json!({
            "operation": handle_operation_word(operation),
            "object": object_word(object),
            "desired_access": format!("{desired_access:#x}"),
            "target_process_id": target_process_id,
        }),
        SourceFacts::Timer => json!({}),
        SourceFacts::OnDemand { tag } => json!({ "tag": tag }),
        SourceFacts::ThreadStack {
            target_process_id,
            target_thread_id,
            tag,
            delay,
            late,
        } => json!({
            "target_process_id": target_process_id,
            "target_thread_id": target_thread_id,
            "tag": tag,
            "delay_100ns": delay,
            "late": late,
        }),
    }
}

/// A thread-stack record's delay from its request, in words (the ABI's
/// 100 ns units, saturated at `u32::MAX`).
fn delay_text(delay: u32) -> String {
    let millis = f64::from(delay) / 10_000.0;
    if delay == u32::MAX {
        format!("at least {millis:.1} ms after the request")
    } else {
        format!("{millis:.1} ms after the request")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        clock::UNIX_EPOCH_AS_FILETIME,
        naming::{modules::ModuleMap, symbolizer::tests::with_dispatch},
    };

    fn no_modules() -> Symbolizer {
        Symbolizer::new(ModuleMap::default())
    }

    pub fn sample() -> TraceRecord {
        TraceRecord {
            header: RecordHeader {
                sequence: 7,
                timestamp: UNIX_EPOCH_AS_FILETIME + 17_637_984_010_000_000,
                process_id: 4,
                thread_id: 96,
                processor: 1,
                shard: 1,
                irql: 2,
                flags: RecordFlags::TRUNCATED,
                user_frame_count: 0,
                user_part: kstack_abi::UserPart::Off,
                os_hash: 0xDEAD_BEEF,
                stack_id: 0x0123_4567_89AB_CDEF,
                facts: SourceFacts::Timer,
            },
            frames: [0xFFFF_F800_1234_5678, 0xFFFF_F800_0000_1000].into(),
            sample: None,
        }
    }

    #[test]
    fn text_has_header_and_numbered_frames() {
        let text = sample().to_text(&no_modules(), false);
        assert_eq!(
            text,
            "#7 shard 1 timer 2025-11-22T08:00:01Z pid 4 tid 96 cpu 1 irql 2\n    stack 0123456789abcdef \
             os-hash deadbeef: timer sample [truncated]\n   0  0xfffff80012345678\n   1  0xfffff80000001000\n"
        );
    }

    #[test]
    fn frames_inside_modules_are_named_and_the_tracers_own_shown_on_request() {
        let modules = ModuleMap::new([crate::naming::modules::Module {
            base: 0xFFFF_F800_1230_0000,
            size: 0x10_0000,
            name: "kstack.sys".to_owned(),
        }]);
        let shown = Symbolizer::new(modules.clone()).showing_tracer_frames();
        let text = sample().to_text(&shown, false);
        assert!(
            text.ends_with(
                "   0  0xfffff80012345678  kstack.sys+0x45678\n   1  0xfffff80000001000\n"
            ),
            "{text}"
        );
        let trace = sample().to_text(&shown, true);
        assert!(
            trace.ends_with("\n  CallTrace: kstack.sys+0x45678|0xfffff80000001000\n"),
            "{trace}"
        );
        let value = sample().to_json(&shown);
        assert_eq!(
            value["locations"],
            json!(["kstack.sys+0x45678", "0xfffff80000001000"])
        );
        assert_eq!(value["tracer_frames"], 0);
        // By default the stack starts below kstack.sys's frames at its top;
        // the record itself keeps them.
        let hidden = Symbolizer::new(modules);
        let text = sample().to_text(&hidden, false);
        assert!(
            text.ends_with(
                ": timer sample [truncated]\n  (1 kstack.sys frame hidden; --tracer-frames shows \
                 it)\n   0  0xfffff80000001000\n"
            ),
            "{text}"
        );
        let trace = sample().to_text(&hidden, true);
        assert!(
            trace.ends_with("\n  CallTrace: 0xfffff80000001000\n"),
            "{trace}"
        );
        let value = sample().to_json(&hidden);
        assert_eq!(value["frames"], json!(["0xfffff80000001000"]));
        assert_eq!(value["locations"], json!(["0xfffff80000001000"]));
        assert_eq!(value["tracer_frames"], 1);
        assert_eq!(
            value["stack_id"], "0x0123456789abcdef",
            "the id is the whole stack's"
        );
        // Only the run at the top: a kstack.sys frame further down stays.
        let mut record = sample();
        record.frames = [0xFFFF_F800_0000_1000, 0xFFFF_F800_1234_5678].into();
        assert_eq!(
            record.locations(&hidden),
            ["0xfffff80000001000", "kstack.sys+0x45678"]
        );
    }

    #[test]
    fn function_names_reach_every_rendering() {
        let (symbolizer, _) = with_dispatch();
        let mut record = sample();
        record.frames = [
            crate::naming::symbolizer::tests::DISPATCH + 0x4F,
            0xFFFF_F800_0000_1000,
            0x42,
        ]
        .into();
        let text = record.to_text(&symbolizer, false);
        assert!(
            text.ends_with(
                "   0  0xfffff8012340104f  kstack.sys!kstack::dispatch::dispatch+0x4f\n   \
                 1  0xfffff80000001000  ntoskrnl.exe+0x1000\n   2  0x0000000000000042\n"
            ),
            "{text}"
        );
        let trace = record.to_text(&symbolizer, true);
        assert!(
            trace.ends_with(
                "\n  CallTrace: kstack.sys!kstack::dispatch::dispatch+0x4f|ntoskrnl.exe+0x1000|0x42\n"
            ),
            "{trace}"
        );
        assert_eq!(
            record.to_json(&symbolizer)["locations"],
            json!([
                "kstack.sys!kstack::dispatch::dispatch+0x4f",
                "ntoskrnl.exe+0x1000",
                "0x42"
            ])
        );
    }

    #[test]
    fn json_line_has_the_documented_fields() {
        let value = sample().to_json(&no_modules());
        assert_eq!(value["schema"], 5);
        assert_eq!(
            value["tracer_frames"], 0,
            "no kstack.sys in the module list"
        );
        assert_eq!(
            (&value["sequence"], &value["shard"]),
            (&json!(7), &json!(1))
        );
        assert_eq!(value["source"], "timer");
        assert_eq!(value["stack_id"], "0x0123456789abcdef");
        assert_eq!(value["os_hash"], "0xdeadbeef");
        assert_eq!(value["flags"], json!(["truncated"]));
        assert_eq!(
            value["frames"],
            json!(["0xfffff80012345678", "0xfffff80000001000"])
        );
        assert_eq!(value["time"], "2025-11-22T08:00:01Z");
        assert_eq!(value["user_part"], "off");
        assert_eq!(value["user_frames"], json!([]));
        assert_eq!(value["user_frames_32_bit"], false);
        assert_eq!(value["sample"], Value::Null);
    }

    #[test]
    fn a_samples_facts_are_shown_and_in_its_json() {
        let mut record = sample();
        record.sample = Some(SampleFacts {
            state: Some(ThreadState::WAITING),
            wait_reason: crate::thread_list::WaitReason(6),
            cpu_time: 125_000,
            repeated: true,
        });
        let text = record.to_text(&no_modules(), false);
        assert!(
            text.contains(
                "; sampled waiting (UserRequest), 12.5 ms CPU since its previous sample \
                 [repeated: not run since this stack was captured]\n"
            ),
            "{text}"
        );
        assert_eq!(
            record.to_json(&no_modules())["sample"],
            json!({"state": "waiting", "wait_reason": "UserRequest", "cpu_time_100ns": 125_000,
                   "repeated": true})
        );
    }

    /// A registry record with two kernel frames and two user frames.
    fn with_user_part(flags: RecordFlags, user: [u64; 2]) -> TraceRecord {
        let mut record = sample();
        record.header.facts = SourceFacts::Registry { notify_class: 1 };
        record.header.flags = flags;
        record.header.user_frame_count = 2;
        record.header.user_part = UserPart::Captured;
        record.frames = [
            0xFFFF_F800_1234_5678,
            0xFFFF_F800_0000_1000,
            user[0],
            user[1],
        ]
        .into();
        record
    }

    #[test]
    fn user_frames_follow_a_boundary_and_have_their_own_json_array() {
        let record = with_user_part(RecordFlags::NONE, [0x7FF6_1234_0010, 0x7FFE_0000_2000]);
        assert_eq!(
            record.kernel_frames(),
            [0xFFFF_F800_1234_5678, 0xFFFF_F800_0000_1000]
        );
        assert_eq!(record.user_frames(), [0x7FF6_1234_0010, 0x7FFE_0000_2000]);
        let text = record.to_text(&no_modules(), false);
        assert!(
            text.ends_with(
                "registry operation class 1; user part: captured\n   0  0xfffff80012345678\n   \
                 1  0xfffff80000001000\n  -- user mode --\n   2  0x00007ff612340010\n   \
                 3  0x00007ffe00002000\n"
            ),
            "{text}"
        );
        let value = record.to_json(&no_modules());
        assert_eq!(
            value["frames"],
            json!(["0xfffff80012345678", "0xfffff80000001000"])
        );
        assert_eq!(
            value["user_frames"],
            json!(["0x7ff612340010", "0x7ffe00002000"])
        );
        assert_eq!(
            value["user_locations"],
            json!(["0x7ff612340010", "0x7ffe00002000"])
        );
        assert_eq!(value["user_part"], "captured");
        assert!(!record.shows_user_frames_as_32_bit());
    }

    #[test]
    fn user_frames_are_named_after_their_own_process_modules() {
        let record = with_user_part(RecordFlags::NONE, [0x7FF6_1234_0010, 0x7FFE_0000_2000]);
        let mut processes = crate::naming::process_modules::ProcessModules::default();
        let module = |base, name: &str| crate::naming::modules::Module {
            base,
            size: 0x1_0000,
            name: name.to_owned(),
        };
        // The record's process (pid 4), and another with another image
        // where the record's frame is.
        processes.add(4, [module(0x7FF6_1234_0000, "kstack.exe")]);
        processes.add(8, [module(0x7FFE_0000_0000, "other.dll")]);
        let symbolizer = no_modules().with_processes(processes);
        let text = record.to_text(&symbolizer, false);
        assert!(
            text.ends_with(
                "-- user mode --\n   2  0x00007ff612340010  kstack.exe+0x10\n   \
                 3  0x00007ffe00002000\n"
            ),
            "{text}"
        );
        assert_eq!(
            record.to_json(&symbolizer)["user_locations"],
            json!(["kstack.exe+0x10", "0x7ffe00002000"])
        );
        assert!(record.to_text(&symbolizer, true).ends_with(
            "CallTrace: 0xfffff80012345678|0xfffff80000001000|kstack.exe+0x10|0x7ffe00002000\n"
        ));
    }

    #[test]
    fn a_wow64_user_part_below_4_gib_is_shown_32_bit() {
        let record = with_user_part(RecordFlags::WOW64, [0x0040_1000, 0x7700_2000]);
        assert!(record.shows_user_frames_as_32_bit());
        let text = record.to_text(&no_modules(), false);
        assert!(text.contains("user part: captured [wow64]\n"), "{text}");
        assert!(
            text.ends_with("-- user mode --\n   2  0x00401000\n   3  0x77002000\n"),
            "{text}"
        );
        let value = record.to_json(&no_modules());
        assert_eq!(value["flags"], json!(["wow64"]));
        assert_eq!(value["user_frames_32_bit"], true);
        // 64-bit frames of the WoW64 layer are not 32-bit frames.
        let layer = with_user_part(RecordFlags::WOW64, [0x0040_1000, 0x7FFE_0000_2000]);
        assert!(!layer.shows_user_frames_as_32_bit());
    }

    #[test]
    fn every_source_has_words_and_json_facts() {
        let all = [
            SourceFacts::Process {
                event: Lifecycle::Create,
                process_id: 8,
                parent_process_id: 4,
            },
            SourceFacts::Thread {
                event: Lifecycle::Exit,
                process_id: 8,
                thread_id: 12,
            },
            SourceFacts::ImageLoad {
                image_base: 0x1000,
                image_size: 0x2000,
                process_id: 0,
            },
            SourceFacts::Registry { notify_class: 3 },
            SourceFacts::ObjectHandle {
                operation: HandleOperation::Duplicate,
                object: ObjectKind::Thread,
                desired_access: 0x40,
                target_process_id: 8,
            },
            SourceFacts::Timer,
            SourceFacts::OnDemand { tag: 5 },
            SourceFacts::ThreadStack {
                target_process_id: 8,
                target_thread_id: 12,
                tag: 5,
                delay: 1,
                late: true,
            },
        ];
        for facts in all {
            let mut record = sample();
            record.header.facts = facts;
            assert!(!record.facts_text().is_empty());
            assert!(record.to_json(&no_modules())["facts"].is_object());
        }
        let mut create = sample();
        create.header.facts = all[0];
        assert_eq!(create.facts_text(), "process 8 created by 4");
    }

    #[test]
    fn a_thread_stack_record_says_which_thread_and_when() {
        let mut record = sample();
        let facts = |delay, late| SourceFacts::ThreadStack {
            target_process_id: 8,
            target_thread_id: 12,
            tag: 5,
            delay,
            late,
        };
        record.header.facts = facts(12_345, false);
        assert_eq!(
            record.facts_text(),
            "thread 12 of process 8 on request, tag 5, 1.2 ms after the request"
        );
        assert_eq!(
            record.to_json(&no_modules())["facts"],
            json!({
                "target_process_id": 8, "target_thread_id": 12, "tag": 5, "delay_100ns": 12_345,
                "late": false,
            })
        );
        record.header.facts = facts(u32::MAX, true);
        assert_eq!(
            record.facts_text(),
            "thread 12 of process 8 on request, tag 5, at least 429496.7 ms after the request \
             (late: after the request's timeout)"
        );
    }
}
