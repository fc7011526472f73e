//! Thread scheduling: the binlog reader is the critical stage of a catch-up, and the other threads have slack.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! In a catch-up of 1M events on 2 cores shared with the database and the broker, the pipeline waited for
//! the reader half of the time (3.1-3.3 s of 6.4 s), while the reader, runnable nearly all of the time, ran
//! for only 4.4 s of it: the wakeups of the threads behind it (the pipeline's, librdkafka's broker and
//! delivery threads) kept preempting it. Linux lets a thread give up wakeup preemption without privileges:
//! a `SCHED_BATCH` thread keeps its fair share of CPU at the same nice weight, and runs at once on an idle
//! core, but does not preempt a running thread when it wakes. So the main thread, which runs the pipeline,
//! switches to `SCHED_BATCH` once the async runtime has started the worker that runs the reader (that one
//! stays `SCHED_NORMAL`) and before the producer exists: threads started afterwards inherit the policy,
//! librdkafka's among them. The cost is latency under contention only, at most a scheduler tick for the
//! pipeline to get a busy core (docs/PERFORMANCE.md has the measurements).

/// Makes the calling thread `SCHED_BATCH`, and with it the threads it starts from now on (Linux; elsewhere
/// nothing).
///
/// # Errors
/// The OS error when the policy cannot be set (a seccomp profile may forbid it); nothing depends on it.
pub fn yield_wakeups() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The design depends on inheritance: librdkafka's threads, started by the pipeline's thread after the
    /// switch, must be `SCHED_BATCH` too.
    #[test]
    fn threads_started_afterwards_inherit_it() {
        let policies = std::thread::spawn(|| {
            // SAFETY: sched_getscheduler(0) only reads the calling thread's policy.
            let before = unsafe { libc::sched_getscheduler(0) };
            yield_wakeups().unwrap();
            let own = unsafe { libc::sched_getscheduler(0) };
            let child = std::thread::spawn(|| unsafe { libc::sched_getscheduler(0) }).join().unwrap();
            (before, own, child)
        })
        .join()
        .unwrap();
        assert_eq!(policies, (libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_BATCH));
    }
}
