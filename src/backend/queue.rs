//! The per-shard queue in front of the shard's execution slots: a bounded wait (1,024
//! statements / 32 MiB; one larger legal batch may occupy an empty queue alone), oldest first,
//! governed by the adaptive [`Limiter`]. A caller gets a [`LimitPermit`] (an RAII guard: a
//! permit dropped without a verdict counts as a sample that does not count) or, when its
//! deadline passes first, ExceededTimeLimit (262).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use super::limiter::{Admission, BatchInfo, Limiter, LimiterSettings, OpKind, Outcome, Ticket};

/// Most statements waiting in one shard's queue.
pub const QUEUE_OPERATIONS: usize = 1024;
/// Most bytes waiting in one shard's queue.
pub const QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// Why a batch could not get an execution slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {waited:?} waiting for an execution slot on shard {shard}")]
pub struct QueueTimeout {
    /// The shard.
    pub shard: String,
    /// How long the batch waited.
    pub waited: Duration,
}

struct Waiter {
    id: u64,
    operations: usize,
    bytes: usize,
}

struct State {
    limiter: Limiter,
    waiting: VecDeque<Waiter>,
    queued_operations: usize,
    queued_bytes: usize,
    next_id: u64,
}

/// The gauges a queue publishes, registered once (building a labelled key on every update
/// cost more than the rest of a single-document write's queueing).
struct Gauges {
    limit: [metrics::Gauge; 2],
    ratio: [metrics::Gauge; 2],
    in_flight: [metrics::Gauge; 2],
    depth: metrics::Gauge,
}

impl Gauges {
    fn new(shard: &str) -> Gauges {
        let per_op = |name: &'static str| {
            [OpKind::Mutate, OpKind::Read]
                .map(|op| metrics::gauge!(name, "shard" => shard.to_string(), "op" => op.label()))
        };
        Gauges {
            limit: per_op("sluice_shard_adaptive_limit"),
            ratio: per_op("sluice_shard_execution_latency_ratio"),
            in_flight: per_op("sluice_shard_in_flight"),
            depth: metrics::gauge!("sluice_shard_queue_depth", "shard" => shard.to_string()),
        }
    }
}

/// One shard's queue and limiter.
pub struct ShardQueue {
    shard: String,
    state: Mutex<State>,
    changed: Notify,
    gauges: Gauges,
}

impl std::fmt::Debug for ShardQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardQueue")
            .field("shard", &self.shard)
            .finish()
    }
}

fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl ShardQueue {
    /// A queue for `shard` with these limiter settings.
    pub fn new(shard: &str, settings: LimiterSettings) -> ShardQueue {
        ShardQueue {
            shard: shard.to_string(),
            state: Mutex::new(State {
                limiter: Limiter::new(settings),
                waiting: VecDeque::new(),
                queued_operations: 0,
                queued_bytes: 0,
                next_id: 0,
            }),
            changed: Notify::new(),
            gauges: Gauges::new(shard),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current limit of `op`.
    pub fn limit(&self, op: OpKind) -> f64 {
        self.lock().limiter.limit(op)
    }

    /// The last window's median latency ratio of `op`.
    pub fn latency_ratio(&self, op: OpKind) -> f64 {
        self.lock().limiter.latency_ratio(op)
    }

    /// Executions of `op` running.
    pub fn in_flight(&self, op: OpKind) -> usize {
        self.lock().limiter.in_flight(op)
    }

    /// Statements waiting.
    pub fn depth(&self) -> usize {
        self.lock().queued_operations
    }

    fn publish(&self, st: &State) {
        for (i, op) in [OpKind::Mutate, OpKind::Read].into_iter().enumerate() {
            self.gauges.limit[i].set(st.limiter.limit(op));
            self.gauges.ratio[i].set(st.limiter.latency_ratio(op));
            self.gauges.in_flight[i].set(st.limiter.in_flight(op) as f64);
        }
        self.gauges.depth.set(st.queued_operations as f64);
    }

    /// Waits for an execution slot for `batch`, oldest first, until `deadline`.
    pub async fn acquire(
        self: &Arc<Self>,
        batch: BatchInfo,
        deadline: Instant,
    ) -> Result<LimitPermit, QueueTimeout> {
        let began = Instant::now();
        // Enter the queue: wait while it is full (an empty queue takes any legal batch).
        let id = loop {
            let notified = self.changed.notified();
            {
                let mut st = self.lock();
                let fits = st.waiting.is_empty()
                    || (st.queued_operations + batch.operations <= QUEUE_OPERATIONS
                        && st.queued_bytes + batch.bytes <= QUEUE_BYTES);
                if fits {
                    let id = st.next_id;
                    st.next_id += 1;
                    st.queued_operations += batch.operations;
                    st.queued_bytes += batch.bytes;
                    st.waiting.push_back(Waiter {
                        id,
                        operations: batch.operations,
                        bytes: batch.bytes,
                    });
                    self.publish(&st);
                    break id;
                }
            }
            if tokio::time::timeout_at(deadline.into(), notified)
                .await
                .is_err()
            {
                return Err(QueueTimeout {
                    shard: self.shard.clone(),
                    waited: began.elapsed(),
                });
            }
        };
        // Leave the queue on every path (cancellation included).
        let mut entry = QueueEntry {
            queue: self.clone(),
            id,
            done: false,
        };
        loop {
            let notified = self.changed.notified();
            let wake_at = {
                let mut st = self.lock();
                if st.waiting.front().map(|w| w.id) == Some(id) {
                    match st.limiter.on_start(wall_now(), &batch) {
                        Admission::Start(ticket) => {
                            entry.leave(&mut st);
                            self.publish(&st);
                            drop(st);
                            // The next waiter may be admitted too.
                            self.changed.notify_waiters();
                            return Ok(LimitPermit {
                                queue: self.clone(),
                                ticket: Some(ticket),
                            });
                        }
                        Admission::Wait(at) => at,
                    }
                } else {
                    None
                }
            };
            let sleep_until = match wake_at {
                Some(at) => {
                    let now = wall_now();
                    let d = at.saturating_sub(now).max(Duration::from_micros(100));
                    (Instant::now() + d).min(deadline)
                }
                None => deadline,
            };
            let timed_out = tokio::select! {
                _ = notified => false,
                _ = tokio::time::sleep_until(sleep_until.into()) => Instant::now() >= deadline,
            };
            if timed_out {
                return Err(QueueTimeout {
                    shard: self.shard.clone(),
                    waited: began.elapsed(),
                });
            }
        }
    }
}

/// A place in the queue; removed when admitted, timed out or cancelled.
struct QueueEntry {
    queue: Arc<ShardQueue>,
    id: u64,
    done: bool,
}

impl QueueEntry {
    fn leave(&mut self, st: &mut State) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(pos) = st.waiting.iter().position(|w| w.id == self.id) {
            if let Some(w) = st.waiting.remove(pos) {
                st.queued_operations -= w.operations;
                st.queued_bytes -= w.bytes;
            }
        }
    }
}

impl Drop for QueueEntry {
    fn drop(&mut self) {
        if !self.done {
            let queue = self.queue.clone();
            let mut st = queue.lock();
            self.leave(&mut st);
            queue.publish(&st);
            drop(st);
            queue.changed.notify_waiters();
        }
    }
}

/// An execution slot; report how the execution ended with [`LimitPermit::finish`]. Dropped
/// without a verdict (the caller left), the execution is not a sample.
pub struct LimitPermit {
    queue: Arc<ShardQueue>,
    ticket: Option<Ticket>,
}

impl std::fmt::Debug for LimitPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitPermit").finish()
    }
}

impl LimitPermit {
    /// Ends the execution with `outcome`.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: Outcome) {
        if let Some(ticket) = self.ticket.take() {
            let mut st = self.queue.lock();
            st.limiter.on_finish(wall_now(), ticket, outcome);
            self.queue.publish(&st);
            drop(st);
            self.queue.changed.notify_waiters();
        }
    }
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        self.release(Outcome::NotCounted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ops: usize) -> BatchInfo {
        BatchInfo {
            op: OpKind::Mutate,
            group: 1,
            operations: ops,
            bytes: ops * 10,
        }
    }

    fn queue(settings: LimiterSettings) -> Arc<ShardQueue> {
        Arc::new(ShardQueue::new("s", settings))
    }

    #[tokio::test]
    async fn admits_up_to_the_limit_then_waits_oldest_first() {
        let q = queue(LimiterSettings::default());
        let far = Instant::now() + Duration::from_secs(5);
        let a = q.acquire(info(1), far).await.unwrap();
        let _b = q.acquire(info(1), far).await.unwrap();
        // A third waits until a permit is released; order of admission is arrival order.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for i in 0..3 {
            let q = q.clone();
            let order = order.clone();
            handles.push(tokio::spawn(async move {
                let p = q.acquire(info(1), far).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                p.finish(Outcome::Completed);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // (The anti-stall rule may admit one more after four typical execution times.)
        assert!(q.depth() >= 1, "statements wait beyond the limit");
        a.finish(Outcome::Completed);
        for h in handles {
            h.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_times_out_with_the_deadline() {
        let q = queue(LimiterSettings {
            max_in_flight: 1,
            ..LimiterSettings::default()
        });
        let far = Instant::now() + Duration::from_secs(5);
        let _held = q.acquire(info(1), far).await.unwrap();
        // Fill the queue to its 1,024 statements.
        let q2 = q.clone();
        let waiting =
            tokio::spawn(async move { q2.acquire(info(QUEUE_OPERATIONS), far).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.depth(), QUEUE_OPERATIONS);
        let soon = Instant::now() + Duration::from_millis(50);
        let e = q.acquire(info(1), soon).await.unwrap_err();
        assert_eq!(e.shard, "s");
        assert!(e.waited >= Duration::from_millis(45));
        waiting.abort();
        let _ = waiting.await;
        // The aborted waiter left the queue: nothing is lost or counted twice.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test]
    async fn one_larger_batch_may_occupy_an_empty_queue() {
        let q = queue(LimiterSettings {
            max_in_flight: 1,
            ..LimiterSettings::default()
        });
        let far = Instant::now() + Duration::from_secs(5);
        let held = q.acquire(info(1), far).await.unwrap();
        let q2 = q.clone();
        let big = tokio::spawn(async move {
            q2.acquire(info(5000), far)
                .await
                .map(|p| p.finish(Outcome::Completed))
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.depth(), 5000);
        held.finish(Outcome::Completed);
        big.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn dropped_permits_free_their_slot_without_a_sample() {
        let q = queue(LimiterSettings::default());
        let far = Instant::now() + Duration::from_secs(5);
        for _ in 0..50 {
            let p = q.acquire(info(1), far).await.unwrap();
            drop(p);
        }
        assert_eq!(q.in_flight(OpKind::Mutate), 0);
        assert_eq!(q.limit(OpKind::Mutate), 2.0);
    }
}
