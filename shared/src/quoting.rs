//! Double-quoted strings for the formats user data is written in (YAML for cloud-init, TOML for
//! Bottlerocket): the quote, the backslash, newline, tab and carriage return are escaped the same
//! way in both; each format says how it writes the other characters it cannot carry raw.

/// `s` between double quotes, `"`, `\`, `\n`, `\t` and `\r` escaped, and every other character
/// for which `escape` writes something (returning true) written that way.
pub fn double_quoted(s: &str, escape: impl Fn(char, &mut String) -> bool) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => {
                if !escape(c, &mut out) {
                    out.push(c);
                }
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_escapes_and_the_formats_own() {
        let none = |_: char, _: &mut String| false;
        assert_eq!(double_quoted("a\"b\\c\nd\te\rf", none), r#""a\"b\\c\nd\te\rf""#);
        let bell = |c: char, out: &mut String| {
            let bell = c == '\u{7}';
            if bell {
                out.push_str("\\a");
            }
            bell
        };
        assert_eq!(double_quoted("x\u{7}y", bell), r#""x\ay""#);
    }
}
