//! YAML scalars for user strings: cloud-init must read back exactly the string the user wrote.
//!
//! Two forms only. Double-quoted scalars escape everything YAML 1.1 (PyYAML, which cloud-init
//! uses) would otherwise fold, reject or reinterpret. Literal blocks are used for readable
//! multi-line text (PEM, config files) only when the text can round-trip through one unchanged.
//! Nothing here touches `{{ }}`: cloud-init's jinja pass is meant to see the user's text as is.

use std::fmt::Write as _;

use etcdadm_shared::quoting;

/// `s` as a double-quoted YAML scalar that parses back to exactly `s`.
pub fn double_quoted(s: &str) -> String {
    quoting::double_quoted(s, |c, out| {
        if c == '\0' {
            out.push_str("\\0");
        } else if needs_escape(c) {
            let code = u32::from(c);
            // Writing into a String cannot fail.
            let _ = if code <= 0xFF {
                write!(out, "\\x{code:02X}")
            } else {
                write!(out, "\\u{code:04X}")
            };
        } else {
            return false;
        }
        true
    })
}

/// `s` as the text that follows `key: `: a literal block indented by `indent` spaces when `s` is
/// multi-line text a block keeps intact, else a double-quoted scalar. The caller must not put a
/// block last in the document: cloud-init's jinja pass drops the document's final newline.
pub fn scalar(s: &str, indent: usize) -> String {
    if !fits_literal_block(s) {
        return double_quoted(s);
    }
    let (body, chomping) = match s.strip_suffix('\n') {
        Some(body) => (body, "|"),
        None => (s, "|-"),
    };
    let pad = " ".repeat(indent);
    let mut out = String::with_capacity(s.len() + 8 + indent * 8);
    out.push_str(chomping);
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
    }
    out
}

/// Characters that YAML cannot carry raw inside a scalar: C0/C1 controls and DEL (PyYAML rejects
/// them), NEL and the Unicode line/paragraph separators (YAML 1.1 line breaks), the byte-order
/// mark, and the two non-characters PyYAML refuses.
fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1F}' | '\u{7F}'..='\u{9F}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}'
        | '\u{FFFE}' | '\u{FFFF}')
}

/// A literal block reproduces `s` only when every line is plain printable text, the first line
/// settles the indentation (starts with a visible character), and at most one newline ends it
/// (keeping more needs `|+`, whose trailing empty lines are easy to lose). Tabs go the quoted way
/// too: YAML parsers disagree on tabs near block indentation.
fn fits_literal_block(s: &str) -> bool {
    let first_is_visible = s.chars().next().is_some_and(|c| c != ' ' && c != '\n');
    first_is_visible
        && s.contains('\n')
        && !s.ends_with("\n\n")
        && s.chars().all(|c| c == '\n' || (c != '\t' && !needs_escape(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_value(yaml_value: &str) -> String {
        let doc = format!("k: {yaml_value}\n");
        let parsed: std::collections::BTreeMap<String, String> = serde_saphyr::from_str(&doc).unwrap();
        parsed["k"].clone()
    }

    #[test]
    fn double_quoted_escapes_quotes_backslashes_and_controls() {
        assert_eq!(double_quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(double_quoted("x\ny\tz\u{1}"), r#""x\ny\tz\x01""#);
        assert_eq!(double_quoted("\u{2028}\u{85}"), r#""\u2028\x85""#);
        assert_eq!(double_quoted("<&>'"), r#""<&>'""#);
        assert_eq!(
            double_quoted("{{ ds.meta_data.hostname }}"),
            r#""{{ ds.meta_data.hostname }}""#
        );
    }

    #[test]
    fn pem_becomes_a_literal_block() {
        let pem = "-----BEGIN X-----\nAAAA\n-----END X-----\n";
        assert_eq!(
            scalar(pem, 4),
            "|\n    -----BEGIN X-----\n    AAAA\n    -----END X-----"
        );
    }

    #[test]
    fn chomping_follows_the_trailing_newline() {
        assert_eq!(scalar("a\nb", 2), "|-\n  a\n  b");
        assert_eq!(scalar("a\n\nb\n", 2), "|\n  a\n\n  b");
        assert!(scalar("a\nb\n\n", 2).starts_with('"'));
    }

    #[test]
    fn text_a_block_cannot_carry_is_quoted() {
        for s in [" lead\nx", "\nx", "a\tb\nc", "a\r\nb", "single line"] {
            assert!(scalar(s, 2).starts_with('"'), "{s:?}");
        }
    }

    #[test]
    fn every_form_parses_back_to_the_input() {
        for s in [
            "plain",
            "a: b # c",
            "- item",
            "x\n\n  y  \n",
            "a\nb\n\n\n",
            "-----BEGIN X-----\nAAAA\n-----END X-----\n",
            "é😀\u{85}\u{2028}\u{FEFF}",
            "  both ends  ",
            "",
            "'single'",
            "%TAG",
            "*alias &anchor !tag",
        ] {
            assert_eq!(parse_value(&scalar(s, 2)), s, "{s:?}");
            assert_eq!(parse_value(&double_quoted(s)), s, "{s:?}");
        }
    }
}
