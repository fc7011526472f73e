//! Child processes that die with the test: spawned with `PR_SET_PDEATHSIG = SIGKILL` from one
//! long-lived spawner thread, signalled by pid, reaped with bounded waits.
//!
//! # Why a spawner thread
//! Linux delivers the parent-death signal when the *thread* that forked the child exits, not the
//! process. A server spawned from a `spawn_blocking` thread (reaped after 10 s idle) or from a test
//! thread that ends before the owner is dropped would be killed early. The spawner thread lives until
//! the test binary exits, so the signal fires exactly when the test binary dies (including SIGKILL
//! from a CI timeout, when no `Drop` runs).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::raw::{c_int, c_ulong};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `SIGKILL`: immediate death, no cleanup (a crash).
pub const SIGKILL: c_int = 9;
/// `SIGTERM`: ask for a graceful shutdown.
pub const SIGTERM: c_int = 15;
const PR_SET_PDEATHSIG: c_int = 1;

extern "C" {
    fn prctl(option: c_int, ...) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn geteuid() -> u32;
    fn atexit(cb: extern "C" fn()) -> c_int;
}

/// Directories to delete when the test binary exits (shared fixtures kept in statics, which are
/// never dropped).
static REMOVE_AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Deletes `dir` (recursively) when the test binary exits normally, whether tests passed or not.
pub fn remove_dir_at_exit(dir: PathBuf) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a plain extern "C" fn; atexit has no other preconditions.
        unsafe {
            atexit(remove_registered_dirs);
        }
    });
    REMOVE_AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
}

extern "C" fn remove_registered_dirs() {
    if let Ok(dirs) = REMOVE_AT_EXIT.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Whether the tests run as root (servers then need `--user=root`).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

/// Spawns `cmd` so that the child gets SIGKILL when the test binary dies.
///
/// # Errors
/// The spawn error (e.g. binary not found).
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe prctl(2).
    unsafe {
        cmd.pre_exec(|| {
            if prctl(PR_SET_PDEATHSIG, SIGKILL as c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start harness spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender.lock().unwrap_or_else(|e| e.into_inner()).send((cmd, reply_tx)).expect("harness spawner thread is gone");
    reply_rx.recv().expect("harness spawner thread dropped the request")
}

/// Sends `sig` to the child unless it has already exited.
pub fn signal(child: &mut Child, sig: c_int) {
    if let Ok(None) = child.try_wait() {
        // SAFETY: kill(2) on a pid that is ours: try_wait just saw it not yet reaped, and only this
        // `Child` (borrowed mutably) can reap it, so the pid cannot have been recycled.
        unsafe {
            kill(child.id() as c_int, sig);
        }
    }
}

/// Waits up to `timeout` for the child to exit; `None` if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(e) => panic!("waiting for child {}: {e}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILL and reap. Returns the exit status (or `None` if it could not be reaped).
pub fn kill_now(child: &mut Child) -> Option<ExitStatus> {
    signal(child, SIGKILL);
    child.wait().ok()
}

/// SIGTERM, wait up to `grace`, then SIGKILL. Returns the status and whether the exit was graceful.
pub fn terminate(child: &mut Child, grace: Duration) -> (ExitStatus, bool) {
    if let Ok(Some(status)) = child.try_wait() {
        return (status, true);
    }
    signal(child, SIGTERM);
    match wait_timeout(child, grace) {
        Some(status) => (status, true),
        None => (kill_now(child).expect("reap after SIGKILL"), false),
    }
}

/// Opens `path` for appending (created if missing), for a child's stdout/stderr.
pub fn append_log(path: &Path) -> Stdio {
    let file: File = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open log {}: {e}", path.display()));
    Stdio::from(file)
}
