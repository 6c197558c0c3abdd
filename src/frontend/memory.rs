//! Giving the memory a burst of requests freed back to the operating system once the process
//! goes idle.
//!
//! glibc's allocator keeps what is freed in its arenas for reuse, so after a burst (large
//! messages, a cursor's buffered batch, many connections at once) the resident size stays at
//! its peak although the data is gone. A thread started with the first listener looks at a
//! process-wide activity count (bumped for every request and every closed connection) every
//! [`IDLE_CHECK`]: when it moved since the last trim but not since the previous look, the
//! process has just gone idle and `malloc_trim(0)` returns every whole free page. A busy
//! process is never trimmed, and an idle one once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the trimming thread looks at the activity count: also how long the process must
/// stay idle before it trims.
pub const IDLE_CHECK: Duration = Duration::from_secs(2);

/// Requests served and connections closed, process-wide.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// A request was served or a connection closed.
pub(super) fn note_activity() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
}

/// Starts the trimming thread, once per process (later calls do nothing).
pub(super) fn start_idle_trimmer() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let started = std::thread::Builder::new()
            .name("idle-trim".into())
            .spawn(|| {
                let mut watch = IdleWatch::new(ACTIVITY.load(Ordering::Relaxed));
                loop {
                    std::thread::sleep(IDLE_CHECK);
                    if watch.went_idle(ACTIVITY.load(Ordering::Relaxed)) {
                        release_free_memory();
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the idle memory trimmer");
        }
    });
}

/// When to trim, from successive readings of the activity count.
#[derive(Debug, Clone, Copy)]
struct IdleWatch {
    /// The count at the previous look.
    seen: u64,
    /// The count at the last trim (or at the start).
    trimmed_at: u64,
}

impl IdleWatch {
    fn new(now: u64) -> Self {
        IdleWatch {
            seen: now,
            trimmed_at: now,
        }
    }

    /// Whether the process has just gone idle: it was active since the last trim, and not
    /// since the previous look.
    fn went_idle(&mut self, now: u64) -> bool {
        let idle = now == self.seen && now != self.trimmed_at;
        if idle {
            self.trimmed_at = now;
        }
        self.seen = now;
        idle
    }
}

/// Returns the allocator's free pages to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    extern "C" {
        /// glibc: releases free memory at the top of every arena's heap and every whole free
        /// page inside them; returns 1 when some was released.
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: malloc_trim takes no pointers and only walks the allocator's own state under
    // its arena locks; it is safe to call from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

/// Other allocators give memory back on their own.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// One of glibc's allocator settings (mallopt(3)), the same as its `MALLOC_*_` environment
/// variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorSetting {
    /// `M_TRIM_THRESHOLD` (`MALLOC_TRIM_THRESHOLD_`): free memory at the top of the heap past
    /// which `free` gives it back.
    TrimThreshold,
    /// `M_TOP_PAD` (`MALLOC_TOP_PAD_`): extra memory asked for whenever the heap grows.
    TopPad,
    /// `M_MMAP_THRESHOLD` (`MALLOC_MMAP_THRESHOLD_`): blocks this large or larger are mapped
    /// on their own and unmapped when freed; setting it also stops glibc from raising it as
    /// mapped blocks are freed.
    MmapThreshold,
    /// `M_ARENA_MAX` (`MALLOC_ARENA_MAX`): most arenas threads allocate from.
    ArenaMax,
}

impl AllocatorSetting {
    /// The environment variable that sets it when the process starts.
    pub fn env_var(self) -> &'static str {
        match self {
            AllocatorSetting::TrimThreshold => "MALLOC_TRIM_THRESHOLD_",
            AllocatorSetting::TopPad => "MALLOC_TOP_PAD_",
            AllocatorSetting::MmapThreshold => "MALLOC_MMAP_THRESHOLD_",
            AllocatorSetting::ArenaMax => "MALLOC_ARENA_MAX",
        }
    }
}

/// Sets one of glibc's allocator settings; returns whether the allocator took it. Meant for
/// the start of `main`, before other threads allocate.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn set_allocator(setting: AllocatorSetting, value: i32) -> bool {
    extern "C" {
        /// glibc: sets one allocator parameter; returns 1 on success.
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    // glibc's <malloc.h>.
    let param = match setting {
        AllocatorSetting::TrimThreshold => -1,
        AllocatorSetting::TopPad => -2,
        AllocatorSetting::MmapThreshold => -3,
        AllocatorSetting::ArenaMax => -8,
    };
    // SAFETY: mallopt takes no pointers and changes the allocator's parameters under its own
    // lock.
    unsafe { mallopt(param, value) == 1 }
}

/// Other allocators have no such settings.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn set_allocator(_setting: AllocatorSetting, _value: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_when_activity_stops_and_never_while_busy_or_idle() {
        let mut w = IdleWatch::new(0);
        assert!(
            !w.went_idle(0),
            "idle since the start: nothing to give back"
        );
        assert!(!w.went_idle(5), "busy");
        assert!(!w.went_idle(9), "busy");
        assert!(w.went_idle(9), "went idle");
        assert!(!w.went_idle(9), "still idle: trimmed once already");
        assert!(!w.went_idle(9));
        assert!(!w.went_idle(10), "busy again");
        assert!(w.went_idle(10), "idle again");
    }

    #[test]
    fn trimming_is_callable() {
        release_free_memory();
    }
}
