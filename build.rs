//! Build script: the commit the binary is built from, for the `outbox_cdc_build_info` gauge
//! (`src/metrics.rs` reads it as `OUTBOX_CDC_COMMIT`) and `--version` (`OUTBOX_CDC_VERSION`).
//!
//! In order: `OUTBOX_CDC_COMMIT` from the environment (`scripts/release` sets it, with `-dirty` for a work
//! tree with uncommitted changes; a Docker build passes it as a build argument, since `.dockerignore` keeps
//! `.git` out of the context); else `git rev-parse` of the source tree; else nothing, and the gauge says
//! `unknown` (a source tarball, a checkout without git). The script reruns only when the variable or the
//! checked-out commit changes, not on every edit.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=OUTBOX_CDC_COMMIT");
    let commit = commit();
    // `outbox-cdc --version`: the package version and the commit.
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=OUTBOX_CDC_VERSION={version} ({})", commit.as_deref().unwrap_or("unknown"));
}

/// The commit, from the environment or git; with git, also tells cargo what to watch.
fn commit() -> Option<String> {
    if let Ok(commit) = std::env::var("OUTBOX_CDC_COMMIT").map(|c| c.trim().to_string()) {
        if !commit.is_empty() {
            // rustc sees the variable itself: `option_env!` reads it.
            return Some(commit);
        }
    }
    // Only this repository's commit: a source tarball unpacked inside some other checkout is not built from it.
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok().and_then(|d| std::fs::canonicalize(d).ok());
    let top = git(&["rev-parse", "--show-toplevel"]).and_then(|t| std::fs::canonicalize(t).ok());
    if dir.is_none() || dir != top {
        return None;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    if let Some(commit) = &commit {
        println!("cargo:rustc-env=OUTBOX_CDC_COMMIT={commit}");
    }
    // What moves HEAD: a checkout (HEAD), a commit on the branch (its loose ref, or packed-refs once packed).
    // Only existing files: cargo reruns the script on every build for a path that does not exist.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"]), git(&["rev-parse", "--git-path", "packed-refs"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    for path in watched.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    commit
}

/// `git args` in the package's directory: its trimmed output, or `None` when git is missing, fails or
/// this is not a checkout.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let output = Command::new("git").args(args).current_dir(&dir).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| {
        // `--git-path` answers relative to the directory it ran in.
        match Path::new(text).is_relative() && args.contains(&"--git-path") {
            true => Path::new(&dir).join(text).to_string_lossy().into_owned(),
            false => text.to_string(),
        }
    })
}
