//! TOML basic strings for user values: Bottlerocket must read back exactly the string the user
//! wrote, whatever quotes, backslashes or control characters it holds.

use std::fmt::Write as _;

use etcdadm_shared::quoting;

/// `s` as a TOML basic string (`"..."`), usable as a value or as a quoted key.
pub fn basic_string(s: &str) -> String {
    quoting::double_quoted(s, |c, out| {
        match c {
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            // TOML forbids the other C0 controls and DEL in basic strings.
            '\u{0}'..='\u{1f}' | '\u{7f}' => {
                // Writing into a String cannot fail.
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            _ => return false,
        }
        true
    })
}

/// `items` as an inline TOML array of basic strings.
pub fn string_array<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| basic_string(s.as_ref())).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_toml_forbids_and_nothing_else() {
        assert_eq!(basic_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(basic_string("x\ny\tz\u{1}\u{7f}"), r#""x\ny\tz\u0001\u007F""#);
        assert_eq!(basic_string("é😀\u{2028}'#[]="), "\"é😀\u{2028}'#[]=\"");
        assert_eq!(basic_string(""), r#""""#);
    }

    #[test]
    fn arrays_quote_every_item() {
        assert_eq!(string_array(&["a", "b\"c"]), r#"["a", "b\"c"]"#);
        assert_eq!(string_array::<&str>(&[]), "[]");
    }
}
