//! The process allocator: mimalloc, for the Rust code and, through its `override` feature, for librdkafka's
//! C code too (`malloc` and `free` resolve to mimalloc in binaries of this crate).
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! The C side is where it matters. librdkafka allocates each record's message and headers on the pipeline
//! thread and frees them on its delivery thread. glibc's malloc serves that pattern from the arena's bins
//! under the arena lock, never from its thread cache: in a profile of the batched catch-up, glibc's
//! `_int_malloc` (called from `rd_kafka_header_add` and `rd_kafka_msg_new`) took a fifth of the pipeline
//! thread's time. mimalloc frees another thread's block with one atomic push and its owner reuses it.
//!
//! mimalloc 3 by default keeps freed pages for a second before returning them and commits arenas eagerly;
//! with librdkafka's churn that doubled the peak RSS of a catch-up. [`tune`] commits on demand and returns
//! freed pages after 100 ms, which brings the peak RSS below glibc's (docs/PERFORMANCE.md). Returning them
//! at once (0 ms) saved another 4 MB but cost CPU in page faults and TLB flushes (the snapshot used 20%
//! more); set from `main`, the eager commit came too late (peak RSS 63 MB instead of 31-39 MB).

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc 3's `mi_option_arena_eager_commit` (`mi_option_e` in mimalloc.h; retired options keep their
/// numbers, so these do not move). The Rust bindings name only mimalloc 2's options.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
/// mimalloc 3's `mi_option_purge_delay`, in milliseconds.
const PURGE_DELAY: mi_option_t = 15;

/// Sets the allocator's options. Eager commit is decided when mimalloc reserves its first arena, at the
/// process's first allocation, so binaries run this from `.preinit_array` on Linux (before any constructor,
/// see [`crate::tune_allocator_before_main`]); `main` calls it too, which is all other systems get.
pub extern "C" fn tune() {
    // SAFETY: mi_option_set stores a number in mimalloc's option table; it is thread-safe and may be called
    // at any time (options are read when they are used).
    unsafe {
        mi_option_set(PURGE_DELAY, 100);
        mi_option_set(ARENA_EAGER_COMMIT, 0);
    }
}

/// Registers [`tune`] in the binary's `.preinit_array`: the dynamic loader runs it before the constructors
/// of the program and of its libraries, before anything allocates. In each binary's root module.
#[macro_export]
macro_rules! tune_allocator_before_main {
    () => {
        #[cfg(target_os = "linux")]
        #[used]
        #[link_section = ".preinit_array"]
        static TUNE_ALLOCATOR: extern "C" fn() = $crate::allocator::tune;
    };
}

#[cfg(test)]
mod tests {
    use libmimalloc_sys::mi_option_get;

    use super::*;

    fn option(option: mi_option_t) -> std::ffi::c_long {
        // SAFETY: mi_option_get reads mimalloc's option table; thread-safe, any time.
        unsafe { mi_option_get(option) }
    }

    #[test]
    fn option_numbers_are_mimalloc_3s() {
        // Defaults from mimalloc 3's options.c: a wrong number would read another option's default.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(option(PURGE_DELAY), 1000, "purge_delay");
        }
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
            assert_eq!(option(ARENA_EAGER_COMMIT), 2, "arena_eager_commit");
        }
        tune();
        assert_eq!((option(PURGE_DELAY), option(ARENA_EAGER_COMMIT)), (100, 0));
    }
}
