//! Flamegraph SVGs, drawn by inferno from kstack's folded stacks.

use std::io::Write;

use inferno::flamegraph::{self, Options};

/// Draws `folded` lines (see `StackTable::folded`) as an interactive SVG.
///
/// Colors come from a hash of each frame's name, so the same capture draws
/// the same picture every time.
///
/// # Errors
/// inferno's error: an I/O error of `out`, or no valid line in `folded`.
pub fn write_svg(folded: &[String], title: &str, out: impl Write) -> std::io::Result<()> {
    let mut options = Options::default();
    title.clone_into(&mut options.title);
    "records".clone_into(&mut options.count_name);
    "Frame:".clone_into(&mut options.name_type);
    options.hash = true;
    options.deterministic = true;
    flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svg(folded: &[&str]) -> std::io::Result<String> {
        let lines: Vec<String> = folded.iter().map(|&line| line.to_owned()).collect();
        let mut out = Vec::new();
        write_svg(&lines, "kstack test", &mut out)?;
        Ok(String::from_utf8(out).expect("inferno writes UTF-8"))
    }

    #[test]
    fn frames_and_counts_appear_in_the_svg() {
        let svg = svg(&[
            "timer;ntoskrnl.exe+0x20;kstack.sys+0x10 3",
            "ondemand;0x42 1",
        ])
        .unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(svg.contains("kstack test"));
        for frame in [
            "kstack.sys+0x10",
            "ntoskrnl.exe+0x20",
            "timer",
            "ondemand",
            "0x42",
        ] {
            assert!(svg.contains(frame), "{frame} missing");
        }
        assert!(svg.contains("3 records"), "counts are named records");
    }

    #[test]
    fn the_same_stacks_draw_the_same_svg() {
        let lines = ["timer;a+0x1;b+0x2 5", "timer;a+0x1;c+0x3 2"];
        assert_eq!(svg(&lines).unwrap(), svg(&lines).unwrap());
    }

    #[test]
    fn no_stacks_is_an_error() {
        assert!(svg(&[]).is_err());
    }
}
