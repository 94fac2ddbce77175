//! Text that fits: lines longer than the width are wrapped at spaces, each
//! continuation indented four columns past its line's own indentation, so a
//! block still reads as one. The width is the terminal's when the text goes
//! to one, else [`DEFAULT_WIDTH`] (a file, a pipe, a test). Machine formats
//! (JSON lines, folded stacks, CallTrace lines) are never wrapped; a word
//! too long for any line (a long path or function name) stays where it is,
//! unbroken.

use std::io::IsTerminal as _;

/// The width when the output is not a terminal.
pub const DEFAULT_WIDTH: usize = 100;

/// Where text goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// The width text sent to `stream` must fit.
#[must_use]
pub fn width(stream: Stream) -> usize {
    let terminal = match stream {
        Stream::Stdout => std::io::stdout().is_terminal(),
        Stream::Stderr => std::io::stderr().is_terminal(),
    };
    if !terminal {
        return DEFAULT_WIDTH;
    }
    ratatui::crossterm::terminal::size()
        .ok()
        .map(|(columns, _)| usize::from(columns))
        .filter(|&columns| columns >= 20)
        .unwrap_or(DEFAULT_WIDTH)
}

/// `text` with every line fitted to `width` columns (see the module).
#[must_use]
pub fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 16);
    for line in text.split_inclusive('\n') {
        let (line, newline) = match line.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (line, ""),
        };
        fit_line(line, width, &mut out);
        out.push_str(newline);
    }
    out
}

/// A record's CallTrace line (`--call-trace`): one line by design, as
/// Sysmon writes it.
const CALL_TRACE: &str = "  CallTrace: ";

/// One line, wrapped into `out` without a final newline. Spaces between
/// words on one output line are kept as they were (columns stay aligned).
fn fit_line(line: &str, width: usize, out: &mut String) {
    if line.chars().count() <= width || line.starts_with(CALL_TRACE) {
        out.push_str(line);
        return;
    }
    let indent = line.len() - line.trim_start_matches(' ').len();
    let continuation = " ".repeat(indent + 4);
    out.push_str(&line[..indent]);
    let mut column = indent;
    let mut rest = &line[indent..];
    let mut first_word = true;
    while !rest.is_empty() {
        let spaces = rest.len() - rest.trim_start_matches(' ').len();
        let (gap, after) = rest.split_at(spaces);
        let end = after.find(' ').unwrap_or(after.len());
        let (word, tail) = after.split_at(end);
        rest = tail;
        if word.is_empty() {
            break;
        }
        let length = word.chars().count();
        // A word that would not fit a continuation line either stays here:
        // moving it would only leave its line's start alone.
        let fits_below = continuation.len() + length <= width;
        if !first_word && column + gap.len() + length > width && fits_below {
            out.push('\n');
            out.push_str(&continuation);
            column = continuation.len();
        } else {
            out.push_str(gap);
            column += gap.len();
        }
        out.push_str(word);
        column += length;
        first_word = false;
    }
}

/// [`fit`] to standard error's width, printed there.
pub fn eprint_fitted(text: &str) {
    eprint!("{}", fit(text, width(Stream::Stderr)));
}

/// `eprintln!`, fitted to standard error's width: every message kstack
/// writes there goes through it.
#[macro_export]
macro_rules! eprintln_fitted {
    ($($arg:tt)*) => {
        $crate::output::width::eprint_fitted(&format!("{}\n", format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_wrap_at_spaces_under_their_own_indentation() {
        assert_eq!(fit("short\n", 10), "short\n");
        assert_eq!(
            fit("  CallTrace: a+0x1|b+0x2\n", 10),
            "  CallTrace: a+0x1|b+0x2\n"
        );
        assert_eq!(
            fit("alpha beta gamma delta\n  one two three four\nx", 12),
            "alpha beta\n    gamma\n    delta\n  one two\n      three\n      four\nx"
        );
        // A word too long for any line stays where it is, unbroken; the
        // spaces a break replaces go, the others stay.
        assert_eq!(
            fit("see \\Device\\HarddiskVolume3\\Windows  now", 10),
            "see \\Device\\HarddiskVolume3\\Windows\n    now"
        );
        assert_eq!(
            fit(
                "   2  kstack.sys!kstack_driver_core::capture::DriverCore::capture+0xca",
                40
            ),
            "   2  kstack.sys!kstack_driver_core::capture::DriverCore::capture+0xca"
        );
        let text = "word ".repeat(60);
        assert!(
            fit(&text, DEFAULT_WIDTH)
                .lines()
                .all(|line| line.chars().count() <= DEFAULT_WIDTH)
        );
    }

    #[test]
    fn off_a_terminal_the_width_is_100() {
        // The tests' output is captured, not a terminal.
        if !std::io::stdout().is_terminal() {
            assert_eq!(width(Stream::Stdout), 100);
        }
    }
}
