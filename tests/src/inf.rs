//! A reader for Windows INF files, enough to check kstack's INF on a host
//! without the WDK's tools.
//!
//! It follows the INF syntax `SetupAPI` documents: `[section]` headers,
//! `key = value, value` and keyless `value, value` lines, `;` comments
//! outside quotes, a trailing `\` joining a line with the next, quoted values
//! (`""` is a quote inside one), and `%token%` replaced from `[Strings]`
//! (`%%` is a percent sign; a number such as `%13%` is a DIRID and stays).
//! A `%token%` that `[Strings]` does not define is an error, as is a line
//! outside any section, an unterminated quote or a section defined twice
//! (`SetupAPI` would merge it; kstack's INF has no reason to).

use std::{collections::HashMap, fmt};

/// A parsed INF file: its sections in order, with `%token%`s substituted.
#[derive(Debug)]
pub struct Inf {
    sections: Vec<Section>,
}

/// One `[section]`.
#[derive(Debug)]
pub struct Section {
    /// The name between the brackets, as written.
    pub name: String,
    /// Its lines, comments and blank lines left out.
    pub lines: Vec<Line>,
}

/// One logical line of a section (continuations joined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The text left of an unquoted `=`, if there is one.
    pub key: Option<String>,
    /// The comma-separated values, unquoted and substituted.
    pub values: Vec<String>,
    /// The 1-based line number where the logical line starts.
    pub number: usize,
}

/// Why a text is not a well-formed INF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for InfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for InfError {}

/// A line split into key and raw values, before `%token%` substitution.
struct RawLine {
    key: Option<String>,
    values: Vec<String>,
    number: usize,
}

impl Inf {
    /// Decodes an INF file's bytes: UTF-8 (with or without a byte-order
    /// mark) or UTF-16LE with its mark, the encodings `SetupAPI` reads.
    ///
    /// # Errors
    /// When the bytes are neither.
    pub fn decode(bytes: &[u8]) -> Result<String, InfError> {
        let invalid = |encoding: &str| InfError {
            line: 0,
            message: format!("not valid {encoding}"),
        };
        if let Some(utf16) = bytes.strip_prefix(&[0xFF, 0xFE]) {
            if utf16.len() % 2 != 0 {
                return Err(invalid("UTF-16LE"));
            }
            let units: Vec<u16> = utf16
                .chunks_exact(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
                .collect();
            return String::from_utf16(&units).map_err(|_| invalid("UTF-16LE"));
        }
        let utf8 = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(bytes);
        String::from_utf8(utf8.to_vec()).map_err(|_| invalid("UTF-8"))
    }

    /// Parses INF text.
    ///
    /// # Errors
    /// When the text breaks one of the rules in the module documentation.
    pub fn parse(text: &str) -> Result<Self, InfError> {
        let mut raw_sections: Vec<(String, usize, Vec<RawLine>)> = Vec::new();
        for (number, logical) in logical_lines(text) {
            let (content, _comment) = split_comment(&logical, number)?;
            let content = content.trim();
            if content.is_empty() {
                continue;
            }
            if let Some(header) = content.strip_prefix('[') {
                let name = header.strip_suffix(']').ok_or_else(|| InfError {
                    line: number,
                    message: format!("section header without `]`: {content}"),
                })?;
                let name = name.trim();
                if raw_sections
                    .iter()
                    .any(|(existing, _, _)| existing.eq_ignore_ascii_case(name))
                {
                    return Err(InfError {
                        line: number,
                        message: format!("section [{name}] is defined twice"),
                    });
                }
                raw_sections.push((name.to_owned(), number, Vec::new()));
                continue;
            }
            let Some((_, _, lines)) = raw_sections.last_mut() else {
                return Err(InfError {
                    line: number,
                    message: format!("text before the first section: {content}"),
                });
            };
            lines.push(split_line(content, number)?);
        }

        let strings = strings_table(&raw_sections);
        let sections = raw_sections
            .into_iter()
            .map(|(name, _, lines)| {
                let lines = lines
                    .into_iter()
                    .map(|raw| {
                        Ok(Line {
                            key: raw
                                .key
                                .map(|key| substitute(&key, &strings, raw.number))
                                .transpose()?,
                            values: raw
                                .values
                                .iter()
                                .map(|value| substitute(value, &strings, raw.number))
                                .collect::<Result<_, _>>()?,
                            number: raw.number,
                        })
                    })
                    .collect::<Result<_, InfError>>()?;
                Ok(Section { name, lines })
            })
            .collect::<Result<_, InfError>>()?;
        Ok(Self { sections })
    }

    /// Every section, in file order.
    #[must_use]
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The section called `name` (INF names are case-insensitive).
    #[must_use]
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections
            .iter()
            .find(|section| section.name.eq_ignore_ascii_case(name))
    }

    /// The values of the first `key = ...` line in section `section`.
    #[must_use]
    pub fn values(&self, section: &str, key: &str) -> Option<&[String]> {
        self.section(section)?.values(key)
    }

    /// The single value of `key` in `section`; `None` when the key is
    /// missing or has other than one value.
    #[must_use]
    pub fn value(&self, section: &str, key: &str) -> Option<&str> {
        match self.values(section, key)? {
            [value] => Some(value),
            _ => None,
        }
    }
}

impl Section {
    /// The values of the first `key = ...` line (keys are case-insensitive).
    #[must_use]
    pub fn values(&self, key: &str) -> Option<&[String]> {
        self.lines
            .iter()
            .find(|line| {
                line.key
                    .as_deref()
                    .is_some_and(|found| found.eq_ignore_ascii_case(key))
            })
            .map(|line| line.values.as_slice())
    }
}

/// Joins `\`-continued lines; yields each logical line with the number of
/// its first physical line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, physical) in text.lines().enumerate() {
        let number = index + 1;
        let (start, mut joined) = pending.take().unwrap_or((number, String::new()));
        let trimmed = physical.trim_end();
        // A continuation backslash is the last character outside a comment;
        // a backslash inside a comment does not continue the line.
        let continues = split_comment(trimmed, number)
            .is_ok_and(|(content, comment)| comment.is_none() && content.ends_with('\\'));
        if continues {
            joined.push_str(&trimmed[..trimmed.len() - 1]);
            joined.push(' ');
            pending = Some((start, joined));
        } else {
            joined.push_str(physical);
            out.push((start, joined));
        }
    }
    if let Some(last) = pending {
        out.push(last);
    }
    out
}

/// Splits a line at its first `;` outside quotes.
fn split_comment(line: &str, number: usize) -> Result<(&str, Option<&str>), InfError> {
    let mut quoted = false;
    for (at, character) in line.char_indices() {
        match character {
            '"' => quoted = !quoted,
            ';' if !quoted => return Ok((&line[..at], Some(&line[at + 1..]))),
            _ => {}
        }
    }
    if quoted {
        return Err(InfError {
            line: number,
            message: format!("unterminated quote: {line}"),
        });
    }
    Ok((line, None))
}

/// Splits `key = a, "b, c", d` into the key and unquoted values.
fn split_line(content: &str, number: usize) -> Result<RawLine, InfError> {
    let mut fields = vec![String::new()];
    let mut key = None;
    let mut quoted = false;
    let mut chars = content.chars().peekable();
    while let Some(character) = chars.next() {
        match character {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                push_char(&mut fields, '"');
            }
            '"' => quoted = !quoted,
            '=' if !quoted && key.is_none() && fields.len() == 1 => {
                let name = fields.pop().unwrap_or_default().trim().to_owned();
                if name.is_empty() {
                    return Err(InfError {
                        line: number,
                        message: format!("`=` without a key: {content}"),
                    });
                }
                key = Some(name);
                fields.push(String::new());
            }
            ',' if !quoted => fields.push(String::new()),
            other => push_char(&mut fields, other),
        }
    }
    if quoted {
        return Err(InfError {
            line: number,
            message: format!("unterminated quote: {content}"),
        });
    }
    let mut values: Vec<String> = fields
        .into_iter()
        .map(|field| field.trim().to_owned())
        .collect();
    // `key =` with nothing after it has no values.
    if values.len() == 1 && values[0].is_empty() {
        values.clear();
    }
    Ok(RawLine {
        key,
        values,
        number,
    })
}

fn push_char(fields: &mut [String], character: char) {
    if let Some(field) = fields.last_mut() {
        field.push(character);
    }
}

/// The `[Strings]` table, keys lowercased (tokens are case-insensitive).
fn strings_table(sections: &[(String, usize, Vec<RawLine>)]) -> HashMap<String, String> {
    sections
        .iter()
        .filter(|(name, _, _)| name.eq_ignore_ascii_case("Strings"))
        .flat_map(|(_, _, lines)| lines)
        .filter_map(|line| {
            let key = line.key.as_ref()?;
            Some((key.to_ascii_lowercase(), line.values.join(",")))
        })
        .collect()
}

/// Replaces every `%token%` in `text` from `strings`.
fn substitute(
    text: &str,
    strings: &HashMap<String, String>,
    number: usize,
) -> Result<String, InfError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after.find('%').ok_or_else(|| InfError {
            line: number,
            message: format!("unpaired `%` in {text}"),
        })?;
        let token = &after[..end];
        if token.is_empty() {
            out.push('%');
        } else if token.bytes().all(|byte| byte.is_ascii_digit()) {
            // A DIRID, resolved by SetupAPI at install time.
            out.push('%');
            out.push_str(token);
            out.push('%');
        } else {
            let value = strings
                .get(&token.to_ascii_lowercase())
                .ok_or_else(|| InfError {
                    line: number,
                    message: format!("%{token}% is not defined in [Strings]"),
                })?;
            out.push_str(value);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_keys_values_and_comments() {
        let inf = Inf::parse(
            "; header comment\n[Version]\nSignature = \"$WINDOWS NT$\" ; trailing\n\
             [A]\nkey = one, \"two, still two\", three\nbare, line\nempty =\n",
        )
        .unwrap();
        assert_eq!(inf.value("version", "SIGNATURE"), Some("$WINDOWS NT$"));
        assert_eq!(
            inf.values("A", "key").unwrap(),
            ["one", "two, still two", "three"]
        );
        let bare = &inf.section("a").unwrap().lines[1];
        assert_eq!(bare.key, None);
        assert_eq!(bare.values, ["bare", "line"]);
        assert_eq!(inf.values("A", "empty").unwrap(), [] as [String; 0]);
    }

    #[test]
    fn strings_are_substituted_and_dirids_kept() {
        let inf = Inf::parse(
            "[S]\nName = %Service%\nPath = %13%\\%File%\nLiteral = 100%%\n\
             [Strings]\nservice = \"kstack\"\nFILE = \"kstack.sys\"\n",
        )
        .unwrap();
        assert_eq!(inf.value("S", "Name"), Some("kstack"));
        assert_eq!(inf.value("S", "Path"), Some("%13%\\kstack.sys"));
        assert_eq!(inf.value("S", "Literal"), Some("100%"));
    }

    #[test]
    fn continuations_join_lines() {
        let inf = Inf::parse("[S]\nList = a, \\\n       b ; note\nNext = c\n").unwrap();
        assert_eq!(inf.values("S", "List").unwrap(), ["a", "b"]);
        assert_eq!(inf.section("S").unwrap().lines[1].number, 4);
    }

    #[test]
    fn quotes_escape_quotes_and_protect_semicolons() {
        let inf = Inf::parse("[S]\nText = \"say \"\"hi\"\"; then go\"\n").unwrap();
        assert_eq!(inf.value("S", "Text"), Some("say \"hi\"; then go"));
    }

    #[test]
    fn decodes_utf8_and_utf16le() {
        let text = "[S]\nA = b\n";
        assert_eq!(Inf::decode(text.as_bytes()).unwrap(), text);
        let bom_utf8 = [&[0xEF, 0xBB, 0xBF], text.as_bytes()].concat();
        assert_eq!(Inf::decode(&bom_utf8).unwrap(), text);
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        assert_eq!(Inf::decode(&utf16).unwrap(), text);
        assert!(Inf::decode(&[0xFF, 0xFE, 0x41]).is_err());
        assert!(Inf::decode(&[0xC3]).is_err());
    }

    #[test]
    fn malformed_text_is_refused() {
        let error = |text: &str| Inf::parse(text).unwrap_err();
        assert_eq!(error("key = 1\n").line, 1);
        assert!(error("[S]\nA = \"open\n").message.contains("unterminated"));
        assert!(error("[S\n").message.contains("without `]`"));
        assert!(error("[S]\n[s]\n").message.contains("twice"));
        assert!(
            error("[S]\nA = %Missing%\n")
                .message
                .contains("not defined")
        );
        assert!(error("[S]\nA = 50%\n").message.contains("unpaired"));
        assert!(error("[S]\n= 1\n").message.contains("without a key"));
    }
}
