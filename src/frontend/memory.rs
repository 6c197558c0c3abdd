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
//!
//! The same moment gives back the stack pages of the runtime's worker threads: a request
//! that recursed deeply (a nested document, a long path) touched pages of the worker's stack
//! that stay resident for as long as the thread lives. After each trim every worker, the next
//! time it parks, releases the pages of its stack below the frame it parks from
//! ([`release_idle_stack`], the runtime's `on_thread_park` hook): nothing lives below a
//! thread's stack pointer, so the pages come back zeroed when a later request needs them.
//!
//! It also empties the workers' allocator caches. glibc keeps, per thread, up to seven freed
//! blocks of each small size (the `tcache`, sizes up to 1,032 bytes) outside its arenas: they
//! count as in use, so `malloc_trim` cannot return the pages they sit on, and after a burst
//! they are scattered over the whole heap, a few hundred blocks per worker pinning a page
//! each. glibc has no call that empties another thread's cache, and a thread's own frees go
//! back into it; so at the same park each worker takes every block its cache holds
//! ([`take_thread_cache`], allocating as many blocks of each cached size as the cache holds)
//! and hands them to the trimming thread, which frees them on a thread started for that and
//! ended at once ([`free_on_passing_thread`]): its cache is emptied into the arenas when it
//! exits. Only then does `malloc_trim` run, and the pages the cached blocks pinned come back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the trimming thread looks at the activity count: also how long the process must
/// stay idle before it trims.
pub const IDLE_CHECK: Duration = Duration::from_secs(2);

/// Requests served and connections closed, process-wide.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// Trims done: a worker thread gives its stack back once per trim.
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// Worker stacks given back, in all: the trimmer wakes the workers until each has given its
/// stack back once for the trim.
static STACKS_RELEASED: AtomicU64 = AtomicU64::new(0);

/// Blocks the workers took out of their allocator caches at their last park after a trim,
/// to be freed on another thread ([`free_on_passing_thread`]).
static HANDED_OVER: std::sync::Mutex<Vec<CachedBlocks>> = std::sync::Mutex::new(Vec::new());

/// A request was served or a connection closed.
pub(super) fn note_activity() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
}

/// Starts the trimming thread, once per process (later calls do nothing).
pub(super) fn start_idle_trimmer() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        // The runtime whose workers give their stacks back (none outside a runtime).
        let runtime = tokio::runtime::Handle::try_current().ok();
        let started = std::thread::Builder::new()
            .name("idle-trim".into())
            .spawn(move || {
                let mut watch = IdleWatch::new(ACTIVITY.load(Ordering::Relaxed));
                loop {
                    std::thread::sleep(IDLE_CHECK);
                    if watch.went_idle(ACTIVITY.load(Ordering::Relaxed)) {
                        // The workers first give back their stacks and their caches' blocks,
                        // then the blocks are freed, then the free pages are returned.
                        let released = STACKS_RELEASED.load(Ordering::SeqCst);
                        TRIMS.fetch_add(1, Ordering::SeqCst);
                        if let Some(rt) = &runtime {
                            wake_workers(rt, released);
                        }
                        let cached = HANDED_OVER
                            .lock()
                            .map(|mut h| std::mem::take(&mut *h))
                            .unwrap_or_default();
                        if !cached.is_empty() {
                            free_on_passing_thread(cached);
                        }
                        release_free_memory();
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the idle memory trimmer");
        }
    });
}

/// Wakes the runtime's parked workers so that each parks again and gives its stack back
/// ([`release_idle_stack`]): a no-op task per worker, a few times, until every worker has
/// released once since `released` (the count before the trim) or the tries run out.
fn wake_workers(rt: &tokio::runtime::Handle, released: u64) {
    let workers = rt.metrics().num_workers() as u64;
    for _ in 0..10 {
        if STACKS_RELEASED.load(Ordering::SeqCst) >= released + workers {
            return;
        }
        for _ in 0..workers {
            drop(rt.spawn(async {}));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The runtime's `on_thread_park` hook: a worker that parks after a trim it has not yet
/// followed gives back the pages of its stack below this frame. Otherwise one atomic load.
pub fn release_idle_stack() {
    thread_local! {
        /// The trim this thread last gave its stack back for.
        static FOLLOWED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let trims = TRIMS.load(Ordering::Relaxed);
    if FOLLOWED.with(|f| f.replace(trims)) == trims {
        return;
    }
    let cached = take_thread_cache();
    if let Ok(mut handed) = HANDED_OVER.lock() {
        handed.push(cached);
    }
    release_stack_below_here(crate::limits::WORKER_STACK_BYTES);
    STACKS_RELEASED.fetch_add(1, Ordering::SeqCst);
}

/// Blocks taken out of one thread's allocator cache.
pub struct CachedBlocks(Vec<Vec<u8>>);

impl CachedBlocks {
    /// How many blocks were taken.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// glibc's per-thread cache (`tcache`): how many freed blocks of each size it keeps
/// (`glibc.malloc.tcache_count`, 7 by default) and how many sizes (64: blocks of 32 to 1,040
/// bytes, asked for as 24 to 1,032 bytes, 16 apart).
const THREAD_CACHE_COUNT: usize = 7;
const THREAD_CACHE_SIZES: usize = 64;

/// The request size that gets a block of the cache's size class `class`.
fn thread_cache_request(class: usize) -> usize {
    24 + 16 * class
}

/// Takes every block the calling thread's allocator cache holds: as many blocks of each
/// cached size as the cache keeps, so that the cache of each size is served empty (blocks
/// beyond what it held come from the arena and go back to it). Freeing them on this thread
/// would put them back into its cache: hand them to [`free_on_passing_thread`].
pub fn take_thread_cache() -> CachedBlocks {
    let mut blocks = Vec::with_capacity(THREAD_CACHE_SIZES * THREAD_CACHE_COUNT);
    for size in (0..THREAD_CACHE_SIZES).map(thread_cache_request) {
        for _ in 0..THREAD_CACHE_COUNT {
            // An exact-size request: the allocator is asked for `size` bytes, as many times
            // as its cache of that size keeps blocks.
            blocks.push(Vec::<u8>::with_capacity(size));
        }
    }
    CachedBlocks(blocks)
}

/// Frees `blocks` on a thread started for it that ends at once: the blocks its own cache
/// takes are returned to their arenas when it exits, with the rest. Freed here if no thread
/// can be started.
pub fn free_on_passing_thread(blocks: impl Send + 'static) {
    let freed = std::thread::Builder::new()
        .name("cache-free".into())
        .spawn(move || drop(blocks));
    match freed {
        Ok(thread) => {
            let _ = thread.join();
        }
        Err(e) => tracing::debug!(error = %e, "cannot start a thread to free cached blocks"),
    }
}

/// What is left resident below the calling frame: the stack pages deeper calls touched.
/// Kept so that parking and the next shallow request do not fault their pages back at once.
const STACK_KEEP: usize = 32 * 1024;

/// Gives back the pages of the calling thread's stack (of `stack_bytes`) that lie more than
/// [`STACK_KEEP`] below this frame. Nothing lives below a thread's stack pointer, so those
/// pages are dead: `MADV_DONTNEED` unmaps them, and a later call that reaches them gets
/// zeroed pages.
#[cfg(target_os = "linux")]
#[inline(never)]
fn release_stack_below_here(stack_bytes: usize) {
    extern "C" {
        /// Advice about a range of the process's memory; 0 on success.
        fn madvise(
            addr: *mut std::ffi::c_void,
            len: usize,
            advice: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    /// `<sys/mman.h>`: the range's pages are released; private anonymous ones read as zero.
    const MADV_DONTNEED: std::ffi::c_int = 4;
    const PAGE: usize = 4096;
    let marker = 0u8;
    let here = std::hint::black_box(std::ptr::addr_of!(marker)) as usize;
    let Some(low) = stack_low_end(here, stack_bytes) else {
        return;
    };
    let high = here.saturating_sub(STACK_KEEP) & !(PAGE - 1);
    if high <= low {
        return;
    }
    // SAFETY: [low, high) is the part of this thread's own stack mapping more than
    // STACK_KEEP below the current frame. No frame of this thread is there (the stack grows
    // down from `here`), no other thread uses a thread's stack, and madvise takes the range
    // by address and only drops its pages: a later access gets a zero page.
    unsafe {
        madvise(low as *mut std::ffi::c_void, high - low, MADV_DONTNEED);
    }
}

#[cfg(not(target_os = "linux"))]
fn release_stack_below_here(_stack_bytes: usize) {}

/// The lowest address of the calling thread's stack, read once per thread: the start of the
/// mapping in `/proc/self/maps` that holds `addr`, and never more than `stack_bytes` below
/// its end (the stack's top), should the mapping ever run on below the stack's guard page.
#[cfg(target_os = "linux")]
fn stack_low_end(addr: usize, stack_bytes: usize) -> Option<usize> {
    thread_local! {
        static LOW: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }
    if let Some(low) = LOW.with(|l| l.get()) {
        return Some(low);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let low = maps.lines().find_map(|line| {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        (start <= addr && addr < end).then_some(start.max(end.saturating_sub(stack_bytes)))
    })?;
    LOW.with(|l| l.set(Some(low)));
    Some(low)
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

    /// Touches about `bytes` of the stack below the caller.
    #[inline(never)]
    fn touch_stack(bytes: usize) -> u8 {
        let mut frame = [0u8; 4096];
        std::hint::black_box(&mut frame);
        if bytes <= frame.len() {
            return frame[7];
        }
        touch_stack(bytes - frame.len()).wrapping_add(std::hint::black_box(frame[17]))
    }

    /// The resident size of the mapping that holds the caller's stack frame, from
    /// `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn stack_rss_kib() -> u64 {
        let marker = 0u8;
        let here = std::hint::black_box(std::ptr::addr_of!(marker)) as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((start, rest)) = line.split_once('-') {
                if let (Ok(start), Some(end)) = (
                    usize::from_str_radix(start, 16),
                    rest.split_whitespace().next(),
                ) {
                    if let Ok(end) = usize::from_str_radix(end, 16) {
                        inside = start <= here && here < end;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("Rss:") {
                    return v.trim().trim_end_matches("kB").trim().parse().unwrap();
                }
            }
        }
        panic!("no mapping holds the stack");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_gives_back_the_stack_pages_a_deep_call_touched() {
        std::thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                std::hint::black_box(touch_stack(1 << 20));
                let touched = stack_rss_kib();
                assert!(touched >= 1024, "the deep call touched {touched} KiB");
                release_stack_below_here(4 << 20);
                let left = stack_rss_kib();
                assert!(left <= 128, "{left} KiB of the stack still resident");
                // The released pages work as stack again.
                std::hint::black_box(touch_stack(1 << 20));
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_worker_gives_its_stack_back_once_per_trim() {
        std::thread::spawn(|| {
            // The first park follows whatever trims came before this thread.
            release_idle_stack();
            let synced = STACKS_RELEASED.load(Ordering::SeqCst);
            release_idle_stack();
            release_idle_stack();
            assert_eq!(
                STACKS_RELEASED.load(Ordering::SeqCst),
                synced,
                "no trim, no release"
            );
            TRIMS.fetch_add(1, Ordering::SeqCst);
            release_idle_stack();
            release_idle_stack();
            assert_eq!(
                STACKS_RELEASED.load(Ordering::SeqCst),
                synced + 1,
                "one per trim"
            );
        })
        .join()
        .unwrap();
    }
}
