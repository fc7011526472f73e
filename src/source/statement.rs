//! What a binlog QUERY event's statement is, as far as outbox rows and transaction boundaries care.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! A ROW-format binlog carries DDL and transaction control as statements; a write logged as a statement
//! (a session with `binlog_format=STATEMENT` or `MIXED`) carries no rows the connector could decode. The
//! reader must tell the two apart without a SQL parser: [`classify`] reads the leading keywords, and for
//! INSERT/REPLACE/LOAD DATA the target table. Anything it cannot place is [`Statement::Other`], which the
//! reader treats as a write whenever the statement names an outbox table ([`names_table`]): a false alarm
//! stops the connector with a clear error, a miss would lose events silently.

/// The kind of a logged statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// `BEGIN` / `START TRANSACTION`.
    Begin,
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK` (the whole transaction).
    Rollback,
    /// `SAVEPOINT name`.
    Savepoint(String),
    /// `ROLLBACK TO [SAVEPOINT] name`: undoes the transaction's changes since that savepoint.
    RollbackTo(String),
    /// `RELEASE SAVEPOINT name`.
    Release,
    /// `XA START` / `XA BEGIN`: an XA branch begins.
    XaStart,
    /// `XA END`.
    XaEnd,
    /// `XA COMMIT` (of a prepared branch, or `… ONE PHASE`).
    XaCommit,
    /// `XA ROLLBACK`.
    XaRollback,
    /// INSERT, REPLACE or LOAD DATA into `target` (`(database, table)`, database `None` for the session's
    /// default database), or into a table we could not read (`target: None`).
    Insert {
        /// The table written.
        target: Option<(Option<String>, String)>,
    },
    /// UPDATE or DELETE: changes existing rows, inserts none.
    UpdateOrDelete,
    /// Data definition and administration (CREATE, ALTER, DROP, RENAME, TRUNCATE, GRANT, …): no rows.
    Ddl,
    /// Anything else.
    Other,
}

/// Classifies a logged statement by its leading keywords (comments skipped, versioned comments read).
pub fn classify(sql: &[u8]) -> Statement {
    let tokens = Tokens::new(sql);
    let words: Vec<Token> = tokens.take(16).collect();
    let word = |i: usize| words.get(i).and_then(Token::keyword);
    let ident = |i: usize| words.get(i).and_then(Token::ident);
    let Some(first) = word(0) else { return Statement::Other };
    match first.as_str() {
        "BEGIN" if words.len() == 1 || word(1).as_deref() == Some("WORK") => Statement::Begin,
        "START" if word(1).as_deref() == Some("TRANSACTION") => Statement::Begin,
        "COMMIT" => Statement::Commit,
        "ROLLBACK" => match (word(1).as_deref(), word(2).as_deref()) {
            (Some("TO"), Some("SAVEPOINT")) => ident(3).map_or(Statement::Other, Statement::RollbackTo),
            (Some("TO"), _) => ident(2).map_or(Statement::Other, Statement::RollbackTo),
            (Some("WORK"), Some("TO")) => match word(3).as_deref() {
                Some("SAVEPOINT") => ident(4).map_or(Statement::Other, Statement::RollbackTo),
                _ => ident(3).map_or(Statement::Other, Statement::RollbackTo),
            },
            _ => Statement::Rollback,
        },
        "SAVEPOINT" => ident(1).map_or(Statement::Other, Statement::Savepoint),
        "RELEASE" => Statement::Release,
        "XA" => match word(1).as_deref() {
            Some("START" | "BEGIN") => Statement::XaStart,
            Some("END") => Statement::XaEnd,
            Some("COMMIT") => Statement::XaCommit,
            Some("ROLLBACK") => Statement::XaRollback,
            _ => Statement::Other,
        },
        "INSERT" | "REPLACE" => {
            let mut i = 1;
            while matches!(word(i).as_deref(), Some("LOW_PRIORITY" | "DELAYED" | "HIGH_PRIORITY" | "IGNORE")) {
                i += 1;
            }
            if word(i).as_deref() == Some("INTO") {
                i += 1;
            }
            Statement::Insert { target: table_at(&words, i) }
        }
        "LOAD" if matches!(word(1).as_deref(), Some("DATA" | "XML")) => {
            // LOAD DATA … INFILE 'file' [REPLACE | IGNORE] INTO TABLE name
            let into = (2..words.len())
                .find(|&i| word(i).as_deref() == Some("INTO") && word(i + 1).as_deref() == Some("TABLE"));
            Statement::Insert { target: into.and_then(|i| table_at(&words, i + 2)) }
        }
        "UPDATE" | "DELETE" => Statement::UpdateOrDelete,
        "CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE" | "GRANT" | "REVOKE" | "ANALYZE" | "OPTIMIZE"
        | "REPAIR" | "FLUSH" | "INSTALL" | "UNINSTALL" => Statement::Ddl,
        _ => Statement::Other,
    }
}

/// The table name starting at token `i`: `name` or `db.name`.
fn table_at(words: &[Token], i: usize) -> Option<(Option<String>, String)> {
    let first = words.get(i)?.ident()?;
    match (words.get(i + 1), words.get(i + 2).and_then(Token::ident)) {
        (Some(Token::Dot), Some(table)) => Some((Some(first), table)),
        (Some(Token::Dot), None) => None,
        _ => Some((None, first)),
    }
}

/// Whether the statement has an identifier equal to `name`, compared case-insensitively: the
/// conservative test for a statement that [`classify`] could not place.
pub fn names_table(sql: &[u8], name: &str) -> bool {
    Tokens::new(sql).any(|t| t.ident().is_some_and(|id| id.to_lowercase() == name.to_lowercase()))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An unquoted word (keyword or identifier).
    Word(String),
    /// A `` `quoted` `` or `"quoted"` identifier.
    Quoted(String),
    /// `.`
    Dot,
    /// Anything else: punctuation, a string or number literal.
    Other,
}

impl Token {
    fn keyword(&self) -> Option<String> {
        match self {
            Token::Word(w) => Some(w.to_ascii_uppercase()),
            _ => None,
        }
    }

    fn ident(&self) -> Option<String> {
        match self {
            Token::Word(w) | Token::Quoted(w) => Some(w.clone()),
            _ => None,
        }
    }
}

/// A lexer just good enough for leading keywords and names: skips whitespace and comments, reads the
/// contents of versioned comments (`/*!50100 … */`, `/*M!100100 … */`) as SQL, strings as one token.
struct Tokens<'a> {
    sql: &'a [u8],
    at: usize,
}

impl<'a> Tokens<'a> {
    fn new(sql: &'a [u8]) -> Self {
        Tokens { sql, at: 0 }
    }

    fn peek(&self, offset: usize) -> Option<u8> {
        self.sql.get(self.at + offset).copied()
    }

    /// Skips whitespace, comments and the markers of versioned comments.
    fn skip_blank(&mut self) {
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(c), _) if c.is_ascii_whitespace() => self.at += 1,
                (Some(b'/'), Some(b'*')) => {
                    let versioned = match (self.peek(2), self.peek(3)) {
                        (Some(b'!'), _) => Some(3),
                        (Some(b'M'), Some(b'!')) => Some(4),
                        _ => None,
                    };
                    match versioned {
                        Some(marker) => {
                            self.at += marker;
                            while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
                                self.at += 1;
                            }
                        }
                        None => {
                            let rest = &self.sql[self.at + 2..];
                            self.at += 2 + rest.windows(2).position(|w| w == b"*/").map_or(rest.len(), |p| p + 2);
                        }
                    }
                }
                // The end of a versioned comment.
                (Some(b'*'), Some(b'/')) => self.at += 2,
                (Some(b'#'), _) | (Some(b'-'), Some(b'-')) => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                _ => return,
            }
        }
    }

    /// Reads a quoted run ending at an unescaped `quote` (doubled quotes and backslashes escape).
    fn quoted(&mut self, quote: u8) -> String {
        self.at += 1;
        let mut out = Vec::new();
        while let Some(c) = self.peek(0) {
            self.at += 1;
            if c == quote {
                if self.peek(0) == Some(quote) {
                    out.push(quote);
                    self.at += 1;
                    continue;
                }
                break;
            }
            if c == b'\\' && quote != b'`' {
                if let Some(next) = self.peek(0) {
                    out.push(next);
                    self.at += 1;
                }
                continue;
            }
            out.push(c);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Iterator for Tokens<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        self.skip_blank();
        let c = self.peek(0)?;
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
        Some(match c {
            b'`' | b'"' => Token::Quoted(self.quoted(c)),
            b'\'' => {
                self.quoted(c);
                Token::Other
            }
            b'.' => {
                self.at += 1;
                Token::Dot
            }
            c if word(c) => {
                let start = self.at;
                while self.peek(0).is_some_and(word) {
                    self.at += 1;
                }
                Token::Word(String::from_utf8_lossy(&self.sql[start..self.at]).into_owned())
            }
            _ => {
                self.at += 1;
                Token::Other
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(db: Option<&str>, table: &str) -> Statement {
        Statement::Insert { target: Some((db.map(Into::into), table.into())) }
    }

    /// One rule per row: what the reader must take each logged statement for.
    #[test]
    fn classifies_logged_statements() {
        let cases: &[(&str, Statement)] = &[
            ("BEGIN", Statement::Begin),
            ("begin", Statement::Begin),
            ("START TRANSACTION", Statement::Begin),
            ("COMMIT", Statement::Commit),
            ("ROLLBACK", Statement::Rollback),
            ("SAVEPOINT `s1`", Statement::Savepoint("s1".into())),
            ("ROLLBACK TO `s1`", Statement::RollbackTo("s1".into())),
            ("ROLLBACK TO SAVEPOINT s1", Statement::RollbackTo("s1".into())),
            ("ROLLBACK WORK TO SAVEPOINT `a``b`", Statement::RollbackTo("a`b".into())),
            ("RELEASE SAVEPOINT s1", Statement::Release),
            ("XA START X'31',X'',1", Statement::XaStart),
            ("XA END X'31',X'',1", Statement::XaEnd),
            ("XA COMMIT X'31',X'',1", Statement::XaCommit),
            ("XA COMMIT X'31',X'',1 ONE PHASE", Statement::XaCommit),
            ("XA ROLLBACK X'31',X'',1", Statement::XaRollback),
            ("INSERT INTO outbox_events VALUES (1)", insert(None, "outbox_events")),
            (
                "insert low_priority ignore into `shop`.`Outbox_Events` (id) values (1)",
                insert(Some("shop"), "Outbox_Events"),
            ),
            ("INSERT shop . outbox_events SET id = 1", insert(Some("shop"), "outbox_events")),
            (
                "/* app=checkout */ INSERT INTO shop.outbox_events SELECT * FROM t",
                insert(Some("shop"), "outbox_events"),
            ),
            ("-- note\nREPLACE DELAYED INTO \"outbox\" VALUES (1)", insert(None, "outbox")),
            ("INSERT INTO orders SELECT * FROM outbox_events", insert(None, "orders")),
            (
                "LOAD DATA INFILE '/tmp/x' REPLACE INTO TABLE `shop`.`outbox_events`",
                insert(Some("shop"), "outbox_events"),
            ),
            ("LOAD DATA LOCAL INFILE 'a.csv' INTO TABLE outbox_events", insert(None, "outbox_events")),
            ("INSERT INTO", Statement::Insert { target: None }),
            ("UPDATE outbox_events SET attempts = 1", Statement::UpdateOrDelete),
            ("DELETE FROM shop.outbox_events", Statement::UpdateOrDelete),
            ("/*!40000 ALTER TABLE `outbox_events` DISABLE KEYS */", Statement::Ddl),
            ("CREATE TABLE shop.outbox_events (id INT)", Statement::Ddl),
            ("TRUNCATE TABLE outbox_events", Statement::Ddl),
            ("DROP TEMPORARY TABLE IF EXISTS `t`", Statement::Ddl),
            ("WITH x AS (SELECT 1) UPDATE outbox_events SET id = 1", Statement::Other),
            ("", Statement::Other),
        ];
        for (sql, expected) in cases {
            assert_eq!(classify(sql.as_bytes()), *expected, "{sql}");
        }
    }

    /// A statement the classifier cannot place counts as naming a table when any identifier equals its
    /// name case-insensitively, quoted or not; strings and comments do not count.
    #[test]
    fn finds_table_names() {
        let cases: &[(&str, bool)] = &[
            ("WITH x AS (SELECT 1) UPDATE outbox_events SET id = 1", true),
            ("DO (SELECT COUNT(*) FROM `shop`.`OUTBOX_EVENTS`)", true),
            ("SELECT 'outbox_events'", false),
            ("SELECT 1 /* outbox_events */", false),
            ("SELECT outbox_events_2 FROM t", false),
        ];
        for (sql, expected) in cases {
            assert_eq!(names_table(sql.as_bytes(), "outbox_events"), *expected, "{sql}");
        }
    }
}
