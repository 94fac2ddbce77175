//! Flamegraph SVGs, drawn by inferno from kstack's folded stacks.

use std::io::Write;

use inferno::flamegraph::{
    self, Options,
    color::{BasicPalette, Palette, PaletteMap},
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

/// The frame folded stacks put after the source of an off-CPU sample.
const OFF_CPU: &str = "off-cpu";
/// What the off-CPU part of a mixed graph's frame names end with: an
/// annotation inferno leaves out of every label and title (its `_[w]`,
/// FlameGraph's waker annotation), so its frames are colored apart from
/// the same functions on CPU while showing the same names.
const OFF_CPU_ANNOTATION: &str = "_[w]";

/// Draws `folded` lines (see `StackTable::folded`) as an interactive SVG.
///
/// Colors come from a hash of each frame's name, so the same capture draws
/// the same picture every time. In a graph of any stacks, the frames of
/// off-CPU samples (from their `off-cpu` frame up) take inferno's `io`
/// palette, the rest its `hot` one.
///
/// # Errors
/// inferno's error: an I/O error of `out`, or no valid line in `folded`.
pub fn write_svg(
    folded: &[String],
    title: &str,
    drawn: Drawn,
    out: impl Write,
) -> std::io::Result<()> {
    let mut options = graph_options(title);
    if drawn == Drawn::OffCpu {
        // inferno gives this palette its blue background by default.
        options.colors = Palette::Basic(BasicPalette::Io);
        options.bgcolors = None;
        return flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), out);
    }
    let lines: Vec<String> = folded.iter().map(|line| annotated_off_cpu(line)).collect();
    let off_cpu: Vec<&str> = lines
        .iter()
        .filter(|line| line.contains(OFF_CPU_ANNOTATION))
        .map(String::as_str)
        .collect();
    if off_cpu.is_empty() {
        return flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out);
    }
    // inferno colors each frame by its name from a palette map when it has
    // one, filling it as it draws: drawn first in the io palette, the
    // off-CPU frames' names hold io colors, which the whole graph then
    // keeps.
    let mut drawn_off_cpu = PaletteMap::default();
    let mut off_options = graph_options(title);
    off_options.colors = Palette::Basic(BasicPalette::Io);
    off_options.palette_map = Some(&mut drawn_off_cpu);
    flamegraph::from_lines(&mut off_options, off_cpu, std::io::sink())?;
    // The frames below `off-cpu` (the source) are shared: hot, like the rest.
    let mut palette = PaletteMap::default();
    for (name, color) in drawn_off_cpu.iter() {
        if name.ends_with(OFF_CPU_ANNOTATION) {
            palette.insert(name, color);
        }
    }
    options.palette_map = Some(&mut palette);
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

/// `line` with every frame from its `off-cpu` frame up annotated
/// ([`OFF_CPU_ANNOTATION`]); other lines as they are.
fn annotated_off_cpu(line: &str) -> String {
    let Some((path, count)) = line.rsplit_once(' ') else {
        return line.to_owned();
    };
    let frames: Vec<&str> = path.split(';').collect();
    let Some(from) = frames.iter().position(|&frame| frame == OFF_CPU) else {
        return line.to_owned();
    };
    let mut annotated: Vec<String> = frames[..from]
        .iter()
        .map(|&frame| frame.to_owned())
        .collect();
    annotated.extend(
        frames[from..]
            .iter()
            .map(|frame| format!("{frame}{OFF_CPU_ANNOTATION}")),
    );
    format!("{} {count}", annotated.join(";"))
}

/// The options every graph is drawn with.
fn graph_options(title: &str) -> Options<'static> {
    let mut options = Options::default();
    title.clone_into(&mut options.title);
    "records".clone_into(&mut options.count_name);
    "Frame:".clone_into(&mut options.name_type);
    options.hash = true;
    options.deterministic = true;
    options
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

    /// The fill of the first frame whose title starts with `title`.
    fn fill(svg: &str, title: &str) -> (u8, u8, u8) {
        let at = svg
            .find(&format!("<title>{title}"))
            .unwrap_or_else(|| panic!("no frame {title}"));
        let rgb = &svg[at..];
        let rgb = &rgb[rgb.find("fill=\"rgb(").unwrap() + 10..];
        let parts: Vec<u8> = rgb[..rgb.find(')').unwrap()]
            .split(',')
            .map(|part| part.trim().parse().unwrap())
            .collect();
        (parts[0], parts[1], parts[2])
    }

    #[test]
    fn a_mixed_graph_draws_off_cpu_frames_blue_and_the_rest_hot() {
        let svg = svg(&[
            "threadstack;on-cpu;nt!Compute;nt!Inner 3",
            "threadstack;off-cpu;nt!Compute;nt!Wait 2",
        ])
        .unwrap();
        let blue = |(red, _, blue): (u8, u8, u8)| blue > red;
        // The same function, on and off CPU: told apart by its count.
        assert!(!blue(fill(&svg, "nt!Compute (3 records")), "on-CPU: hot");
        assert!(blue(fill(&svg, "nt!Compute (2 records")), "off-CPU: io");
        assert!(blue(fill(&svg, "nt!Wait (2 records")));
        assert!(blue(fill(&svg, "off-cpu (2 records")));
        assert!(
            !blue(fill(&svg, "threadstack (5 records")),
            "the shared source: hot"
        );
        assert!(
            !svg.contains("_[w]"),
            "the annotation shows in no label or title"
        );
        assert!(
            !svg.contains("#e0e0ff"),
            "a mixed graph keeps the usual background"
        );
    }

    #[test]
    fn no_stacks_is_an_error() {
        assert!(svg(&[]).is_err());
    }
}
