//! Shell words for values we splice into generated commands (flag values, URLs, file names).

/// `s` as one POSIX shell word: unchanged when it holds only characters the shell never
/// interprets, else single-quoted. (The line it ends up in is made literal for cloud-init's
/// Jinja stage by the caller.)
pub fn word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '@' | '%' | '+' | '=' | ':' | ',' | '.' | '/' | '-')
        });
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::word;

    #[test]
    fn plain_words_stay_plain() {
        assert_eq!(word("https://10.0.0.1:2379"), "https://10.0.0.1:2379");
        assert_eq!(word("3.5.9"), "3.5.9");
    }

    #[test]
    fn anything_else_is_single_quoted() {
        assert_eq!(word(""), "''");
        assert_eq!(word("a b"), "'a b'");
        assert_eq!(word("it's; rm -rf /"), r"'it'\''s; rm -rf /'");
        assert_eq!(word("$(x)"), "'$(x)'");
    }
}
