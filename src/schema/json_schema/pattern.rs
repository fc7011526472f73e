//! `pattern` and `patternProperties` as ECMA-262 reads them, rewritten for the validator's regex engines.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! Every draft says a pattern is an ECMA-262 regular expression. The `jsonschema` crate compiles it with
//! Rust's `regex` (or `fancy-regex` where it has lookaround or backreferences), after rewriting `\d` and
//! `\w` to ASCII; it keeps the Rust meaning of everything else, and rewrites nothing at all in a pattern
//! with lookaround. Where the meanings differ, the pattern is rewritten here first, so the crate compiles
//! what ECMA-262 means:
//!
//! | ECMA-262 | means | Rust's regex would read |
//! |---|---|---|
//! | `.` | any character but `\n`, `\r`, U+2028, U+2029 | any but `\n` |
//! | `\s` / `\S` | ECMA's white space and line terminators (U+FEFF too, U+0085 not) | Unicode `White_Space` |
//! | `\d` `\w` `\D` `\W` | ASCII `[0-9]`, `[A-Za-z0-9_]` | Unicode (in a pattern with lookaround) |
//! | `[` `&` `~` in a class | themselves | a nested class, set operators |
//! | `[]` / `[^]` | nothing / any character | a class holding `]` |
//!
//! Python's `re` (confluent-kafka's consumers) departs from ECMA-262 too, the other way for most of these
//! (`\d` any digit, `$` before a final newline, `.` matching `\r`); the corpus of
//! tests/json_schema_corpus.rs lists each departure.

/// ECMA-262's `\s`: WhiteSpace and LineTerminator, as characters of a class.
const SPACE: &str = "\t\n\x0B\x0C\r \u{a0}\u{1680}\u{2000}-\u{200a}\u{2028}\u{2029}\u{202f}\u{205f}\u{3000}\u{feff}";

/// `pattern` (ECMA-262) in the syntax the validator compiles to the same meaning, or `None` when it is
/// already that.
pub(super) fn rewrite(pattern: &str) -> Option<String> {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match (c, in_class) {
            ('\\', _) => {
                let Some(escaped) = chars.next() else {
                    out.push('\\');
                    break;
                };
                match (escaped, in_class) {
                    ('d', false) => out.push_str("[0-9]"),
                    ('D', _) => out.push_str("[^0-9]"),
                    ('w', false) => out.push_str("[A-Za-z0-9_]"),
                    ('W', _) => out.push_str("[^A-Za-z0-9_]"),
                    ('s', false) => out.push_str(&format!("[{SPACE}]")),
                    ('S', _) => out.push_str(&format!("[^{SPACE}]")),
                    ('d', true) => out.push_str("0-9"),
                    ('w', true) => out.push_str("A-Za-z0-9_"),
                    ('s', true) => out.push_str(SPACE),
                    (other, _) => {
                        out.push('\\');
                        out.push(other);
                    }
                }
            }
            ('[', false) => {
                let negated = chars.next_if_eq(&'^').is_some();
                if chars.next_if_eq(&']').is_some() {
                    // ECMA-262's empty class matches nothing, its negation any character.
                    out.push_str(if negated { "[\\x00-\\x{10FFFF}]" } else { "[^\\x00-\\x{10FFFF}]" });
                    continue;
                }
                out.push('[');
                if negated {
                    out.push('^');
                }
                in_class = true;
            }
            (']', true) => {
                out.push(']');
                in_class = false;
            }
            ('[' | '&' | '~', true) => {
                out.push('\\');
                out.push(c);
            }
            ('.', false) => out.push_str("[^\\n\\r\u{2028}\u{2029}]"),
            (other, _) => out.push(other),
        }
    }
    (out != pattern).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per rule of the module doc's table.
    #[test]
    fn ecma_262_meanings_are_spelled_for_rust() {
        for (ecma, rust) in [
            ("^abc$", None),
            ("^a.c$", Some("^a[^\\n\\r\u{2028}\u{2029}]c$")),
            ("^[.]$", None),
            ("^\\.$", None),
            ("^\\d+$", Some("^[0-9]+$")),
            ("^[\\d.]$", Some("^[0-9.]$")),
            ("^[^\\D]$", Some("^[^[^0-9]]$")),
            ("^\\w\\W$", Some("^[A-Za-z0-9_][^A-Za-z0-9_]$")),
            ("^[a&&b]$", Some("^[a\\&\\&b]$")),
            ("^[[]$", Some("^[\\[]$")),
            ("^[]$", Some("^[^\\x00-\\x{10FFFF}]$")),
            ("^[^]$", Some("^[\\x00-\\x{10FFFF}]$")),
            ("^(?=.*\\d)\\d$", Some("^(?=[^\\n\\r\u{2028}\u{2029}]*[0-9])[0-9]$")),
            ("\\u0041\\x42\\p{Lu}", None),
        ] {
            assert_eq!(rewrite(ecma).as_deref(), rust, "{ecma}");
        }
        let space = rewrite("\\s").unwrap();
        assert!(space.contains('\u{feff}') && !space.contains('\u{85}'), "{space:?}");
    }
}
