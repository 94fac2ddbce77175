//! Draws a [`LiveTop`] into a ratatui frame: a title line with the sort,
//! filter and keys, a table of rows with their top frames, and the status
//! line.

use ratatui::{
    Frame,
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Text,
    widgets::{Cell, Paragraph, Row as TableRow, Table},
};

use super::model::LiveTop;
use crate::{capture::stack_table::TopLimits, naming::symbolizer::Symbolizer};

/// The keys, as the title line lists them.
const KEYS: &str = "r/c/s sort, f source, space pause, q quit";

/// Draws `model` over the whole frame: at most `limits.stacks` rows, each
/// with its first `limits.frames` frames (at least one line per row).
pub fn draw(frame: &mut Frame<'_>, model: &LiveTop, symbolizer: &Symbolizer, limits: TopLimits) {
    let [title_area, table_area, status_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let title = format!(
        "kstack top --live | sort {} | {} | {KEYS}",
        model.sort().name(),
        model.filter().describe(),
    );
    frame.render_widget(Paragraph::new(title), title_area);

    let right = |text: &'static str| Cell::new(Text::from(text).right_aligned());
    let header = TableRow::new([
        right("rate/s"),
        right("window/s"),
        right("count"),
        Cell::new("source"),
        Cell::new("stack"),
        Cell::new("top frames"),
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    let rows = model.rows().into_iter().take(limits.stacks).map(|row| {
        // Each frame with its source line, then the calls inlined there.
        let lines: Vec<String> = row
            .stack
            .frame_texts(symbolizer)
            .into_iter()
            .take(limits.frames)
            .flat_map(|frame| {
                core::iter::once(frame.line)
                    .chain(frame.inlined.into_iter().map(|call| format!("    {call}")))
            })
            .collect();
        let height = u16::try_from(lines.len().max(1)).unwrap_or(u16::MAX);
        TableRow::new([
            Cell::new(Text::from(format!("{:.1}", row.rate)).right_aligned()),
            Cell::new(Text::from(format!("{:.1}", row.window_rate)).right_aligned()),
            Cell::new(Text::from(row.count.to_string()).right_aligned()),
            Cell::new(row.source.name()),
            Cell::new(format!("{:016x}", row.stack.stack_id)),
            Cell::new(Text::from(lines.join("\n"))),
        ])
        .height(height)
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
        // The longest source name, `threadstack`.
        Constraint::Length(11),
        Constraint::Length(16),
        Constraint::Fill(1),
    ];
    frame.render_widget(Table::new(rows, widths).header(header), table_area);

    frame.render_widget(
        Paragraph::new(model.status_line()).style(Style::new().add_modifier(Modifier::REVERSED)),
        status_area,
    );
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::{
        device::test_support::sample_status,
        live_top::model::{
            Filter, SortKey,
            tests::{LEAF, ROOT, ondemand, timer, view},
        },
        naming::modules::tests::sample_map,
    };

    /// A stack's id as the view prints it.
    fn id(frames: &[u64]) -> String {
        format!("{:016x}", kstack_abi::stack_id(frames))
    }

    /// The screen's lines, trailing spaces cut.
    fn drawn(model: &LiveTop, limits: TopLimits, width: u16, height: u16) -> Vec<String> {
        let symbolizer = Symbolizer::new(sample_map()).showing_tracer_frames();
        drawn_named(model, limits, (width, height), &symbolizer)
    }

    /// [`drawn`], frames named by `symbolizer`.
    fn drawn_named(
        model: &LiveTop,
        limits: TopLimits,
        (width, height): (u16, u16),
        symbolizer: &Symbolizer,
    ) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal
            .draw(|frame| draw(frame, model, symbolizer, limits))
            .unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_view_shows_the_title_rows_with_frames_and_the_status_line() {
        let start = Instant::now();
        let mut model = view(start);
        let stack = timer(&[LEAF, ROOT, 0x42]);
        model.apply(&vec![stack.clone(); 3]);
        model.tick(start + Duration::from_secs(1));
        model.apply(&[stack, ondemand(&[0x42])]);
        model.set_driver_status(&sample_status());
        model.tick(start + Duration::from_secs(2));
        let limits = TopLimits {
            stacks: 5,
            frames: 2,
        };
        assert_eq!(
            drawn(&model, limits, 100, 8),
            [
                "kstack top --live | sort rate | sources all, pid all | r/c/s sort, f source, space pause, q quit",
                "  rate/s window/s     count source      stack            top frames",
                &format!(
                    "     1.0      2.0         4 timer       {} kstack.sys+0x10",
                    id(&[LEAF, ROOT, 0x42])
                ),
                "                                                         ntoskrnl.exe+0x20",
                &format!(
                    "     1.0      0.5         1 ondemand    {} 0x42",
                    id(&[0x42])
                ),
                "",
                "",
                "ring 3 records in 1/8 KiB, 0 dropped (0 since start), 6 read | here: 5 records, 2 unique stacks",
            ]
        );
    }

    #[test]
    fn the_view_keeps_to_its_limits_and_says_when_paused() {
        let start = Instant::now();
        let mut model = view(start);
        model.apply(&vec![timer(&[LEAF, ROOT, 0x42]); 3]);
        model.apply(&[ondemand(&[0x42])]);
        model.tick(start + Duration::from_secs(1));
        model.sort_by(SortKey::Count);
        model.set_filter(model.filter().next_source());
        model.toggle_pause();
        let limits = TopLimits {
            stacks: 1,
            frames: 1,
        };
        let lines = drawn(&model, limits, 110, 5);
        assert_eq!(
            lines[0],
            "kstack top --live | sort count | sources process, pid all | r/c/s sort, f source, space pause, q quit"
        );
        assert_eq!(lines[2..4], ["", ""], "no timer or ondemand rows");
        assert_eq!(
            lines[4],
            "no status from the driver yet | here: 4 records, 2 unique stacks | PAUSED"
        );
        model.set_filter(Filter::default());
        let lines = drawn(&model, limits, 110, 5);
        assert_eq!(
            lines[2..4],
            [
                format!(
                    "     3.0      3.0         3 timer       {} kstack.sys+0x10",
                    id(&[LEAF, ROOT, 0x42])
                ),
                String::new()
            ],
            "one row, one frame"
        );
    }

    #[test]
    fn frames_show_their_source_lines_and_inlined_calls() {
        let start = Instant::now();
        let mut model = view(start);
        model.apply(&[timer(&[LEAF, ROOT])]);
        model.tick(start + Duration::from_secs(1));
        let symbolizer = Symbolizer::new(sample_map())
            .showing_tracer_frames()
            .with_functions(Box::new(crate::capture::stack_table::tests::Inlining));
        let limits = TopLimits {
            stacks: 1,
            frames: 1,
        };
        let lines = drawn_named(&model, limits, (110, 6), &symbolizer);
        assert_eq!(
            lines[2..5],
            [
                format!("     1.0      1.0         1 timer       {} kstack.sys!f+0x0 at f.rs:1", id(&[LEAF, ROOT])),
                "                                                             inlined middle at f.rs:2".to_owned(),
                "                                                             inlined innermost at f.rs:3".to_owned(),
            ],
            "one frame, with its two inlined calls"
        );
    }
}
