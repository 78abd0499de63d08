//! Text a guest controls, made inert before it reaches a terminal.
//!
//! A trial's error message, a panic message quoted from its stderr or a
//! reason built around either is the guest's text. Printed raw, its escape
//! sequences clear the operator's screen, retitle the terminal, hide what
//! follows or move the cursor, and a `\r` or a newline lets it forge lines
//! such as `Best trial: ...`. Everything printed to a terminal goes through
//! here: [`inert`] for a field put into a line, [`TerminalWriter`] for the
//! log lines `tracing` writes. Files (results, state, logs) keep the raw
//! text; only what a terminal shows is escaped.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::text::hides_text;

/// Most characters of one guest-controlled field shown on a terminal; the
/// rest is cut with a note naming the full length. Files keep it whole.
pub const MAX_SHOWN: usize = 2048;

/// `text` as a terminal should show it: every control character (C0, DEL,
/// C1: escapes, `\r`, newlines, tabs) and every invisible format character
/// that reorders or hides text (bidirectional overrides and isolates,
/// zero-width characters) written as a visible escape (`\n`, `\r`, `\t`,
/// `\u{1b}`), and at most [`MAX_SHOWN`] characters. Text with nothing to
/// escape and within the cap comes back borrowed.
pub fn inert(text: &str) -> Cow<'_, str> {
    let short = text.len() <= MAX_SHOWN;
    if short && !text.chars().any(hides_text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN) + 16);
    for (shown, c) in text.chars().enumerate() {
        if shown == MAX_SHOWN {
            let _ = write!(out, " [... {} bytes in all]", text.len());
            break;
        }
        push_inert(&mut out, c);
    }
    Cow::Owned(out)
}

fn push_inert(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if hides_text(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// A `tracing` writer for a terminal: each event's line is written with
/// every control character escaped (see [`inert`]) except the newline that
/// ends it, so a reason quoted in a warning cannot break out of its line.
/// The line length is not capped here: what the host logs is bounded by
/// the fields it quotes. Use it with ANSI colours off, since the
/// formatter's own colour codes would be escaped too.
#[derive(Debug, Clone, Copy, Default)]
pub struct TerminalWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for TerminalWriter {
    type Writer = InertLines;

    fn make_writer(&'a self) -> Self::Writer {
        InertLines
    }
}

/// One event's output on its way to stderr (see [`TerminalWriter`]).
#[derive(Debug)]
pub struct InertLines;

impl Write for InertLines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        let mut line = String::with_capacity(body.len() + 1);
        for c in body.chars() {
            push_inert(&mut line, c);
        }
        line.push_str(end);
        io::stderr().lock().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_forged_lines_are_shown_not_obeyed() {
        let attack = "\x1b[2J\x1b]0;pwned\x07\rok\nBest trial: forged\u{202E}txt.exe";
        assert_eq!(
            inert(attack),
            "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\rok\\nBest trial: forged\\u{202e}txt.exe"
        );
        assert!(!inert(attack).chars().any(hides_text));
    }

    #[test]
    fn characters_that_draw_nothing_are_shown() {
        let hidden = "ok\u{E0041}\u{E0042}\u{3164}\u{00AD}\u{206A}\u{FFF9}\u{180E}\u{115F}";
        assert_eq!(
            inert(hidden),
            "ok\\u{e0041}\\u{e0042}\\u{3164}\\u{ad}\\u{206a}\\u{fff9}\\u{180e}\\u{115f}"
        );
        // Letters of every script, and emoji, are left as they are.
        assert!(matches!(inert("naïve 東京 ❤️ Ελλάδα"), Cow::Borrowed(_)));
    }

    /// The dashboard escapes with a regular expression of its own
    /// (`serve/page/app.js`): it must name the same characters.
    #[test]
    fn the_dashboard_escapes_the_same_characters() {
        let app = include_str!("../serve/page/app.js");
        let class = app
            .split_once("const NEEDS_ESCAPE = /[")
            .and_then(|(_, rest)| rest.split_once("]/"))
            .expect("app.js defines NEEDS_ESCAPE")
            .0;
        // `\uXXXX` or `\u{X...}`, alone or as `lo-hi`.
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        let mut rest = class;
        let mut in_range = false;
        while let Some(after) = rest.strip_prefix("\\u") {
            let (hex, tail) = match after.strip_prefix('{') {
                Some(braced) => braced.split_once('}').expect("a closing brace"),
                None => after.split_at(4),
            };
            let c = u32::from_str_radix(hex, 16).expect("hex");
            match ranges.last_mut() {
                Some(last) if in_range => last.1 = c,
                _ => ranges.push((c, c)),
            }
            in_range = !in_range && tail.starts_with('-');
            rest = tail.strip_prefix('-').unwrap_or(tail);
        }
        assert!(rest.is_empty(), "unparsed: {rest}");
        let in_class = |c: u32| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c));
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            assert_eq!(in_class(c as u32), hides_text(c), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn plain_text_is_borrowed_and_long_text_is_cut_with_its_length() {
        assert!(matches!(inert("loss diverged at 3"), Cow::Borrowed(_)));
        let long = "é".repeat(MAX_SHOWN + 5);
        let shown = inert(&long);
        assert!(shown.starts_with(&"é".repeat(MAX_SHOWN)), "{shown}");
        assert!(
            shown.ends_with(&format!(" [... {} bytes in all]", long.len())),
            "{shown}"
        );
    }
}
