//! `--on-cpu`, `--off-cpu` and `--state`: which records an analysis
//! counts, by what their thread was doing when `kstack sample` listed it.
//! A record without a thread state (another source's, or a sample listed
//! without one) is counted by none of them, so over one capture
//! `on-CPU + off-CPU + without a state = every record`.

use crate::{capture::trace::TraceRecord, thread_list::ThreadState};

/// Which samples are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    /// The thread was running.
    OnCpu,
    /// The thread was not running: waiting, ready, or any other state.
    OffCpu,
    /// The thread was in this state.
    State(ThreadState),
}

impl StateFilter {
    /// Whether `record` is counted.
    #[must_use]
    pub fn admits(self, record: &TraceRecord) -> bool {
        let Some(state) = record.sample.and_then(|facts| facts.state) else {
            return false;
        };
        match self {
            Self::OnCpu => state.on_cpu(),
            Self::OffCpu => !state.on_cpu(),
            Self::State(wanted) => state == wanted,
        }
    }

    /// The option as given: `--on-cpu`, `--off-cpu`, `--state waiting`.
    #[must_use]
    pub fn option_text(self) -> String {
        match self {
            Self::OnCpu => "--on-cpu".to_owned(),
            Self::OffCpu => "--off-cpu".to_owned(),
            Self::State(state) => format!("--state {}", state.name()),
        }
    }
}

/// What a filter counted and left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterCounts {
    /// Records counted.
    pub counted: u64,
    /// Samples with a state the filter does not take.
    pub other_states: u64,
    /// Records without a thread state.
    pub without_state: u64,
}

impl FilterCounts {
    /// Counts `record` under `filter`; says whether it is counted.
    pub fn note(&mut self, filter: StateFilter, record: &TraceRecord) -> bool {
        let counted = filter.admits(record);
        if counted {
            self.counted += 1;
        } else if record.sample.and_then(|facts| facts.state).is_some() {
            self.other_states += 1;
        } else {
            self.without_state += 1;
        }
        counted
    }

    /// The note on stderr: `--off-cpu: 80 of 300 records counted; 120
    /// samples in other states and 100 records without a thread state left
    /// out`.
    #[must_use]
    pub fn text(&self, filter: StateFilter) -> String {
        format!(
            "{}: {} of {} records counted; {} samples in other states and {} records without a \
             thread state (not `kstack sample`'s, or listed without one) left out",
            filter.option_text(),
            self.counted,
            self.counted + self.other_states + self.without_state,
            self.other_states,
            self.without_state
        )
    }
}

#[cfg(test)]
mod tests {
    use kstack_abi::SourceFacts;

    use super::*;
    use crate::capture::writer::tests::{record, sampled, thread_stack};

    fn sample(state: Option<ThreadState>) -> TraceRecord {
        sampled(thread_stack(1, 8, &[1]), state, 0)
    }

    #[test]
    fn on_and_off_cpu_partition_the_samples_with_a_state() {
        let records = [
            sample(Some(ThreadState::RUNNING)),
            sample(Some(ThreadState::WAITING)),
            sample(Some(ThreadState::READY)),
            sample(None),
            record(2, SourceFacts::Timer, &[2]),
        ];
        let count = |filter| {
            let mut counts = FilterCounts::default();
            for record in &records {
                counts.note(filter, record);
            }
            counts
        };
        let on = count(StateFilter::OnCpu);
        let off = count(StateFilter::OffCpu);
        assert_eq!((on.counted, off.counted), (1, 2));
        assert_eq!(on.counted + off.counted + on.without_state, 5);
        assert_eq!(count(StateFilter::State(ThreadState::READY)).counted, 1);
        assert_eq!(
            off.text(StateFilter::OffCpu),
            "--off-cpu: 2 of 5 records counted; 1 samples in other states and 2 records without \
             a thread state (not `kstack sample`'s, or listed without one) left out"
        );
    }
}
