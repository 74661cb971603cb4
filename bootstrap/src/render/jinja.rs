//! cloud-init renders cloud-config user data as a Jinja template (`## template: jinja`), which
//! the commands users write rely on (`{{ ds.meta_data.hostname }}`, as with CAPI's kubeadm
//! provider). Everything else (file contents and paths, users, NTP servers, the lines we build)
//! must reach cloud-init as written, whatever braces it holds: [`literal`] turns each `{{`,
//! `{%` and `{#` of it into an expression that prints those two characters.
//!
//! `{% raw %}` is not used: cloud-init's Jinja trims the newline after a block tag, and a value
//! could hold `{% endraw %}` itself. An expression is neither.

use std::borrow::Cow;

/// `text` (already quoted for YAML) such that Jinja renders it back unchanged.
pub fn literal(text: &str) -> Cow<'_, str> {
    if !["{{", "{%", "{#"].iter().any(|opener| text.contains(opener)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.chars().next() {
            Some(second @ ('{' | '%' | '#')) => {
                out.push_str("{{ '{");
                out.push(second);
                out.push_str("' }}");
                rest = &after[1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openers_become_expressions_and_the_rest_stays() {
        assert_eq!(literal("plain { text }"), "plain { text }");
        assert!(matches!(literal("a } b"), Cow::Borrowed(_)));
        assert_eq!(
            literal("{{ ds.meta_data.hostname }}"),
            "{{ '{{' }} ds.meta_data.hostname }}"
        );
        assert_eq!(literal("{% endraw %}{#x#}"), "{{ '{%' }} endraw %}{{ '{#' }}x#}");
        assert_eq!(literal("{{{"), "{{ '{{' }}{");
        assert_eq!(literal("{{{{"), "{{ '{{' }}{{ '{{' }}");
        assert_eq!(literal("{"), "{");
        assert_eq!(literal("é{%ü"), "é{{ '{%' }}ü");
    }
}
