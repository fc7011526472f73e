//! What a check found: one [`Finding`] per setting (expected, actual, the fix), gathered in a [`Report`] that
//! `outbox-cdc check` prints and `run` turns into a definite error. Preflight (the source), the managed-MySQL
//! rules and the Kafka check all report this way.
//!
//! Floor 2 (docs/ARCHITECTURE.md): imports floors 0-1 (vocabulary, error, metrics).

use std::fmt;

use crate::error::{Error, Result};

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As required.
    Ok,
    /// Works, but worth attention.
    Warn,
    /// The connector cannot run correctly like this.
    Fail,
}

/// One checked setting.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What was checked.
    pub setting: String,
    /// The required value.
    pub expected: String,
    /// What the server has.
    pub actual: String,
    /// Outcome.
    pub status: Status,
    /// How to fix it (empty when OK).
    pub fix: String,
}

/// All findings for one server.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Findings in check order.
    pub findings: Vec<Finding>,
}

impl Report {
    pub(crate) fn push(&mut self, setting: &str, expected: &str, actual: &str, ok: bool, fix: &str) {
        self.findings.push(Finding {
            setting: setting.into(),
            expected: expected.into(),
            actual: actual.into(),
            status: if ok { Status::Ok } else { Status::Fail },
            fix: if ok { String::new() } else { fix.into() },
        });
    }

    pub(crate) fn warn(&mut self, setting: &str, expected: &str, actual: &str, fix: &str) {
        self.findings.push(Finding {
            setting: setting.into(),
            expected: expected.into(),
            actual: actual.into(),
            status: Status::Warn,
            fix: fix.into(),
        });
    }

    /// Failed findings.
    pub fn failures(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.status == Status::Fail)
    }

    /// A definite error listing every failure, or `Ok` when nothing failed.
    ///
    /// # Errors
    /// A definite error when any check failed.
    pub fn into_result(self) -> Result<()> {
        let failures: Vec<String> = self
            .failures()
            .map(|f| format!("{}: expected {}, found {} — {}", f.setting, f.expected, f.actual, f.fix))
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::definite(format!("preflight failed:\n  {}", failures.join("\n  "))))
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for finding in &self.findings {
            let mark = match finding.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            writeln!(f, "[{mark}] {}: expected {}, actual {}", finding.setting, finding.expected, finding.actual)?;
            if !finding.fix.is_empty() {
                writeln!(f, "       fix: {}", finding.fix)?;
            }
        }
        Ok(())
    }
}
