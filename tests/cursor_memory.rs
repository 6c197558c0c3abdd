//! A cursor's unread documents are held encoded, not as owned documents: measured by the heap
//! bytes live in this test binary (a counting allocator), so it holds whatever the cursor type
//! keeps inside.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bson::{doc, Document};
use sluice::command::cursors::DocumentCursors;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only the count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

#[test]
fn an_unread_cursor_holds_about_the_encoded_size_of_its_documents() {
    let cursors = DocumentCursors::default();
    let base = live();
    let docs: Vec<Document> = (0..20_000)
        .map(|i| {
            doc! {
                "_id": i,
                "name": format!("user-{i}"),
                "tags": ["red", "green", "blue"],
                "address": {"city": "Lyon", "zip": 69000 + i % 100, "geo": [4.83, 45.76]},
                "score": 1.5 * f64::from(i),
            }
        })
        .collect();
    let as_documents = live() - base;
    let encoded: usize = docs.iter().map(|d| d.to_vec().unwrap().len()).sum();
    // What the test tells apart: owned documents take several times their encoded size.
    assert!(as_documents > 3 * encoded, "{as_documents} vs {encoded}");

    let reply = cursors.first_batch("d.c".into(), docs, 101, false);
    let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
    drop(reply);
    let held = live() - base;
    assert!(
        held <= encoded + 64 * 1024,
        "an unread cursor holds {held} bytes for {encoded} bytes of documents"
    );

    // Read to the end, the cursor gives everything back.
    loop {
        let next = cursors
            .get_more(
                "d",
                &doc! {"getMore": id, "collection": "c", "batchSize": 1000},
            )
            .unwrap();
        if next.get_document("cursor").unwrap().get_i64("id").unwrap() == 0 {
            break;
        }
    }
    assert!(cursors.is_empty());
    let after = live().saturating_sub(base);
    assert!(
        after <= 16 * 1024,
        "{after} bytes left after the cursor was read"
    );
}
