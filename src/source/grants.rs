//! The connector's privileges as the server's `SHOW GRANTS` lists them, and the one answer to "does this
//! account hold that privilege there".
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # Why read the grants, not try statements
//! `check` proves most privileges with a statement that touches nothing (`SELECT … LIMIT 0`, an `UPDATE …
//! WHERE 1 = 0`, `SHOW BINARY LOGS`). Three cannot be proven that way: `REPLICATION SLAVE` (only a binlog
//! dump uses it), and `LOCK TABLES` and `RELOAD` (the statements that use them take a lock, and a `LOCK TABLES
//! … READ` queued behind an open outbox transaction stalls every insert of the application behind it). Those
//! are read from the grants the session holds.
//!
//! # What counts
//! - Scopes: `*.*` covers everything; a database grant covers its tables, its name a `LIKE` pattern (`%`,
//!   `_`, `\` escapes) as the server matches it, compared by the server's `lower_case_table_names` rule; a
//!   table grant covers that table. `ALL [PRIVILEGES]` holds every privilege of its scope. Column and
//!   routine grants hold nothing the connector needs.
//! - `REVOKE … ON db.* FROM …` lines (MySQL's `partial_revokes`) take the privilege away in that database.
//! - Roles: only roles active in the connector's session count (the default roles; the connector never
//!   runs `SET ROLE`), and a `GRANT role TO …` line holds nothing itself. The caller reads the lines that
//!   include the active roles' grants: MariaDB's `SHOW GRANTS` lists them (the current role, the roles
//!   granted to it, and `PUBLIC`), MySQL's needs `USING` the active roles.

use std::fmt;

use super::NameCase;

/// A MySQL account, `'user'@'host'`, as `CURRENT_USER()` names it: what a `GRANT … TO` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The user name.
    pub user: String,
    /// The host pattern of the account (`%`, `127.0.0.1`, …).
    pub host: String,
}

impl Account {
    /// From `CURRENT_USER()`'s `user@host` (the host never holds an `@`, the user may).
    pub fn from_current_user(text: &str) -> Account {
        match text.rsplit_once('@') {
            Some((user, host)) => Account { user: user.to_string(), host: host.to_string() },
            None => Account { user: text.to_string(), host: "%".to_string() },
        }
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}'@'{}'", self.user.replace('\'', "''"), self.host.replace('\'', "''"))
    }
}

/// Where a privilege applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `*.*`.
    Global,
    /// `db.*`; in a grant the name is a `LIKE` pattern.
    Database(String),
    /// `db.table`.
    Table { database: String, table: String },
    /// Routines, proxies, and anything else that grants nothing on tables.
    Other,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => write!(f, "*.*"),
            Scope::Database(database) => write!(f, "{database}.*"),
            Scope::Table { database, table } => write!(f, "{database}.{table}"),
            Scope::Other => write!(f, "(other)"),
        }
    }
}

/// One `GRANT` or `REVOKE` line of privileges.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    /// Upper case, column lists dropped (`SELECT (a, b)` is a column grant: it holds no table privilege).
    privileges: Vec<String>,
    scope: Scope,
    revoke: bool,
}

impl Line {
    /// One `SHOW GRANTS` line's privileges and scope; `None` for any other line.
    fn parse(line: &str) -> Option<Line> {
        let line = line.trim();
        let upper = line.to_ascii_uppercase();
        let (revoke, body, to) = if upper.starts_with("GRANT ") {
            (false, &line[6..], " TO ")
        } else if upper.starts_with("REVOKE ") {
            (true, &line[7..], " FROM ")
        } else {
            return None;
        };
        let head = &body[..find_outside_quotes(body, to)?];
        let on = find_outside_quotes(head, " ON ")?;
        let privileges = split_outside(&head[..on], ',')
            .into_iter()
            .filter(|p| !p.contains('('))
            .map(|p| p.trim().to_ascii_uppercase())
            .collect();
        Some(Line { privileges, scope: parse_scope(head[on + 4..].trim()), revoke })
    }
}

/// The privilege lines of an account and of its active roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    lines: Vec<Line>,
}

impl Grants {
    /// Parses `SHOW GRANTS` lines; lines it does not understand, and role grants (`GRANT role TO …`, no
    /// `ON`), hold nothing.
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Grants {
        Grants { lines: lines.into_iter().filter_map(Line::parse).collect() }
    }

    /// Whether `privilege` (upper case, e.g. `LOCK TABLES`) is held at `target` (`*.*`, a database or a
    /// table), comparing names by `case`.
    pub fn holds(&self, privilege: &str, target: &Scope, case: NameCase) -> bool {
        let names = |line: &Line| line.privileges.iter().any(|p| p == privilege || p == "ALL PRIVILEGES" || p == "ALL");
        let granted = self.lines.iter().any(|l| !l.revoke && names(l) && covers(&l.scope, target, case));
        let revoked = self.lines.iter().any(|l| l.revoke && names(l) && covers(&l.scope, target, case));
        granted && !revoked
    }
}

/// Whether a grant at `scope` applies to `target`.
fn covers(scope: &Scope, target: &Scope, case: NameCase) -> bool {
    let same = |a: &str, b: &str| match case {
        NameCase::Sensitive => a == b,
        NameCase::Insensitive | NameCase::Unknown => a.eq_ignore_ascii_case(b),
    };
    match (scope, target) {
        (Scope::Global, _) => true,
        (Scope::Database(pattern), Scope::Database(database) | Scope::Table { database, .. }) => {
            case.like(pattern, database)
        }
        (Scope::Table { database: d, table: t }, Scope::Table { database, table }) => {
            same(d, database) && same(t, table)
        }
        _ => false,
    }
}

/// `*.*`, `` `db`.* ``, `` `db`.`table` `` (a `TABLE` keyword allowed); routines and the rest are `Other`.
fn parse_scope(text: &str) -> Scope {
    let upper = text.to_ascii_uppercase();
    if upper.starts_with("PROCEDURE ") || upper.starts_with("FUNCTION ") || upper.starts_with("PACKAGE") {
        return Scope::Other;
    }
    let text = if upper.starts_with("TABLE ") { text[6..].trim() } else { text };
    let parts = split_outside(text, '.');
    match parts.as_slice() {
        [d, t] if d.trim() == "*" && t.trim() == "*" => Scope::Global,
        [d, t] if t.trim() == "*" => Scope::Database(unquote(d.trim())),
        [d, t] => Scope::Table { database: unquote(d.trim()), table: unquote(t.trim()) },
        _ => Scope::Other,
    }
}

/// An identifier without its backquotes (a doubled backquote inside is one).
fn unquote(ident: &str) -> String {
    match ident.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
        Some(inner) => inner.replace("``", "`"),
        None => ident.to_string(),
    }
}

/// The byte offset of `needle` in `text` outside backquoted and quoted parts, matched case-insensitively.
fn find_outside_quotes(text: &str, needle: &str) -> Option<usize> {
    let mut quote: Option<u8> = None;
    let bytes = text.as_bytes();
    for i in 0..bytes.len() {
        match quote {
            Some(q) if bytes[i] == q => quote = None,
            Some(_) => {}
            None if matches!(bytes[i], b'`' | b'\'' | b'"') => quote = Some(bytes[i]),
            None => {
                if text.is_char_boundary(i)
                    && text.len() >= i + needle.len()
                    && text.is_char_boundary(i + needle.len())
                    && text[i..i + needle.len()].eq_ignore_ascii_case(needle)
                {
                    return Some(i);
                }
            }
        }
    }
    None
}

/// `text` cut at `separator` outside quotes and parentheses.
fn split_outside(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut quote, mut depth, mut start) = (None, 0usize, 0);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '`' | '\'' | '"') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => depth = depth.saturating_sub(1),
            (None, c) if c == separator && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(name: &str) -> Scope {
        Scope::Database(name.into())
    }

    fn table(d: &str, t: &str) -> Scope {
        Scope::Table { database: d.into(), table: t.into() }
    }

    /// One row per rule: the grant lines, the privilege asked, where, and the answer.
    #[test]
    fn holds_follows_the_servers_scopes() {
        let sensitive = NameCase::Sensitive;
        #[rustfmt::skip]
        let cases: &[(&str, &[&str], &str, Scope, bool)] = &[
            ("global covers a database",
             &["GRANT RELOAD, LOCK TABLES ON *.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), true),
            ("a database grant covers it",
             &["GRANT SELECT, LOCK TABLES ON `shop`.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), true),
            ("another database's does not",
             &["GRANT LOCK TABLES ON `billing`.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), false),
            ("a table grant never holds a database privilege",
             &["GRANT SELECT ON `shop`.`outbox_events` TO `cdc`@`%`"], "LOCK TABLES", db("shop"), false),
            ("a table grant covers its table",
             &["GRANT SELECT ON `shop`.`outbox_events` TO `cdc`@`%`"], "SELECT", table("shop", "outbox_events"), true),
            ("a database grant covers its tables",
             &["GRANT SELECT ON `shop`.* TO 'cdc'@'%'"], "SELECT", table("shop", "outbox_events"), true),
            ("ALL PRIVILEGES holds each",
             &["GRANT ALL PRIVILEGES ON `shop`.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), true),
            ("USAGE holds nothing",
             &["GRANT USAGE ON *.* TO `cdc`@`%` IDENTIFIED BY PASSWORD '*AB ON *.* TO x'"], "RELOAD", Scope::Global, false),
            ("a wildcard database pattern",
             &["GRANT LOCK TABLES ON `sh%`.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), true),
            ("an escaped underscore is literal",
             &["GRANT LOCK TABLES ON `my\\_db`.* TO `cdc`@`%`"], "LOCK TABLES", db("myxdb"), false),
            ("an unescaped underscore is any character",
             &["GRANT LOCK TABLES ON `my_db`.* TO `cdc`@`%`"], "LOCK TABLES", db("myxdb"), true),
            ("names compare byte for byte with lower_case_table_names=0",
             &["GRANT LOCK TABLES ON `Shop`.* TO `cdc`@`%`"], "LOCK TABLES", db("shop"), false),
            ("a column grant holds no table privilege",
             &["GRANT SELECT (`id`, `payload`) ON `shop`.`outbox_events` TO `cdc`@`%`"], "SELECT", table("shop", "outbox_events"), false),
            ("a partial revoke takes it away in that database",
             &["GRANT LOCK TABLES ON *.* TO `cdc`@`%`", "REVOKE LOCK TABLES ON `shop`.* FROM `cdc`@`%`"], "LOCK TABLES", db("shop"), false),
            ("MySQL 8 lists dynamic privileges on their own line",
             &["GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`", "GRANT BACKUP_ADMIN ON *.* TO `cdc`@`%`"], "REPLICATION CLIENT", Scope::Global, true),
            ("a role grant is no privilege",
             &["GRANT `cdc_role`@`%` TO `cdc`@`%`"], "REPLICATION SLAVE", Scope::Global, false),
            ("a routine grant holds nothing on tables",
             &["GRANT EXECUTE ON PROCEDURE `mysql`.`rds_show_configuration` TO `cdc`@`%`"], "SELECT", table("mysql", "rds_show_configuration"), false),
        ];
        for (rule, lines, privilege, target, expected) in cases {
            let grants = Grants::parse(lines.iter().copied());
            assert_eq!(grants.holds(privilege, target, sensitive), *expected, "{rule}: {lines:?}");
        }
        let grants = Grants::parse(["GRANT LOCK TABLES ON `Shop`.* TO `cdc`@`%`"]);
        assert!(grants.holds("LOCK TABLES", &db("shop"), NameCase::Insensitive), "lower_case_table_names=1");
    }

    #[test]
    fn accounts_print_as_a_grant_needs_them() {
        assert_eq!(Account::from_current_user("cdc@%").to_string(), "'cdc'@'%'");
        assert_eq!(Account::from_current_user("a@b@127.0.0.1").to_string(), "'a@b'@'127.0.0.1'");
        assert_eq!(Account::from_current_user("o'brien@%").to_string(), "'o''brien'@'%'");
    }
}
