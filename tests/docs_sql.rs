//! Every SQL statement the docs show runs as shown: each ```` ```sql ```` block of README.md and docs/*.md,
//! top to bottom (README first, then docs/ in name order), on a real MariaDB prepared as the compose demo
//! prepares its MySQL (`shop` created, then `deploy/mysql-init.sql`), as root with `shop` as the default
//! database, as a user pasting them into a client would.
//!
//! A statement may fail only with an "already exists" answer (a table, column, index, database or user the
//! reference schema or an earlier block already made): the docs repeat the reference table and the user
//! because a reader may start at any section. Anything else fails the test with the file, the line and the
//! server's message. A block that only a provider's service can run (Amazon RDS's `mysql.rds_*` procedures)
//! is marked on the line before its fence with `<!-- docs-sql: skip (the reason) -->`; a marker without a
//! reason, or not followed by a `sql` block, fails the test.

mod common;

use std::path::{Path, PathBuf};

use common::MariaDb;
use mysql_async::prelude::Queryable;

/// What marks a block that cannot run here, on the line before its fence.
const SKIP_MARKER: &str = "<!-- docs-sql: skip";

/// Server errors that mean "it is already there", each tolerated only for the statement that makes it.
const ALREADY_EXISTS: &[(u16, &str)] = &[
    (1007, "CREATE DATABASE"), // ER_DB_CREATE_EXISTS
    (1050, "CREATE TABLE"),    // ER_TABLE_EXISTS_ERROR
    (1060, "ALTER TABLE"),     // ER_DUP_FIELDNAME: ADD COLUMN of a column the reference table has
    (1061, "ALTER TABLE"),     // ER_DUP_KEYNAME: ADD INDEX of an index it has
    (1061, "CREATE INDEX"),
    (1396, "CREATE USER"), // ER_CANNOT_USER: the user exists
];

/// One ```` ```sql ```` block: where it is and its text (indentation removed).
#[derive(Debug, PartialEq)]
struct Block {
    file: String,
    /// 1-based line of its first SQL line.
    line: usize,
    sql: String,
    /// The reason given by a skip marker.
    skip: Option<String>,
}

/// The SQL blocks of one Markdown text, in order. A fence may be indented (inside a list item); the block's
/// lines lose that indentation.
fn sql_blocks(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    let mut pending_skip: Option<(usize, String)> = None;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if let Some(rest) = trimmed.strip_prefix(SKIP_MARKER) {
            let reason = rest.trim().trim_end_matches("-->").trim().trim_start_matches('(').trim_end_matches(')');
            if reason.trim().is_empty() {
                return Err(format!("{file}:{}: a skip marker needs a reason", i + 1));
            }
            pending_skip = Some((i + 1, reason.trim().to_string()));
            i += 1;
            continue;
        }
        if trimmed.starts_with("```") {
            let indent = lines[i].len() - trimmed.len();
            let info = trimmed.trim_start_matches('`').trim();
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && !lines[end].trim_start().starts_with("```") {
                end += 1;
            }
            let is_sql = info.split_whitespace().next() == Some("sql");
            if let Some((at, _)) = &pending_skip {
                if !is_sql {
                    return Err(format!("{file}:{at}: a skip marker not followed by a sql block"));
                }
            }
            if is_sql {
                let sql = lines[start..end]
                    .iter()
                    .map(|l| l.get(indent.min(l.len() - l.trim_start().len())..).unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n");
                blocks.push(Block {
                    file: file.to_string(),
                    line: start + 1,
                    sql,
                    skip: pending_skip.take().map(|(_, r)| r),
                });
            }
            pending_skip = None;
            i = end + 1;
            continue;
        }
        if let Some((at, _)) = &pending_skip {
            if !trimmed.is_empty() {
                return Err(format!("{file}:{at}: a skip marker not followed by a sql block"));
            }
        }
        i += 1;
    }
    if let Some((at, _)) = pending_skip {
        return Err(format!("{file}:{at}: a skip marker not followed by a sql block"));
    }
    Ok(blocks)
}

/// Splits a block into statements at `;` outside quotes and comments; each with the offset of its line
/// within the block. Comments (`-- …`, `# …`, `/* … */`) are kept in the text the server gets.
fn statements(sql: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut line = 0;
    let mut start_line = None;
    let mut chars = sql.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        }
        if let Some(q) = quote {
            current.push(c);
            if c == '\\' && q != '`' {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            } else if c == q {
                quote = None;
            }
            continue;
        }
        let comment = (c == '-' && chars.peek() == Some(&'-')) || c == '#';
        if comment {
            // To the end of the line.
            current.push(c);
            while let Some(&next) = chars.peek() {
                if next == '\n' {
                    break;
                }
                current.push(next);
                chars.next();
            }
            continue;
        }
        if c == '/' && chars.peek() == Some(&'*') {
            current.push(c);
            let mut prev = ' ';
            for next in chars.by_ref() {
                if next == '\n' {
                    line += 1;
                }
                current.push(next);
                if prev == '*' && next == '/' {
                    break;
                }
                prev = next;
            }
            continue;
        }
        if c == ';' {
            if start_line.is_some() {
                out.push((start_line.take().unwrap_or(0), current.trim().to_string()));
            }
            current.clear();
            continue;
        }
        if matches!(c, '\'' | '"' | '`') {
            quote = Some(c);
        }
        if !c.is_whitespace() && start_line.is_none() {
            start_line = Some(line);
        }
        current.push(c);
    }
    if let Some(at) = start_line {
        out.push((at, current.trim().to_string()));
    }
    // A statement that is only comments is no statement.
    out.retain(|(_, s)| s.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--")));
    out
}

/// Whether a server error is an "already exists" answer to this statement.
fn already_exists(code: u16, statement: &str) -> bool {
    let head = statement
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_uppercase();
    ALREADY_EXISTS.iter().any(|(c, prefix)| *c == code && head == *prefix)
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, then every Markdown file of docs/ in name order.
fn documents() -> Vec<PathBuf> {
    let root = repository();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    std::iter::once(root.join("README.md")).chain(docs).collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repository()).unwrap_or(path).display().to_string()
}

/// Guards against a statement the docs tell users to run that the server rejects: the README and
/// docs/MANAGED-MYSQL.md granted `LOCK TABLES` on a table (ERROR 1144: it is a database privilege), and the
/// relay's grants named a user no block created (ERROR 1133).
#[tokio::test(flavor = "multi_thread")]
async fn every_sql_block_of_the_docs_runs_as_shown() {
    let mut blocks = Vec::new();
    for path in documents() {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        blocks.extend(sql_blocks(&relative(&path), &text).unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(blocks.iter().filter(|b| b.skip.is_none()).count() >= 5, "found the docs' SQL: {blocks:#?}");

    let db = MariaDb::builder().skip_schema().start();
    // As docker-compose.yml's MySQL: MYSQL_DATABASE creates `shop`, then the init script runs.
    db.sql("CREATE DATABASE shop");
    let init = std::fs::read_to_string(repository().join("deploy/mysql-init.sql")).expect("read mysql-init.sql");
    let opts = mysql_async::OptsBuilder::from_opts(db.opts_root()).db_name(Some("shop"));
    let mut conn = mysql_async::Conn::new(opts).await.expect("connect as root");
    for (_, statement) in statements(&init) {
        conn.query_drop(&statement).await.unwrap_or_else(|e| panic!("deploy/mysql-init.sql: {e}\n{statement}"));
    }

    let mut failures = Vec::new();
    let mut ran = 0;
    for block in &blocks {
        if let Some(reason) = &block.skip {
            eprintln!("{}:{}: skipped ({reason})", block.file, block.line);
            continue;
        }
        for (offset, statement) in statements(&block.sql) {
            let at = format!("{}:{}", block.file, block.line + offset);
            match conn.query_drop(&statement).await {
                Ok(()) => ran += 1,
                Err(mysql_async::Error::Server(e)) if already_exists(e.code, &statement) => {
                    eprintln!("{at}: already there ({} {})", e.code, e.message);
                    ran += 1;
                }
                Err(e) => failures.push(format!("{at}: {e}\n    {}", statement.replace('\n', "\n    "))),
            }
        }
    }
    assert!(failures.is_empty(), "{} statement(s) of the docs fail as shown:\n{}", failures.len(), failures.join("\n"));
    eprintln!("{ran} statements of {} blocks ran", blocks.len());
}

#[test]
fn blocks_and_statements_are_found_as_a_reader_sees_them() {
    let text = "intro\n\n1. step:\n\n   ```sql\n   CREATE TABLE t (a INT); -- a; comment\n   INSERT INTO t VALUES \
                (';');\n   ```\n\n<!-- docs-sql: skip (needs Amazon RDS) -->\n```sql\nCALL mysql.rds_x();\n```\n\n\
                ```bash\necho 'not sql;'\n```\n";
    let blocks = sql_blocks("x.md", text).expect("well-formed");
    assert_eq!(blocks.len(), 2);
    assert_eq!((blocks[0].line, blocks[0].skip.as_deref()), (6, None));
    assert_eq!(blocks[1].skip.as_deref(), Some("needs Amazon RDS"));
    assert_eq!(
        statements(&blocks[0].sql),
        vec![(0, "CREATE TABLE t (a INT)".to_string()), (1, "-- a; comment\nINSERT INTO t VALUES (';')".to_string())]
    );
    assert_eq!(statements("-- only a comment\n"), Vec::<(usize, String)>::new());
    assert_eq!(statements("SELECT '\\';'; SELECT 2"), vec![(0, "SELECT '\\';'".into()), (0, "SELECT 2".into())]);

    for bad in ["<!-- docs-sql: skip -->\n```sql\nSELECT 1;\n```\n", "<!-- docs-sql: skip (x) -->\nprose\n"] {
        assert!(sql_blocks("x.md", bad).is_err(), "{bad:?} must be refused");
    }
    assert!(already_exists(1050, "CREATE TABLE shop.t (a INT)"));
    assert!(already_exists(1396, "-- the user\nCREATE USER 'cdc'@'%'"));
    assert!(!already_exists(1396, "DROP USER 'cdc'@'%'"));
    assert!(!already_exists(1144, "GRANT SELECT, LOCK TABLES ON shop.t TO 'cdc'@'%'"));
}
