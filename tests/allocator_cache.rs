//! The idle trim empties a worker's allocator cache (`sluice::frontend::memory`): the blocks
//! glibc keeps per thread count as in use, so `malloc_trim` cannot return their pages until
//! they are taken out of the cache and freed on a thread that then exits.
//!
//! A binary of its own, its tests one at a time: they read the allocator's process-wide
//! totals, which other tests running beside them would move.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use sluice::frontend::memory::{free_on_passing_thread, take_thread_cache};

    /// glibc's `struct mallinfo2` (<malloc.h>).
    #[repr(C)]
    #[derive(Default)]
    struct MallInfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }

    extern "C" {
        fn mallinfo2() -> MallInfo2;
    }

    /// Bytes the allocator counts as in use (its thread caches' blocks included).
    fn in_use() -> usize {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct of counters.
        unsafe { mallinfo2() }.uordblks
    }

    /// Fills the calling thread's cache: seven freed blocks of every cached size.
    fn fill_thread_cache() {
        let blocks: Vec<Vec<u8>> = (24..=1032)
            .step_by(16)
            .flat_map(|size| (0..7).map(move |_| Vec::<u8>::with_capacity(size)))
            .collect();
        drop(std::hint::black_box(blocks));
    }

    /// Held by each test: one at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn blocks_a_thread_cache_holds_go_back_to_the_arena() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // A thread of its own, whose cache only this test fills.
        std::thread::spawn(|| {
            fill_thread_cache();
            let before = in_use();
            // What the cache held: 7 blocks of each of the 64 sizes, 32 to 1,040 bytes each.
            let cached: usize = (32..=1040).step_by(16).map(|c| 7 * c).sum();
            let blocks = take_thread_cache();
            assert_eq!(blocks.len(), 64 * 7, "7 blocks of each of the 64 sizes");
            free_on_passing_thread(blocks);
            let after = in_use();
            let returned = before.saturating_sub(after);
            assert!(
                returned >= cached * 3 / 4,
                "{returned} bytes went back to the arena of the {cached} the cache held \
                 ({before} in use before, {after} after)"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn freeing_on_the_same_thread_would_refill_its_cache() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // The control: the same blocks freed where they were taken go back into the cache,
        // and nothing is returned. This is why the trim frees them on another thread.
        std::thread::spawn(|| {
            fill_thread_cache();
            let before = in_use();
            let blocks = take_thread_cache();
            drop(blocks);
            let after = in_use();
            let cached: usize = (32..=1040).step_by(16).map(|c| 7 * c).sum();
            assert!(
                before.saturating_sub(after) < cached / 4,
                "{before} in use before, {after} after"
            );
        })
        .join()
        .unwrap();
    }
}
