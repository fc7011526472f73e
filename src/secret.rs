//! Secrets in the configuration: which keys hold one ([`is_secret_key`]), and how a text that may quote one
//! is made safe to show ([`redact`]).
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! # Where a secret could get out, and what stops it
//! - `Debug` of the config: passwords are [`Secret`]s and `[kafka.properties]` is [`Properties`]; both print
//!   [`REDACTED`] instead of the value of a secret-looking key.
//! - A TOML error: the config loader never shows toml's quoted source line, and masks the values of
//!   secret-looking keys in toml's message ([`values_in_toml`]).
//! - A librdkafka configuration error repeats the key *and the value* (a typo such as `sasl.pasword` would
//!   print the password): [`crate::error::classify_kafka`] never repeats a value of a secret-looking key.
//! - Every error message passes through [`redact`] when the [`crate::error::Error`] is built, so the log,
//!   the stored `last_error` and `outbox-cdc status` only ever see redacted text.
//!
//! # The rule
//! A key is secret-looking when librdkafka itself redacts it (its sensitive properties, so we are never less
//! careful than the library), or when one of its words (split at `.`, `_`, `-`) names a secret: a
//! password (also misspelled: `pasword`, `passwd`, `pwd`, `passwort`, `pasword1`), a passphrase, a secret,
//! a token, a credential, a JAAS config, an API or private key. A key ending in `_env` names an
//! environment variable that holds a secret, and one ending in `_file` a file that holds one
//! ([`read_file`]), not the secret itself: a message may show the variable's name or the file's path. The
//! rule errs towards redacting: a false positive costs a value in an error message, a false negative a
//! password in the log.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

/// What a secret value is replaced with.
pub const REDACTED: &str = "***";

/// Properties librdkafka marks sensitive (`_RK_SENSITIVE` in `rdkafka_conf.c`) and redacts in its own
/// logs. Most also match the word rule; this list covers the ones that do not (`sasl.username`,
/// `ssl.ca.pem`, `ssl.key.location`, `sasl.oauthbearer.config`, …).
const LIBRDKAFKA_SENSITIVE: &[&str] = &[
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// Words that name a secret wherever they appear inside a word (`dbpassword`, `access_token`).
const SECRET_STEMS: &[&str] = &["passw", "passphrase", "secret", "token", "credential", "jaas", "apikey", "privatekey"];

/// Pairs of consecutive words that name a secret (`api_key`, `private.key`, `ssl.key.pem`).
const SECRET_PAIRS: &[[&str; 2]] = &[["api", "key"], ["private", "key"], ["key", "pem"], ["access", "key"]];

/// Whether the value of `key` (a config key, a librdkafka property, a word in a message) must never be
/// shown. Case-insensitive; surrounding quotes are ignored. See the module docs for the rule.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.trim_matches(|c| matches!(c, '"' | '\'' | '`')).to_ascii_lowercase();
    let sensitive = |k: &&str| key.strip_suffix(k).is_some_and(|rest| rest.is_empty() || rest.ends_with('.'));
    if LIBRDKAFKA_SENSITIVE.iter().any(sensitive) {
        return true;
    }
    if key.ends_with("_env") || key.ends_with("_file") {
        return false;
    }
    let words: Vec<&str> = key.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    words.iter().any(|w| is_secret_word(w)) || words.windows(2).any(|pair| SECRET_PAIRS.contains(&[pair[0], pair[1]]))
}

fn is_secret_word(word: &str) -> bool {
    SECRET_STEMS.iter().any(|stem| word.contains(stem))
        || matches!(word, "pw" | "pass" | "pwd")
        || skeleton(word).contains("psw")
        || (word.len() >= 6 && edit_distance(word, "password") <= 2)
}

/// The consonants of `word` with repeats collapsed: `password`, `pasword`, `passwd`, `paswd` and `pswd` all
/// contain `psw`, which English words hardly do.
fn skeleton(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars().filter(|c| !matches!(c, 'a' | 'e' | 'i' | 'o' | 'u' | 'y')) {
        if !out.ends_with(c) {
            out.push(c);
        }
    }
    out
}

/// Edit distance with adjacent transpositions (optimal string alignment): `passwrod` is one edit away from
/// `password`, `passeord` (a neighbouring key) too.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// `text` with the value of every secret-looking key masked: `key = value`, `key=value`,
/// `"key" = "value"` and `"key": "value"` (a colon only before a quoted value, so that prose such as
/// "column auth_token: expected a string" stays readable). Text without such a pair is returned as is.
pub fn redact(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !is_key_byte(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_key_byte(bytes[i]) {
            i += 1;
        }
        if !is_secret_key(&text[start..i]) {
            continue;
        }
        let Some((value, resume)) = value_after(bytes, start, i) else { continue };
        let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
        out.push_str(&text[copied..value.start]);
        out.push_str(REDACTED);
        copied = value.end;
        i = resume;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn is_quote(b: u8) -> bool {
    matches!(b, b'"' | b'\'' | b'`')
}

/// The value assigned to the key at `key_start..key_end`, if one follows: its byte range (inside quotes
/// when quoted) and where scanning resumes.
fn value_after(bytes: &[u8], key_start: usize, key_end: usize) -> Option<(std::ops::Range<usize>, usize)> {
    let skip_blanks = |mut j: usize| {
        while j < bytes.len() && matches!(bytes[j], b' ' | b'\t') {
            j += 1;
        }
        j
    };
    let mut j = key_end;
    if key_start > 0 && is_quote(bytes[key_start - 1]) && bytes.get(j) == Some(&bytes[key_start - 1]) {
        j += 1;
    }
    j = skip_blanks(j);
    let separator = *bytes.get(j)?;
    if separator != b'=' && separator != b':' || bytes.get(j + 1) == Some(&separator) {
        return None;
    }
    j = skip_blanks(j + 1);
    let first = *bytes.get(j)?;
    if is_quote(first) {
        let content = j + 1;
        let mut k = content;
        while k < bytes.len() && bytes[k] != first {
            k += if bytes[k] == b'\\' { 2 } else { 1 };
        }
        let end = k.min(bytes.len());
        return Some((content..end, (end + 1).min(bytes.len())));
    }
    if separator == b':' {
        return None;
    }
    let end = bytes[j..]
        .iter()
        .position(|b| b.is_ascii_whitespace() || matches!(b, b',' | b';' | b')' | b']' | b'}' | b'&'))
        .map_or(bytes.len(), |n| j + n);
    (end > j).then_some((j..end, end))
}

/// Every value under a secret-looking key anywhere in a TOML document (misspelled keys included), as text;
/// empty when the document is not valid TOML. Used to mask values that toml's messages quote (`invalid
/// type: integer `1234``), which name no key.
pub fn values_in_toml(text: &str) -> Vec<String> {
    fn leaves(value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::String(s) => out.push(s.clone()),
            toml::Value::Integer(i) => out.push(i.to_string()),
            toml::Value::Float(f) => out.push(f.to_string()),
            toml::Value::Datetime(d) => out.push(d.to_string()),
            toml::Value::Boolean(_) => {}
            toml::Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
            toml::Value::Table(table) => table.values().for_each(|v| leaves(v, out)),
        }
    }
    fn walk(table: &toml::Table, out: &mut Vec<String>) {
        for (key, value) in table {
            match value {
                _ if is_secret_key(key) => leaves(value, out),
                toml::Value::Table(inner) => walk(inner, out),
                toml::Value::Array(items) => {
                    items.iter().filter_map(toml::Value::as_table).for_each(|inner| walk(inner, out))
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(doc) = text.parse::<toml::Table>() {
        walk(&doc, &mut out);
    }
    out.retain(|v| !v.is_empty());
    out
}

/// `text` with every whole-word occurrence of one of `values` replaced by [`REDACTED`] (a whole word, so
/// that a short password such as `kind` does not garble `expected one of `kind``'s neighbours).
pub fn mask_values(text: &str, values: &[String]) -> String {
    let mut text = text.to_string();
    for value in values {
        let mut from = 0;
        while let Some(at) = text[from..].find(value.as_str()).map(|n| from + n) {
            let end = at + value.len();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            if word(text[..at].chars().next_back()) || word(text[end..].chars().next()) {
                from = end;
                continue;
            }
            text.replace_range(at..end, REDACTED);
            from = at + REDACTED.len();
        }
    }
    text
}

/// Why a secret file cannot be used. It never holds any of the file's content.
#[derive(Debug, thiserror::Error)]
pub enum FileSecretError {
    /// The file cannot be opened or read: missing, a directory, no permission.
    #[error("it cannot be read ({0})")]
    Unreadable(std::io::Error),
    /// Nothing is left once the trailing newline is trimmed.
    #[error("the file is empty")]
    Empty,
    /// The content is not UTF-8 text.
    #[error("the file is not UTF-8 text")]
    NotText,
}

/// Reads a secret from a file: a Kubernetes Secret or a Docker secret mounted as a volume, systemd's
/// `LoadCredential=`. The content is the secret, less one trailing line break (`\n` or `\r\n`) that an
/// editor or `echo` leaves; everything else, inner and leading blanks included, is the secret's own.
///
/// # Errors
/// [`FileSecretError`] when the file cannot be read, is empty, or is not UTF-8 text.
pub fn read_file(path: &Path) -> Result<Secret, FileSecretError> {
    let bytes = std::fs::read(path).map_err(FileSecretError::Unreadable)?;
    secret_in_file(bytes)
}

/// The secret a file's content holds (see [`read_file`]).
fn secret_in_file(bytes: Vec<u8>) -> Result<Secret, FileSecretError> {
    let mut text = String::from_utf8(bytes).map_err(|_| FileSecretError::NotText)?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    match text.is_empty() {
        true => Err(FileSecretError::Empty),
        false => Ok(Secret(text)),
    }
}

/// A string that never appears in logs: `Debug` prints [`REDACTED`].
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself: only for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{REDACTED}\"")
    }
}

/// String properties handed to a client library as they are (`[kafka.properties]`): a map whose `Debug`
/// prints [`REDACTED`] for the value of every secret-looking key, misspelled ones included.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Properties(BTreeMap<String, String>);

impl std::ops::Deref for Properties {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<(String, String)> for Properties {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Properties(iter.into_iter().collect())
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, if is_secret_key(k) { REDACTED } else { v.as_str() })))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule, one row per reason: librdkafka's sensitive properties, the secret words, misspellings of
    /// "password" (the issue's `pasword`), and keys that must stay visible.
    #[test]
    fn secret_keys_are_recognised() {
        let cases: &[(&str, bool, &str)] = &[
            // librdkafka's own sensitive list, including the ones no word gives away
            ("sasl.password", true, "librdkafka sensitive"),
            ("sasl.username", true, "librdkafka sensitive"),
            ("ssl.key.password", true, "librdkafka sensitive"),
            ("ssl.keystore.password", true, "librdkafka sensitive"),
            ("ssl.key.pem", true, "librdkafka sensitive"),
            ("ssl.key.location", true, "librdkafka sensitive"),
            ("ssl.ca.pem", true, "librdkafka sensitive"),
            ("ssl_key", true, "librdkafka sensitive"),
            ("sasl.oauthbearer.config", true, "librdkafka sensitive"),
            ("sasl.oauthbearer.client.secret", true, "librdkafka sensitive"),
            ("sasl.oauthbearer.assertion.private.key.passphrase", true, "librdkafka sensitive"),
            ("kafka.properties.sasl.password", true, "a sensitive property quoted with its table"),
            ("SASL.PASSWORD", true, "case-insensitive"),
            ("\"sasl.password\"", true, "quoted"),
            // secret words
            ("password", true, "password"),
            ("source.password", true, "password"),
            ("dbpassword", true, "password inside a word"),
            ("passwords", true, "password inside a word"),
            ("sasl.jaas.config", true, "JAAS config holds a password"),
            ("ssl.truststore.secret", true, "secret"),
            ("client_secret", true, "secret"),
            ("access_token", true, "token"),
            ("sasl.oauthbearer.token.endpoint.url", true, "token (errs towards redacting)"),
            ("aws_credentials", true, "credential"),
            ("private_key", true, "private key"),
            ("privatekey", true, "private key"),
            ("api-key", true, "API key"),
            ("apikey", true, "API key"),
            ("passphrase", true, "passphrase"),
            // misspellings and abbreviations of password
            ("pasword", true, "one letter missing (the issue's typo)"),
            ("sasl.pasword", true, "one letter missing (the issue's typo)"),
            ("passwrod", true, "transposition"),
            ("passowrd", true, "transposition"),
            ("passeord", true, "neighbouring key"),
            ("pasword1", true, "typo and a digit"),
            ("passwd", true, "Unix spelling"),
            ("paswd", true, "abbreviation"),
            ("pswd", true, "abbreviation"),
            ("pwd", true, "abbreviation"),
            ("pw", true, "abbreviation"),
            ("pass", true, "abbreviation"),
            ("db_pass", true, "abbreviation"),
            ("passwort", true, "German"),
            ("sasl.passwrd", true, "one letter missing"),
            // not secrets
            ("password_env", false, "names an environment variable"),
            ("source.password_env", false, "names an environment variable"),
            ("password_file", false, "names a file"),
            ("prune.password_file", false, "names a file"),
            ("properties_file", false, "names files"),
            ("user", false, "not a secret"),
            ("bootstrap.servers", false, "not a secret"),
            ("sasl.mechanism", false, "not a secret"),
            ("security.protocol", false, "not a secret"),
            ("ssl.certificate.location", false, "a public certificate"),
            ("ssl.ca.location", false, "a path to a public CA"),
            ("linger.ms", false, "not a secret"),
            ("message.timeout.ms", false, "not a secret"),
            ("compression", false, "not a secret"),
            ("bypass", false, "pass only as a whole word"),
            ("compass", false, "pass only as a whole word"),
            ("passed", false, "a word near passwd, not a password"),
            ("parsed", false, "a word near passwd, not a password"),
            ("keyword", false, "not near password"),
            ("host", false, "not a secret"),
            ("key", false, "a Kafka record key"),
        ];
        for (key, secret, why) in cases {
            assert_eq!(is_secret_key(key), *secret, "{key}: {why}");
        }
    }

    #[test]
    fn redact_masks_values_of_secret_keys_only() {
        let cases: &[(&str, &str)] = &[
            ("sasl.pasword=hunter2", "sasl.pasword=***"),
            ("sasl.password = hunter2 and more", "sasl.password = *** and more"),
            ("\"sasl.pasword\" = \"hunter2\"", "\"sasl.pasword\" = \"***\""),
            ("{\"password\": \"hunter2\", \"user\": \"cdc\"}", "{\"password\": \"***\", \"user\": \"cdc\"}"),
            ("a,token=abc,user=u", "a,token=***,user=u"),
            ("url?user=u&password=p&x=1", "url?user=u&password=***&x=1"),
            ("password = 'it\\'s'; next", "password = '***'; next"),
            ("pasword = \"unterminated", "pasword = \"***"),
            ("user=cdc linger.ms=5", "user=cdc linger.ms=5"),
            ("Check source.user and the password", "Check source.user and the password"),
            ("column auth_token: expected a string", "column auth_token: expected a string"),
            ("source.password_env names PW, but it is not set", "source.password_env names PW, but it is not set"),
            ("password_env = \"PW\"", "password_env = \"PW\""),
            ("crate::password::x", "crate::password::x"),
            ("password =", "password ="),
            ("already password = ***", "already password = ***"),
        ];
        for (text, expected) in cases {
            assert_eq!(redact(text), *expected, "{text}");
        }
        assert!(matches!(redact("nothing to hide"), Cow::Borrowed(_)));
    }

    #[test]
    fn toml_secret_values_are_found_under_any_table() {
        let doc = r#"
            [source]
            pasword = 12345
            user = "cdc"
            [kafka.properties]
            "sasl.pasword" = "hunter2"
            "linger.ms" = "5"
            [[x]]
            token = ["a-token"]
        "#;
        let mut found = values_in_toml(doc);
        found.sort();
        assert_eq!(found, ["12345", "a-token", "hunter2"]);
        assert!(values_in_toml("not = = toml").is_empty());
    }

    #[test]
    fn mask_values_replaces_whole_words() {
        let values = ["kind".to_string(), "12345".to_string()];
        assert_eq!(
            mask_values("invalid type: integer `12345`, expected one of `kind`, `kinds`", &values),
            "invalid type: integer `***`, expected one of `***`, `kinds`"
        );
    }

    /// The content of a secret file, one row per rule: one trailing line break is the editor's, not the
    /// secret's; an empty file is a mistake, not an empty password.
    #[test]
    fn a_secret_file_loses_one_trailing_line_break_only() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (b"hunter2", Some("hunter2")),
            (b"hunter2\n", Some("hunter2")),
            (b"hunter2\r\n", Some("hunter2")),
            (b"hunter2\n\n", Some("hunter2\n")),
            (b"hunter2\r", Some("hunter2\r")),
            (b" hunter2 \n", Some(" hunter2 ")),
            (b"two\nlines\n", Some("two\nlines")),
            (b"", None),
            (b"\n", None),
            (b"\r\n", None),
            (b"\n\n", Some("\n")),
        ];
        for (content, expected) in cases {
            let got = secret_in_file(content.to_vec());
            match expected {
                Some(secret) => assert_eq!(got.unwrap().expose(), *secret, "{content:?}"),
                None => assert!(matches!(got, Err(FileSecretError::Empty)), "{content:?}: {got:?}"),
            }
        }
        assert!(matches!(secret_in_file(vec![0xff, 0xfe]), Err(FileSecretError::NotText)));
    }

    /// What goes wrong with a secret file is said without any of its content, and an unreadable one says
    /// why (the path is the caller's to name).
    #[test]
    fn a_secret_file_error_shows_no_content() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read_file(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(missing, FileSecretError::Unreadable(_)), "{missing:?}");
        assert!(missing.to_string().contains("No such file"), "{missing}");
        assert!(matches!(read_file(dir.path()), Err(FileSecretError::Unreadable(_))), "a directory");
        let file = dir.path().join("pw");
        std::fs::write(&file, [b'h', b'u', 0xff, b'\n']).unwrap();
        let error = read_file(&file).unwrap_err().to_string();
        assert_eq!(error, "the file is not UTF-8 text");
        std::fs::write(&file, "hunter2\n").unwrap();
        assert_eq!(read_file(&file).unwrap().expose(), "hunter2");
    }

    #[test]
    fn properties_debug_masks_secret_values() {
        let props: Properties = [("sasl.pasword", "hunter2"), ("linger.ms", "5")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect();
        let debug = format!("{props:?}");
        assert_eq!(debug, r#"{"linger.ms": "5", "sasl.pasword": "***"}"#);
    }
}
