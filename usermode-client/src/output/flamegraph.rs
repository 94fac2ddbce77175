//! Flamegraph SVGs, drawn by inferno from kstack's folded stacks.

use std::io::Write;

use inferno::flamegraph::{
    self, Options,
    color::{BasicPalette, Palette},
};

/// What the graph draws: which palette it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drawn {
    /// Any stacks: inferno's `hot` palette.
    Stacks,
    /// Only off-CPU samples: inferno's `io` palette on a blue background,
    /// the off-CPU flame graph's colors (FlameGraph's `--colors=io`).
    OffCpu,
}

/// Draws `folded` lines (see `StackTable::folded`) as an interactive SVG.
///
/// Colors come from a hash of each frame's name, so the same capture draws
/// the same picture every time.
///
/// # Errors
/// inferno's error: an I/O error of `out`, or no valid line in `folded`.
pub fn write_svg(
    folded: &[String],
    title: &str,
    drawn: Drawn,
    out: impl Write,
) -> std::io::Result<()> {
    let mut options = Options::default();
    if drawn == Drawn::OffCpu {
        // inferno gives this palette its blue background by default.
        options.colors = Palette::Basic(BasicPalette::Io);
        options.bgcolors = None;
    }
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
        write_svg(&lines, "kstack test", Drawn::Stacks, &mut out)?;
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
    fn off_cpu_graphs_take_the_io_palette_on_blue() {
        let lines = vec!["threadstack;off-cpu;a+0x1;b+0x2 5".to_owned()];
        let draw = |drawn| {
            let mut out = Vec::new();
            write_svg(&lines, "t", drawn, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let (hot, off_cpu) = (draw(Drawn::Stacks), draw(Drawn::OffCpu));
        assert_ne!(hot, off_cpu);
        // inferno's blue background gradient, and frames on the io
        // palette's blue (its blue component the largest).
        assert!(off_cpu.contains("#e0e0ff"), "no blue background");
        assert!(!hot.contains("#e0e0ff"));
    }

    #[test]
    fn no_stacks_is_an_error() {
        assert!(svg(&[]).is_err());
    }
}
